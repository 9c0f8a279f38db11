"""What users of the Hugging Face Trainer reach for, in the fine-tuning loop on the tiny BERT:
gradient accumulation (the same update as the whole batch in one step, numbers compared), early
stopping on the dev selection score (patience counted in evaluations, within an epoch too, per
phase of sequential fine-tuning), and fp16 autocast with a gradient scaler (on the CPU, which torch
allows: a run completes close to float32's, and a step whose gradients overflowed is skipped)."""
from __future__ import annotations

import itertools

import pandas as pd
import pytest
import torch
from test_train import finetune_experiment, initial_weights, make_exp, state_dict, write_prepared

import minbert.train.evaluation as evaluation
import minbert.train.loop as loop
from minbert.core.errors import MinBertError
from minbert.data.stream import TaskStream
from minbert.params import ExperimentParams

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "heads": {"dropout": 0.0}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=24)


def fp32(exp: ExperimentParams) -> ExperimentParams:
    return exp.model_copy(update={"precision": "fp32"})


# ---------------------------------------------------------------- gradient accumulation

@pytest.mark.numbers
@pytest.mark.parametrize("finetune,parts", [
    ({"schedule": "round_robin"}, 4),
    ({"schedule": "simultaneous", "grad_clip": 0.05,
      "heads": {"dropout": 0.0, "para": "concat", "sts": "cosine", "pooling": "cls"}}, 3),   # 8 rows as 3 + 3 + 2
], ids=["round_robin", "simultaneous_clipped_uneven"])
def test_accumulated_micro_batches_make_the_update_of_the_whole_batch(tiny_model_dir, prepared, tmp_path, monkeypatch,
                                                                      finetune, parts):
    ft = {"epochs": 1, "max_steps_per_epoch": 3, "batch_size": 8, **NO_DROPOUT, **finetune}
    whole = finetune_experiment(fp32(make_exp(tiny_model_dir, **ft)), prepared, tmp_path / "whole")
    sizes = []
    real = TaskStream.next_parts

    def counted(self, n):
        out = real(self, n)
        sizes.append([len(b["labels"]) for b in out])
        return out

    monkeypatch.setattr(TaskStream, "next_parts", counted)
    exp = fp32(make_exp(tiny_model_dir, gradient_accumulation_steps=parts, **ft))
    accumulated = finetune_experiment(exp, prepared, tmp_path / "accumulated")
    assert sizes and all(len(s) == parts and sum(s) == 8 for s in sizes), sizes
    a, b = state_dict(tmp_path / "whole" / "model.pt"), state_dict(tmp_path / "accumulated" / "model.pt")
    moved = 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
        moved += not torch.equal(a[k], b[k])
    assert moved, "the two runs are not independent: nothing differs even in rounding"
    for col in [c for c in whole.history.columns if c.startswith("train_") and c.endswith("_loss")]:
        assert accumulated.history[col].tolist() == pytest.approx(whole.history[col].tolist(), rel=1e-5), col


@pytest.mark.parametrize("finetune,why", [
    ({"schedule": "simultaneous", "pcgrad": True}, "PCGrad"),
    ({"smart": {"enabled": True}}, "SMART"),
    ({"heads": {"losses": {"sts": "mse+pearson"}}}, "is a statistic of the whole batch"),
    ({"batch_size": 2}, "more than batch_size"),
])
def test_accumulation_that_would_change_the_update_is_refused(tiny_model_dir, finetune, why):
    with pytest.raises(Exception, match=why) as err:
        make_exp(tiny_model_dir, gradient_accumulation_steps=4, **finetune)
    assert "gradient_accumulation_steps 4" in str(err.value)


# ---------------------------------------------------------------- early stopping

def scripted_dev(monkeypatch, scores):
    """Dev evaluations that score as scripted (the loop's decisions are the subject, not the metrics)."""
    it = iter(scores)

    def dev_metrics(model, dev, tokenizer, device, precision, features=None):
        s = next(it)
        return {f"{t}_acc": s for t in ("sst", "para")} | {f"{t}_loss": 1.0 for t in ("sst", "para")}

    monkeypatch.setattr(evaluation, "dev_metrics", dev_metrics)


@pytest.mark.parametrize("rule,scores,epochs_evaluated,best_epoch", [
    # stale at 0.45, 0.50 (not above 0.50), 0.49: the third stops the run in the middle of epoch 3
    ({"patience": 3}, [0.30, 0.50, 0.45, 0.50, 0.49, 0.99, 0.99], [0.5, 1, 1.5, 2, 2.5], 1),
    # 0.52 and 0.53 rise by less than min_delta: the end of epoch 2 stops it; the best model is still 0.53's
    ({"patience": 2, "min_delta": 0.05}, [0.30, 0.50, 0.52, 0.53, 0.99, 0.99], [0.5, 1, 1.5, 2], 2),
], ids=["within_an_epoch", "min_delta_at_an_epoch_end"])
def test_early_stopping_counts_evaluations_without_improvement(tiny_model_dir, prepared, tmp_path, monkeypatch, rule,
                                                               scores, epochs_evaluated, best_epoch):
    scripted_dev(monkeypatch, scores)
    exp = make_exp(tiny_model_dir, tasks=["sst"], epochs=4, max_steps_per_epoch=4, evals_per_epoch=2,
                   early_stopping=rule)
    result = finetune_experiment(exp, prepared, tmp_path / "run")
    assert result.history["epoch"].tolist() == epochs_evaluated
    assert result.history["update"].tolist() == [int(4 * e) for e in epochs_evaluated]   # 4 updates an epoch
    assert result.best_epoch == best_epoch
    assert torch.load(tmp_path / "run" / "model.pt", weights_only=True)["epoch"] == best_epoch
    assert not (tmp_path / "run.state").exists()           # finished: outputs written, state gone


def test_early_stopping_ends_each_phase_of_sequential_fine_tuning(tiny_model_dir, prepared, tmp_path, monkeypatch):
    scripted_dev(monkeypatch, itertools.repeat(0.5))        # never better than the phase's first evaluation
    exp = make_exp(tiny_model_dir, tasks=["sst", "para"], schedule="sequential", epochs=3, max_steps_per_epoch=2,
                   early_stopping={"patience": 1})
    result = finetune_experiment(exp, prepared, tmp_path / "run")
    # each phase: its first epoch (the best), its second (stale: the phase stops), never its third
    assert result.history["phase"].tolist() == ["sst", "sst", "para", "para"]
    assert result.history["epoch"].tolist() == [1, 2, 4, 5]


def test_without_early_stopping_every_epoch_runs(tiny_model_dir, prepared, tmp_path, monkeypatch):
    scripted_dev(monkeypatch, itertools.repeat(0.5))
    exp = make_exp(tiny_model_dir, tasks=["sst"], epochs=3, max_steps_per_epoch=1)
    assert finetune_experiment(exp, prepared, tmp_path / "run").history["epoch"].tolist() == [1, 2, 3]


# ---------------------------------------------------------------- until the plateau

QUIET = {"jitter": 0.0, "rows": 0.01}               # the noise of an evaluation: about 0.0014 on 24 dev rows
RULE = {"enabled": True, "tolerance": 0.01, "window": 0.25, "fit": 0.5, "window_evaluations": 2,
        "min_evaluations": 4, "noise": dict.fromkeys(("classification", "binary", "regression"), QUIET)}
FLAT = [0.5 + 0.001 * (-1) ** k for k in range(40)]
RISING = [0.2 + 0.02 * k for k in range(40)]        # 0.04 an epoch: far more than 0.01 a quarter of the run


def test_a_run_stops_at_its_plateau_and_runs_to_its_cap_while_still_rising(tiny_model_dir, prepared, tmp_path,
                                                                        monkeypatch):
    """Sequential fine-tuning with `until_plateau`, its cap 6 epochs of 4 updates, dev evaluated twice an
    epoch: SST's phase, flat, ends at its plateau (its fifth evaluation, the first with two in the last
    quarter of its learning-rate budget: 7.5 and 9.5 of 9.5 updates' worth after a warm-up of 2), Para's,
    rising, runs to its cap; each evaluation's history row holds the rule's reading and each phase's last
    says how it ended."""
    scripted_dev(monkeypatch, FLAT[:5] + RISING)
    exp = make_exp(tiny_model_dir, tasks=["sst", "para"], schedule="sequential", epochs=6, max_steps_per_epoch=4,
                   evals_per_epoch=2, warmup_ratio=0.1, lr_schedule="constant", until_plateau=RULE)
    result = finetune_experiment(exp, prepared, tmp_path / "run")
    h = pd.read_csv(tmp_path / "run" / "history.csv")
    sst, para = h[h["phase"] == "sst"], h[h["phase"] == "para"]
    assert sst["plateau"].tolist() == ["few"] * 4 + ["flat"] and sst["stopped"].tolist()[-1] == "plateau"
    assert sst["update"].tolist()[-1] == 10                        # 2.5 of its 6 epochs (24): the rest not trained
    assert para["update"].tolist() == list(range(12, 12 + 24, 2))  # every evaluation of its 6 epochs
    assert set(para["plateau"].tolist()[6:]) == {"rising"} and para["stopped"].tolist()[-1] == "cap"
    assert h["stopped"].notna().sum() == 2
    assert result.stops == [{"phase": "sst", "stopped": "plateau", "epoch": 2.5, "update": 10},
                            {"phase": "para", "stopped": "cap", "epoch": 12, "update": 34}]


def test_a_rule_that_cannot_tell_trains_to_the_cap(tiny_model_dir, prepared, tmp_path, monkeypatch):
    """At a noise the rule cannot tell 0.01 through (an evaluation's sd of about 0.18), a flat curve never reads
    flat: the run trains every planned epoch, and its phase says it ran to its cap."""
    scripted_dev(monkeypatch, FLAT)
    loud = {**RULE, "noise": {kind: {"jitter": 0.15, "rows": 1} for kind in ("classification", "binary", "regression")}}
    exp = make_exp(tiny_model_dir, tasks=["sst"], epochs=5, max_steps_per_epoch=2, evals_per_epoch=2,
                   until_plateau=loud)
    h = finetune_experiment(exp, prepared, tmp_path / "run").history
    assert len(h) == 10 and set(h["plateau"]) <= {"few", "unclear"} and h["stopped"].dropna().tolist() == ["cap"]


def test_without_until_plateau_the_history_is_as_before(tiny_model_dir, prepared, tmp_path, monkeypatch):
    scripted_dev(monkeypatch, FLAT)
    h = finetune_experiment(make_exp(tiny_model_dir, tasks=["sst"], epochs=5, max_steps_per_epoch=2,
                                     evals_per_epoch=2), prepared, tmp_path / "run").history
    assert len(h) == 10 and "plateau" not in h.columns and "stopped" not in h.columns


def test_an_unfilled_rule_is_one_line(tiny_model_dir, prepared, tmp_path, monkeypatch):
    """A rule given to the library without the check's keys filled (as minbert.params.load_params fills
    them) says which key and how."""
    scripted_dev(monkeypatch, FLAT)
    exp = make_exp(tiny_model_dir, tasks=["sst"], epochs=5, max_steps_per_epoch=2, evals_per_epoch=2,
                   until_plateau={"enabled": True})
    with pytest.raises(MinBertError, match=r"finetune.until_plateau.tolerance is not set: load the params"):
        finetune_experiment(exp, prepared, tmp_path / "run")


# ---------------------------------------------------------------- fp16 with a gradient scaler

@pytest.mark.numbers
def test_fp16_trains_with_a_gradient_scaler_close_to_float32(tiny_model_dir, prepared, tmp_path, monkeypatch):
    steps = []
    real = torch.amp.GradScaler.step

    def counted(self, optimizer, *a, **kw):
        steps.append(self.get_scale())
        return real(self, optimizer, *a, **kw)

    monkeypatch.setattr(torch.amp.GradScaler, "step", counted)
    ft = {"epochs": 1, "max_steps_per_epoch": 4, **NO_DROPOUT}
    half = finetune_experiment(make_exp(tiny_model_dir, **ft).model_copy(update={"precision": "fp16"}), prepared,
                               tmp_path / "fp16")
    assert len(steps) == 4 and steps[0] == 65536.0                 # every update went through the scaler
    monkeypatch.undo()
    full = finetune_experiment(fp32(make_exp(tiny_model_dir, **ft)), prepared, tmp_path / "fp32")
    for col in [c for c in full.history.columns if c.startswith("train_") and c.endswith("_loss")]:
        assert half.history[col].tolist() == pytest.approx(full.history[col].tolist(), rel=2e-2), col
    a, b = state_dict(tmp_path / "fp16" / "model.pt"), state_dict(tmp_path / "fp32" / "model.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=5e-3, msg=lambda m: f"{k}: {m}")


def test_an_fp16_step_whose_gradients_overflowed_is_skipped(tiny_model_dir, prepared, tmp_path, monkeypatch):
    scalers = []
    real = loop.start_run

    def overflowing(*args, **kwargs):
        tr, plan = real(*args, **kwargs)
        scalers.append(tr.scaler)
        tr.params[0].register_hook(lambda g: torch.full_like(g, float("inf")))   # every gradient of it overflows
        return tr, plan

    monkeypatch.setattr(loop, "start_run", overflowing)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=2, **NO_DROPOUT).model_copy(update={"precision": "fp16"})
    before = initial_weights(exp)
    finetune_experiment(exp, prepared, tmp_path / "run")
    after = state_dict(tmp_path / "run" / "model.pt")
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step moved a weight"
    assert scalers[0].get_scale() == 65536.0 / 4                   # halved at each of the two overflows


def test_fp16_is_recorded_and_a_state_of_another_precision_is_not_resumed(tiny_model_dir, prepared, tmp_path,
                                                                         caplog):
    exp = make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=1)
    finetune_experiment(fp32(exp), prepared, tmp_path / "run", stop_after_epochs=1)
    with caplog.at_level("WARNING"):
        finetune_experiment(exp.model_copy(update={"precision": "fp16"}), prepared, tmp_path / "run")
    assert "precision: 'fp32' -> 'fp16'" in caplog.text


def test_fp16_state_resumes_with_its_scale(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=2).model_copy(update={"precision": "fp16"})
    straight = finetune_experiment(exp, prepared, tmp_path / "straight")
    finetune_experiment(exp, prepared, tmp_path / "resumed", stop_after_epochs=1)
    saved = torch.load(tmp_path / "resumed.state" / "last.pt", weights_only=True)
    assert saved["scaler"]["scale"] == 65536.0
    resumed = finetune_experiment(exp, prepared, tmp_path / "resumed")
    drop = ["seconds", "examples_per_second"]
    assert resumed.history.drop(columns=drop).equals(straight.history.drop(columns=drop))


def test_precision_fp16_is_a_setting_and_others_are_one_line(tiny_model_dir):
    from minbert.params import validate_params

    raw = {"base": {"model": str(tiny_model_dir), "precision": "fp16"}, "experiments": {"a": {}}}
    assert validate_params(raw).experiment("a").precision == "fp16"
    raw["experiments"]["a"] = {"precision": "fp8"}
    with pytest.raises(MinBertError) as err:
        validate_params(raw)
    assert "\n" not in str(err.value) and "'experiments.a.precision'" in str(err.value) and "'fp16'" in str(err.value)
