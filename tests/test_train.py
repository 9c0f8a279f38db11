"""The multi-task training loop on the tiny BERT and small slices of real (or demo) data:
reproducibility, resuming, non-finite losses, frozen encoder, head retraining, sequential
fine-tuning, SMART and PCGrad in the loop, and torchrun data parallelism against one process."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, child_env, shared_data_dir

import minbert.data.batches as batches
import minbert.train.evaluation as evaluation
import minbert.train.experiment as experiment
import minbert.train.loop as train
import minbert.train.objectives as objectives
import minbert.core.plain as plain
import minbert.core.settings as core_settings
from minbert.core.errors import MinBertError
from minbert.core.runtime import autocast, precision_on, seed_everything
from minbert.data.raw import read_cs224n
from minbert.data.read import write_split
from minbert.model.multitask import MultitaskModel
from minbert.params import ExperimentParams
from minbert.params.resolve import finetune_settings, retrain_settings
from minbert.params.settings import FinetuneSettings
from minbert.report.training import positions
from minbert.train import plateau as rule
from minbert.train.experiment import retrain_heads_experiment
from minbert.train.optim import AdamW
from minbert.train.training import FitOptions

RAW = {"sst": "ids-sst", "para": "quora", "sts": "sts"}


class EncoderStub(torch.nn.Module):
    """Only what MultitaskModel reads of an encoder to build its heads (its config)."""

    def __init__(self, config):
        super().__init__()
        self.config = config

# history columns that measure time, not training
TIMING = ["seconds", "examples_per_second"]


def write_prepared(out: Path, n_train: int, n_dev: int, n_test: int = 0) -> Path:
    """results/data-style splits: the first rows of the real CS224N files (demo data when absent)."""
    shared = shared_data_dir()
    src = shared / "cs224n" if shared else REPO / "data" / "demo"
    out.mkdir(parents=True, exist_ok=True)
    for task, prefix in RAW.items():
        for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
            if n:
                name = f"{prefix}-test-student.csv" if split == "test" else f"{prefix}-{split}.csv"
                frame, _ = read_cs224n(src / name, task, labelled=split != "test", on_bad_rows="drop")
                write_split(frame.head(n), out / f"{task}-{split}.tsv")
    return out


@pytest.fixture(autouse=True)
def restore_threads():
    """Runs here use one thread (tiny matrices: a second thread only adds contention); the
    tests that follow get the process's setting back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=32)


def make_exp(tiny_model_dir, **finetune) -> ExperimentParams:
    ft = {"epochs": 2, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.0, "max_steps_per_epoch": 6,
          "downsample": {"mode": "fixed", "size": 32}, **finetune}
    return ExperimentParams.model_validate({"model": str(tiny_model_dir), "device": "cpu", "seed": 7,
                                           "threads": 1, "max_length": 32, "predict_batch_size": 64, "finetune": ft})


FIT_OPTIONS = {"state_dir", "description", "resume", "stop_after_epochs", "evaluate_first", "progress"}


def fit_options(out: Path, name: str = "", stage: str = "finetune", **kw) -> FitOptions:
    """The options a training stage gives (state folder: <out>.state unless `state_dir`)."""
    return FitOptions(Path(out), checkpoint_extra={"experiment": name, "stage": stage}, **kw)


def finetune_experiment(exp, data, out: Path, **kw):
    """Fine-tune with the settings the finetune stage gives (`exp`: the experiment's params or its
    settings); the keywords of FitOptions and of the library call both go here."""
    settings = exp if isinstance(exp, FinetuneSettings) else finetune_settings(exp)
    settings = plain.read(core_settings.FinetuneSettings, settings.model_dump(mode="json"))  # as a stage reads it
    options = fit_options(out, **{k: v for k, v in kw.items() if k in FIT_OPTIONS | {"name", "stage"}})
    return experiment.finetune_experiment(settings, data, options,
                                          **{k: v for k, v in kw.items() if k not in FIT_OPTIONS | {"name", "stage"}})


def last_state(out: Path) -> Path:
    return out.with_name(out.name + ".state") / "last.pt"


def state_dict(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def assert_same_weights(a: dict, b: dict, atol: float = 0.0):
    assert a.keys() == b.keys()
    for k in a:
        if atol:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m: f"{k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), k


def history(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "history.csv").drop(columns=TIMING)


# ---------------------------------------------------------------- reproducibility and resuming

def test_same_seed_twice_gives_identical_metrics_and_weights(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir)   # default dropout on: the RNG streams must match too
    a = finetune_experiment(exp, prepared, tmp_path / "a")
    b = finetune_experiment(exp, prepared, tmp_path / "b")
    assert a.best_dev == b.best_dev and a.best_epoch == b.best_epoch
    pd.testing.assert_frame_equal(history(tmp_path / "a"), history(tmp_path / "b"))
    assert_same_weights(state_dict(tmp_path / "a" / "model.pt"), state_dict(tmp_path / "b" / "model.pt"))
    h = history(tmp_path / "a")
    assert h["epoch"].tolist() == [1, 2] and h["phase"].tolist() == ["sst+para+sts"] * 2
    for col in ("lr", "train_sst_loss", "train_sst_acc", "dev_para_acc", "dev_sts_pearson", "dev_overall", "dev_score"):
        assert col in h.columns and h[col].notna().all(), col
    # finished runs leave no resumable state behind
    assert not last_state(tmp_path / "a").exists() and not last_state(tmp_path / "a").parent.exists()
    # a different seed gives a different run
    c = finetune_experiment(exp.model_copy(update={"seed": 8}), prepared, tmp_path / "c")
    assert not history(tmp_path / "c").equals(history(tmp_path / "a")) or c.best_dev != a.best_dev


@pytest.mark.parametrize("schedule,epochs,evals", [("round_robin", 3, 1), ("sequential", 1, 1), ("round_robin", 2, 3)])
def test_interrupted_run_resumes_to_the_same_result(tiny_model_dir, prepared, tmp_path, schedule, epochs, evals):
    exp = make_exp(tiny_model_dir, schedule=schedule, epochs=epochs, evals_per_epoch=evals,
                   **({"tasks": ["sst", "sts"]} if schedule == "sequential" else {}))
    full = finetune_experiment(exp, prepared, tmp_path / "full")
    part = tmp_path / "part"
    first = finetune_experiment(exp, prepared, part, stop_after_epochs=1)
    assert len(first.history) == evals and last_state(part).is_file()
    # the declared outputs appear only when the run has finished
    assert not (part / "model.pt").exists() and not (part / "history.csv").exists()
    resumed = finetune_experiment(exp, prepared, part, resume=True)
    assert resumed.best_dev == full.best_dev and resumed.best_epoch == full.best_epoch
    pd.testing.assert_frame_equal(history(part), history(tmp_path / "full"))
    assert_same_weights(state_dict(part / "model.pt"), state_dict(tmp_path / "full" / "model.pt"))


def test_dev_is_evaluated_within_an_epoch_and_the_best_evaluation_is_kept(tiny_model_dir, prepared, tmp_path):
    # 6 updates an epoch, 4 evaluations: after updates 2, 3, 4 (1.5, 3, 4.5 rounded half to even) and 6
    exp = make_exp(tiny_model_dir, epochs=2, evals_per_epoch=4, lr=3e-3)
    res = finetune_experiment(exp, prepared, tmp_path / "run")
    h = pd.read_csv(tmp_path / "run" / "history.csv")
    assert h["epoch"].tolist() == [0.3333, 0.5, 0.6667, 1, 1.3333, 1.5, 1.6667, 2]
    assert h["update"].tolist() == [2, 3, 4, 6, 8, 9, 10, 12]
    # each row's training losses cover the updates since the evaluation before it (round-robin: one
    # or two tasks' batches in so short a part)
    losses = h[[f"train_{t}_loss" for t in ("sst", "para", "sts")]]
    assert losses.notna().any(axis=1).all() and losses.notna().any(axis=0).all()
    assert h["dev_score"].notna().sum() >= 6
    best = int(np.nanargmax(h["dev_score"].to_numpy()))
    assert res.best_epoch == h["epoch"][best] and res.best_score == pytest.approx(h["dev_score"][best], rel=1e-5)
    kept = torch.load(tmp_path / "run" / "model.pt", map_location="cpu", weights_only=True)
    assert kept["epoch"] == h["epoch"][best]
    assert kept["dev_metrics"]["sts_pearson"] == pytest.approx(h["dev_sts_pearson"][best], rel=1e-5)
    # the same run evaluated once an epoch trains the same weights: evaluation draws nothing from the
    # run's random streams (its last evaluation of each epoch is the once-an-epoch one)
    once = finetune_experiment(exp.model_copy(update={"finetune": exp.finetune.model_copy(
        update={"evals_per_epoch": 1})}), prepared, tmp_path / "once")
    whole = h[h["epoch"].isin([1, 2])].reset_index(drop=True)
    assert whole["dev_score"].tolist() == pytest.approx(once.history["dev_score"].tolist(), rel=1e-5, nan_ok=True)


@pytest.mark.numbers
def test_dev_size_evaluates_a_seeded_subset_of_each_dev_split(tiny_model_dir, prepared, tmp_path):
    def ids(split, **kw):
        frames = batches.task_frames(prepared, ["sst", "sts"], ("train", "dev"), **kw)[split]
        return {t: frame["id"].tolist() for t, frame in frames.items()}

    full, cut = ids("dev", seed=7), ids("dev", seed=7, dev_size=10)
    assert cut == ids("dev", seed=7, dev_size=10) != ids("dev", seed=8, dev_size=10)     # seeded
    for t in ("sst", "sts"):
        assert len(cut[t]) == 10 and cut[t] == [i for i in full[t] if i in set(cut[t])]   # the split's rows, in order
    assert ids("train", seed=7, dev_size=10) == ids("train", seed=7)                      # training rows untouched
    assert ids("dev", seed=7, dev_size=100) == full                                       # a split under the size
    # a run's dev scores are those of its subset: the kept model's dev metrics are its predictions' on
    # those 10 rows (of the run's seed, 7)
    exp = make_exp(tiny_model_dir, tasks=["sts"], dev_size=10, epochs=1)
    finetune_experiment(exp, prepared, tmp_path / "run")
    kept = torch.load(tmp_path / "run" / "model.pt", map_location="cpu", weights_only=True)
    from minbert.model.checkpoint import load_checkpoint
    from minbert.model.multitask import predict_task
    model, tok, _ = load_checkpoint(tmp_path / "run" / "model.pt")
    sub = batches.load_training_data(exp.finetune, prepared, tok, 7)["dev"]["sts"]
    assert len(sub) == 10
    # in the precision the run evaluated in (`auto`: bf16 where it is native), so the same numbers
    cpu = torch.device("cpu")
    precision = precision_on(exp.precision, cpu)
    pred = predict_task(model, sub, tok, 64, cpu, lambda: autocast(cpu, precision))
    r = np.corrcoef(pred["prediction"], sub.labels)[0, 1]
    assert kept["dev_metrics"]["sts_pearson"] == pytest.approx(r, abs=1e-5)


def test_evaluation_points_are_evenly_spaced_and_end_the_epoch():
    assert evaluation.eval_points(6, 1) == [6]
    assert evaluation.eval_points(6, 4) == [2, 3, 4, 6]
    assert evaluation.eval_points(100, 3) == [33, 67, 100]
    assert evaluation.eval_points(3, 10) == [1, 2, 3]     # never more evaluations than updates
    assert evaluation.eval_points(0, 3) == []


def test_resume_ignores_state_of_another_configuration(tiny_model_dir, prepared, tmp_path, caplog):
    out = tmp_path / "run"
    finetune_experiment(make_exp(tiny_model_dir, lr=5e-4), prepared, out, stop_after_epochs=1)
    exp = make_exp(tiny_model_dir)
    with caplog.at_level("WARNING", logger="minbert.train.training"):
        res = finetune_experiment(exp, prepared, out, resume=True)
    ref = finetune_experiment(exp, prepared, tmp_path / "ref")
    assert res.best_dev == ref.best_dev and len(res.history) == 2
    # one line saying what changed, old and new value
    notice = [r.getMessage() for r in caplog.records if "another configuration" in r.getMessage()]
    assert len(notice) == 1 and "settings.finetune.lr: 0.0005 -> 0.001" in notice[0] and "\n" not in notice[0]


@pytest.mark.parametrize("content", [b"", b"\x00garbage, not a checkpoint", "foreign"])
def test_a_corrupt_or_foreign_state_is_not_resumed(tiny_model_dir, prepared, tmp_path, caplog, content):
    exp = make_exp(tiny_model_dir, epochs=1)
    out = tmp_path / "run"
    last_state(out).parent.mkdir(parents=True)
    if content == "foreign":
        torch.save({"state_dict": {}, "epoch": 3}, last_state(out))
    else:
        last_state(out).write_bytes(content)
    with caplog.at_level("WARNING", logger="minbert.train.training"):
        res = finetune_experiment(exp, prepared, out)
    ref = finetune_experiment(exp, prepared, tmp_path / "ref")
    assert res.best_dev == ref.best_dev
    assert any("cannot be resumed" in r.getMessage() and "starting fresh" in r.getMessage() for r in caplog.records)


def test_stale_temporaries_of_a_killed_write_are_cleaned(tiny_model_dir, prepared, tmp_path):
    out = tmp_path / "run"
    state = last_state(out).parent
    state.mkdir(parents=True)
    (state / ".last.pt.abc123.tmp").write_bytes(b"x" * 1000)     # what a kill during torch.save leaves
    finetune_experiment(make_exp(tiny_model_dir, epochs=1), prepared, out, stop_after_epochs=0)
    assert not list(state.glob(".*.tmp"))


# ---------------------------------------------------------------- non-finite losses

def test_nan_loss_names_the_task_and_writes_nothing(tiny_model_dir, prepared, tmp_path, monkeypatch):
    exp = make_exp(tiny_model_dir, max_steps_per_epoch=3)   # epoch 1: updates sst, para, sts
    real_loss = objectives.task_loss
    calls = {"n": 0}

    def loss_nan_in_second_epoch(task, heads, out, labels, pair=None):
        calls["n"] += 1
        loss = real_loss(task, heads, out, labels, pair)
        return loss * float("nan") if task == "para" and calls["n"] > 3 else loss

    monkeypatch.setattr(objectives, "task_loss", loss_nan_in_second_epoch)
    out = tmp_path / "run"
    with pytest.raises(MinBertError, match=r"training diverged: non-finite para loss at phase 0 epoch 2 update 4; "
                                           r"lower the learning rate") as err:
        finetune_experiment(exp, prepared, out)
    assert "\n" not in str(err.value) and "good checkpoint" not in str(err.value)
    # no output, and no state a re-run with the same settings would diverge from again
    assert not (out / "model.pt").exists() and not (out / "history.csv").exists()
    assert not last_state(out).parent.exists()


def test_nan_weights_after_the_last_update_are_an_error_not_a_missing_model(tiny_model_dir, prepared, tmp_path,
                                                                            monkeypatch):
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=3)
    real_step = AdamW.step
    calls = {"n": 0}

    def step_then_nan(self, *a, **kw):
        out = real_step(self, *a, **kw)
        calls["n"] += 1
        if calls["n"] == 3:                       # the last update: every loss so far was finite
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.fill_(float("nan"))
        return out

    monkeypatch.setattr(AdamW, "step", step_then_nan)
    out = tmp_path / "run"
    with pytest.raises(MinBertError, match=r"training diverged: non-finite dev \w+_loss.* after the last update of epoch 1"):
        finetune_experiment(exp, prepared, out)
    assert not (out / "model.pt").exists() and not last_state(out).parent.exists()


def test_diverging_learning_rate_stops_in_the_first_epoch(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, lr=1e30, head_lr=1e30, grad_clip=None)
    with pytest.raises(MinBertError, match=r"non-finite (sst|para|sts) loss at phase 0 epoch 1 "):
        finetune_experiment(exp, prepared, tmp_path / "run")
    assert not (tmp_path / "run" / "model.pt").exists()


# ---------------------------------------------------------------- what trains

def initial_weights(exp: ExperimentParams) -> dict[str, torch.Tensor]:
    """The model finetune_experiment starts from (same seeding), for before/after comparisons."""
    from minbert.model.weights import load_encoder

    encoder, _, _ = load_encoder(exp.model)
    seed_everything(exp.seed)
    model = MultitaskModel(encoder, exp.finetune.heads, exp.finetune.tasks)
    return {k: v.clone() for k, v in model.state_dict().items()}


def changed(before: dict, after: dict, prefix: str) -> list[str]:
    return [k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])]


def test_freeze_encoder_trains_only_the_heads(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, freeze_encoder=True, heads={"para": "concat", "sts": "cosine"})
    before = initial_weights(exp)
    finetune_experiment(exp, prepared, tmp_path / "run")
    after = state_dict(tmp_path / "run" / "model.pt")
    assert changed(before, after, "encoder.") == []
    assert {k.split(".")[1] for k in changed(before, after, "heads.")} == {"sst", "para", "sts"}


def test_retrain_heads_reinitialises_heads_and_keeps_the_encoder(tiny_model_dir, prepared, tmp_path, monkeypatch):
    exp = make_exp(tiny_model_dir, epochs=1)
    exp = ExperimentParams.model_validate({**exp.model_dump(), "retrain_heads": {"enabled": True, "epochs": 1}})
    finetune_experiment(exp, prepared, tmp_path / "ft")
    tuned = state_dict(tmp_path / "ft" / "model.pt")

    at_start = {}
    real_fit = experiment.fit

    def recording_fit(model, *args, **kw):
        at_start.update({k: v.clone() for k, v in model.state_dict().items()})
        return real_fit(model, *args, **kw)

    monkeypatch.setattr(experiment, "fit", recording_fit)
    res = retrain_heads_experiment(retrain_settings(exp), tmp_path / "ft" / "model.pt", prepared, FitOptions(tmp_path / "rh"))
    # the heads start afresh: what a new model seeded with seed + 1 initialises
    seed_everything(exp.seed + 1)
    fresh = MultitaskModel(EncoderStub(tiny_config(tuned)), exp.finetune.heads, exp.finetune.tasks)
    for k, v in fresh.state_dict().items():
        assert torch.equal(at_start[k], v), k
        assert not torch.equal(tuned[k], v), k
    retrained = state_dict(tmp_path / "rh" / "model.pt")
    assert changed(tuned, retrained, "encoder.") == []
    assert changed(fresh.state_dict(), {k: retrained[k] for k in fresh.state_dict()}, "heads.")
    ckpt = torch.load(tmp_path / "rh" / "model.pt", map_location="cpu", weights_only=True)
    # the tiny model's similarity scores may all be clipped to 0 after one epoch (Pearson r undefined):
    # the epoch's model is kept, but it is recorded as selected only when every dev metric is defined
    sts_defined = bool(res.history["dev_sts_pearson"].notna().all())
    assert ckpt["stage"] == "retrain_heads" and ckpt["epoch"] == 1 and res.best_epoch == (1 if sts_defined else -1)


def tiny_config(sd):
    from minbert.model.bert import BertConfig

    return BertConfig(vocab_size=sd["encoder.embeddings.word.weight"].shape[0],
                      hidden_size=sd["encoder.embeddings.word.weight"].shape[1], num_attention_heads=1)


def test_sequential_trains_tasks_one_after_another(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, schedule="sequential", tasks=["sst", "para", "sts"], epochs=2,
                   max_steps_per_epoch=3)
    res = finetune_experiment(exp, prepared, tmp_path / "run")
    h = pd.read_csv(tmp_path / "run" / "history.csv")
    assert h["phase"].tolist() == ["sst", "sst", "para", "para", "sts", "sts"]
    assert h["epoch"].tolist() == [1, 2, 3, 4, 5, 6]
    # each stage trains (and reports training numbers for) its own task only
    for stage, rows in h.groupby("phase"):
        others = [t for t in ("sst", "para", "sts") if t != stage]
        assert rows[f"train_{stage}_loss"].notna().all()
        assert all(rows[f"train_{t}_loss"].isna().all() for t in others if f"train_{t}_loss" in h.columns)
    # model selection within a stage scores that stage's task only
    for _, row in h.iterrows():
        metric = {"sst": "dev_sst_acc", "para": "dev_para_acc", "sts": "dev_sts_pearson"}[row["phase"]]
        expected = (row[metric] + 1) / 2 if row["phase"] == "sts" else row[metric]
        assert row["dev_score"] == pytest.approx(expected, abs=1e-5, nan_ok=True)   # an undefined r: no score
    # the last stage's best checkpoint is the model; none is selected when its r is undefined in every epoch
    assert res.best_epoch in ((5, 6) if h.loc[h["phase"] == "sts", "dev_sts_pearson"].notna().any() else (-1,))


@pytest.mark.parametrize("lr_schedule", ["linear", "constant"])
def test_each_sequential_phase_runs_the_whole_schedule_on_its_own_updates(tiny_model_dir, prepared, tmp_path,
                                                                        monkeypatch, lr_schedule):
    """A sequential run's phases each warm up from their first update and (linear) decay to their
    last, so every phase gets the same share of the learning-rate budget; one schedule over the
    whole run gave three phases 51%, 37% and 12% of it. The history's `lr_budget` is the learning rate
    summed over the updates done (each phase's sum on its own schedule, run-long), as the report's
    training check reads it: each phase's evaluations, counted from its predecessor's last, sit at the
    closed-form budget of the phase's own schedule (minbert.train.plateau.lr_budget)."""
    steps = []
    real = train.set_lr
    monkeypatch.setattr(train, "set_lr", lambda opt, step, total, warmup, schedule:
                        steps.append((step, total, warmup)) or real(opt, step, total, warmup, schedule))
    exp = make_exp(tiny_model_dir, schedule="sequential", tasks=["sst", "para", "sts"], epochs=2,
                   max_steps_per_epoch=4, warmup_ratio=0.25, lr_schedule=lr_schedule, evals_per_epoch=2)
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert steps == [(k, 8, 2) for k in range(8)] * 3          # each phase: its own 8 updates, 2 of warm-up
    h = pd.read_csv(tmp_path / "run" / "history.csv")
    lr = exp.finetune.lr
    phase_sum = float(rule.lr_budget(8, 8, 2, lr_schedule)) * lr
    place, start = positions(h, exp.finetune.warmup_ratio, lr_schedule), 0.0
    assert place.tolist() == h["lr_budget"].tolist() and h["lr_budget"].is_monotonic_increasing
    for p, (_, rows) in enumerate(h.groupby("phase", sort=False)):
        within = rows["update"].to_numpy() - 8 * p
        expected = rule.lr_budget(within, 8, 2, lr_schedule) * lr
        assert rows["lr_budget"].to_numpy() - start == pytest.approx(expected, abs=1e-4 * lr)   # csv: 6 digits
        assert rows["lr_budget"].iloc[-1] == pytest.approx((p + 1) * phase_sum, rel=1e-5)   # each phase its share
        start = float(rows["lr_budget"].iloc[-1])
    if lr_schedule == "constant":                              # after the warm-up, the phase's rate held
        assert h["lr"].tolist() == pytest.approx([lr] * len(h))
        assert h["lr_budget"].tolist()[:4] == pytest.approx([1.5 * lr, 3.5 * lr, 5.5 * lr, 7.5 * lr])


def test_sequential_phases_restart_the_momentum_copy_from_the_reloaded_best(tiny_model_dir, prepared, tmp_path,
                                                                          monkeypatch):
    """After each sequential phase the model goes back to that phase's best checkpoint; SMART's
    momentum copy goes back with it (it would otherwise carry the last epoch's average)."""
    seen = []
    original = train.end_of_phase

    def spy(tr, state, plan):
        original(tr, state, plan)
        if state.phase < len(plan.phases):
            model, teacher = tr.model.state_dict(), tr.momentum.module.state_dict()
            seen.append(all(torch.equal(model[k], teacher[k]) for k in model))

    monkeypatch.setattr(train, "end_of_phase", spy)
    exp = make_exp(tiny_model_dir, schedule="sequential", tasks=["sst", "sts"], epochs=2, max_steps_per_epoch=2,
                   smart={"enabled": True, "mu": 1.0, "beta": 0.5})
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert seen == [True]


def test_smart_and_pcgrad_runs_complete_and_change_the_weights(tiny_model_dir, prepared, tmp_path):
    base = {"schedule": "simultaneous", "epochs": 1, "max_steps_per_epoch": 3, "hidden_dropout": 0.0,
            "heads": {"dropout": 0.0, "sts": "cosine", "losses": {"sts": "mse+pearson"}}}
    plain_exp = make_exp(tiny_model_dir, **base)
    before = initial_weights(plain_exp)
    finetune_experiment(plain_exp, prepared, tmp_path / "plain")
    plain = state_dict(tmp_path / "plain" / "model.pt")
    for name, extra in (("smart", {"smart": {"enabled": True, "lambda_s": 10.0, "epsilon": 1e-2, "step_size": 1e-2}}),
                        ("pcgrad", {"pcgrad": True}),
                        ("both", {"pcgrad": True, "smart": {"enabled": True, "mu": 0.0}})):
        res = finetune_experiment(make_exp(tiny_model_dir, **base, **extra), prepared, tmp_path / name)
        assert math.isfinite(res.best_score), name
        h = pd.read_csv(tmp_path / name / "history.csv")
        assert np.isfinite(h[[c for c in h.columns if c.startswith("train_")]].to_numpy()).all(), name
        after = state_dict(tmp_path / name / "model.pt")
        assert changed(before, after, "encoder.") and changed(before, after, "heads."), name
        # the regulariser is in effect: same seed and data, different weights than plain training
        assert changed(plain, after, "encoder."), name


def test_smart_tasks_limits_the_regulariser_to_the_named_tasks(tiny_model_dir, prepared, tmp_path, monkeypatch):
    calls = []
    original = objectives.smart_adversarial_loss

    def spy(forward, embeds, out, kind, *args, **kw):
        calls.append(kind)
        return original(forward, embeds, out, kind, *args, **kw)

    monkeypatch.setattr(objectives, "smart_adversarial_loss", spy)
    base = {"schedule": "simultaneous", "epochs": 1, "max_steps_per_epoch": 2}
    finetune_experiment(make_exp(tiny_model_dir, **base, smart={"enabled": True, "tasks": ["sst"]}), prepared,
                        tmp_path / "sst")
    assert calls == ["classification"] * 2          # one SST batch per update, nothing for para / sts
    calls.clear()
    finetune_experiment(make_exp(tiny_model_dir, **base, smart={"enabled": True}), prepared, tmp_path / "all")
    assert sorted(set(calls)) == ["binary", "classification", "regression"] and len(calls) == 6


def test_symmetric_pairs_train_on_both_orders_reproducibly(tiny_model_dir, prepared, tmp_path, monkeypatch):
    seen = []
    original = batches.collate

    def spy(data, indices, tokenizer, swap=None, fixed_shapes=False):
        if data.task != "sst":
            seen.append((data.task, tuple(indices), None if swap is None else tuple(swap)))
        return original(data, indices, tokenizer, swap, fixed_shapes)

    monkeypatch.setattr(batches, "collate", spy)
    exp = make_exp(tiny_model_dir, heads={"symmetric_pairs": True, "sts": "concat"}, epochs=1, max_steps_per_epoch=4)
    finetune_experiment(exp, prepared, tmp_path / "a")
    first, seen[:] = list(seen), []
    finetune_experiment(exp, prepared, tmp_path / "b", resume=False)
    assert first == seen                               # the same pairs swapped, run after run
    swaps = [s for _, _, m in first for s in m]
    assert {t for t, _, _ in first} == {"para", "sts"} and 0.2 < np.mean(swaps) < 0.8
    assert_same_weights(state_dict(tmp_path / "a" / "model.pt"), state_dict(tmp_path / "b" / "model.pt"))


# ---------------------------------------------------------------- data parallel (torchrun, gloo)

DP_FINETUNE = {"epochs": 2, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.25, "max_steps_per_epoch": 6,
               "hidden_dropout": 0.0, "attention_dropout": 0.0, "downsample": {"mode": "none"},
               "heads": {"dropout": 0.0, "pooling": "mean"}}


def fine_tune_once_and_under_torchrun(tmp_path: Path, model_dir: Path, base: dict, env: dict, timeout: int,
                                      one_env: dict | None = None) -> tuple[Path, Path]:
    """Experiment `dp` (DP_FINETUNE, without dropout) fine-tuned by one process and by two under
    torchrun on the same data; returns their fine-tune folders."""
    data = write_prepared(tmp_path / "data", n_train=32, n_dev=32)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "base": {"model": str(model_dir), "seed": 5, "max_length": 32, **base},
        "experiments": {"dp": {"finetune": DP_FINETUNE}}}), encoding="utf-8")
    env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    for r in ("one", "two"):
        shutil.copytree(data, tmp_path / r / "data")
    common = ["-m", "stages.finetune", "--experiment", "dp", "--params", str(params)]
    one = subprocess.run([sys.executable, *common, "--results", str(tmp_path / "one")], cwd=tmp_path,
                         env={**env, **(one_env or {})}, capture_output=True, text=True, timeout=timeout)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "2", *common,
                          "--results", str(tmp_path / "two")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert two.returncode == 0, two.stderr[-3000:]
    return tuple(tmp_path / r / "experiments" / "dp" / "finetune" for r in ("one", "two"))


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tiny_model_dir, tmp_path):
    # float32: the comparison is of one process against two, each multiplying half of every batch,
    # which bf16 rounds differently (where `auto` means bf16: a CPU with avx512_bf16, a GPU)
    a, b = fine_tune_once_and_under_torchrun(
        tmp_path, tiny_model_dir, {"device": "cpu", "threads": 1, "precision": "fp32"},
        child_env(OMP_NUM_THREADS="1"), timeout=300)
    ca = torch.load(a / "model.pt", map_location="cpu", weights_only=True)
    cb = torch.load(b / "model.pt", map_location="cpu", weights_only=True)
    assert ca["epoch"] == cb["epoch"]
    for k, v in ca["dev_metrics"].items():
        assert cb["dev_metrics"][k] == pytest.approx(v, abs=1e-3), k
    assert_same_weights(ca["state_dict"], cb["state_dict"], atol=1e-4)
    # dev numbers of every epoch agree (the train_* columns are rank 0's share of the batches)
    ha, hb = pd.read_csv(a / "history.csv"), pd.read_csv(b / "history.csv")
    dev_cols = [c for c in ha.columns if c.startswith("dev_")]
    assert len(ha) == len(hb) == 2 and dev_cols
    np.testing.assert_allclose(hb[dev_cols].to_numpy(), ha[dev_cols].to_numpy(), rtol=1e-3, atol=1e-3)
    # the training went somewhere: weights moved from the start
    start = initial_weights(ExperimentParams.model_validate(
        {"model": str(tiny_model_dir), "seed": 5, "finetune": DP_FINETUNE}))
    assert changed(start, ca["state_dict"], "encoder.")


def test_bf16_asked_for_on_a_cpu_without_native_bf16_is_honoured_and_said(monkeypatch, caplog):
    from minbert.core import runtime

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    cpu = torch.device("cpu")
    with caplog.at_level("WARNING", logger="minbert"):
        assert runtime.configure(cpu, "bf16") is True
        with runtime.autocast(cpu, True):
            assert torch.is_autocast_enabled("cpu")
        with runtime.autocast(cpu, False):
            assert not torch.is_autocast_enabled("cpu")
    assert len(caplog.records) == 1 and "set precision: auto (or fp32)" in caplog.records[0].message
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    caplog.clear()
    with caplog.at_level("WARNING", logger="minbert"):
        assert runtime.configure(cpu, "bf16") is True
    assert not caplog.records