"""The captured training step (minbert.train.step), checked where no GPU is: its parts run eagerly
(`capture=False`, the very code a CUDA graph records) train the model the ordinary step trains
(dropout off, so both draw no random numbers; padding computed instead of skipped: float32 rounding
apart), on batches of a few fixed lengths, updating only the parameters each update's tasks give a
gradient to, with no host sync; and the runs a graph cannot hold are named."""
from __future__ import annotations

import pytest
import torch
from test_hot_loop import SyncCounter
from test_train import finetune_experiment, make_exp, state_dict, write_prepared

import minbert.train.loop as loop
from minbert.data.batches import LENGTH_BUCKETS
from minbert.params.finetune import FinetuneParams
from minbert.train.step import CapturedSteps, why_not_captured

# compares numbers between two ways of computing them: CI runs it again with the other precision as `auto`
pytestmark = pytest.mark.numbers

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "heads": {"dropout": 0.0}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=24)


@pytest.fixture
def captured_parts(monkeypatch):
    """Every fit in the test runs through CapturedSteps(capture=False); yields them as made."""
    made = []
    real = loop.start_run

    def with_parts(*args, **kwargs):
        tr, plan = real(*args, **kwargs)
        tr.captured = CapturedSteps(tr, capture=False)
        made.append(tr.captured)
        return tr, plan

    monkeypatch.setattr(loop, "start_run", with_parts)
    return made


@pytest.mark.parametrize("finetune", [
    {"schedule": "round_robin"},
    {"schedule": "simultaneous", "heads": {"dropout": 0.0, "para": "concat", "sts": "cosine", "pooling": "cls"},
     "grad_clip": 0.05},
], ids=["round_robin", "simultaneous_clipped"])
def test_the_parts_train_what_the_ordinary_step_trains(tiny_model_dir, prepared, tmp_path, captured_parts, monkeypatch,
                                                         finetune):
    # float32: the comparison is of the two steps, not of bf16's rounding of padded and unpadded products
    exp = make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=5, **{**NO_DROPOUT, **finetune})
    exp = exp.model_copy(update={"precision": "fp32"})
    with_parts = finetune_experiment(exp, prepared, tmp_path / "parts")
    monkeypatch.undo()
    ordinary = finetune_experiment(exp, prepared, tmp_path / "ordinary")
    a, b = state_dict(tmp_path / "parts" / "model.pt"), state_dict(tmp_path / "ordinary" / "model.pt")
    moved = 0
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=lambda m: f"{k}: {m}")
        moved += not torch.equal(a[k], b[k])
    assert moved, "the two runs are not independent: nothing differs even in rounding"
    # the same decisions on dev: the same accuracies, and the dev losses; a tiny model's correlation over
    # 24 nearly equal scores is ill-conditioned (rounding moves it by a hundredth), so its loss stands for it
    assert with_parts.best_epoch == ordinary.best_epoch and with_parts.best_dev.keys() == ordinary.best_dev.keys()
    for k, v in ordinary.best_dev.items():
        if k.endswith("_acc"):
            assert with_parts.best_dev[k] == v, k
    for col in [c for c in ordinary.history.columns if c.startswith("dev_") and c.endswith("_loss")]:
        assert with_parts.history[col].tolist() == pytest.approx(ordinary.history[col].tolist(), rel=1e-3), col
    for col in [c for c in ordinary.history.columns if c.startswith("train_") and c.endswith("_loss")]:
        assert with_parts.history[col].tolist() == pytest.approx(ordinary.history[col].tolist(), rel=1e-4), col
    steps = captured_parts[0]
    lengths = {dict((k, s) for k, s, *_ in key[1:])["input_ids"][1] for key in steps.shapes}
    assert lengths <= set(LENGTH_BUCKETS) | {32}, lengths          # a few lengths known ahead (max_length 32)
    assert len(steps.shapes) <= 3 * len(lengths) * 2               # task x length x (full, last) batches


def test_an_update_moves_only_what_its_tasks_train(tiny_model_dir, prepared, tmp_path, captured_parts):
    """Round robin: an SST update leaves the paraphrase and similarity heads exactly as they were
    (as AdamW leaves parameters without a gradient), while the encoder and the SST head move."""
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=1, **NO_DROPOUT)   # one update: sst's
    finetune_experiment(exp, prepared, tmp_path / "one")
    steps = captured_parts[0]
    touched = {n for n, p in steps.tr.model.named_parameters() if p in steps.touched["sst"]}
    assert any(n.startswith("encoder.") for n in touched) and any(n.startswith("heads.sst.") for n in touched)
    assert not [n for n in touched if n.startswith(("heads.para.", "heads.sts."))]
    assert set(steps.touched) == {"sst"}
    state = steps.tr.optimizer.state
    names = {p: n for n, p in steps.tr.model.named_parameters()}
    assert {names[p] for p in state} == touched                   # state only for what was trained


def test_the_parts_read_nothing_back_from_the_device(tiny_model_dir, prepared, tmp_path, captured_parts, monkeypatch):
    counts, steps = {}, []
    real = CapturedSteps.step

    def counted(self, *args, **kwargs):
        counter = SyncCounter()
        with counter:
            out = real(self, *args, **kwargs)
        for k, v in counter.seen.items():
            counts[k] = counts.get(k, 0) + v
        steps.append(1)
        return out

    monkeypatch.setattr(CapturedSteps, "step", counted)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=4, **NO_DROPOUT)
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert len(steps) == 4 and not counts, counts


@pytest.mark.parametrize("setting,why", [
    ({"pcgrad": True, "schedule": "simultaneous"}, "PCGrad"), ({"smart": {"enabled": True}}, "SMART"), ({"compile": True}, "compiled"),
    ({"gradient_checkpointing": True}, "checkpointing"), ({"gradient_accumulation_steps": 2}, "accumulation"),
])
def test_runs_a_graph_cannot_hold_are_named(setting, why):
    assert why_not_captured(FinetuneParams(), 1) is None
    assert why in why_not_captured(FinetuneParams(**setting), 1)
    assert "all-reduce" in why_not_captured(FinetuneParams(), 2)
    assert "scaler" in why_not_captured(FinetuneParams(), 1, "fp16")
    assert why_not_captured(FinetuneParams(), 1, "fp32") is None


def test_a_warm_up_leaves_no_trace(tiny_model_dir, prepared, tmp_path, captured_parts, monkeypatch):
    """A shape first seen in the middle of an update (the second task of a simultaneous update) is
    warmed up before its capture: the gradients the first task added, the totals and the RNGs stay
    as they were."""
    seen = []
    real = CapturedSteps._shape

    def warm_up_each_new_shape(self, task, host):
        new = task not in self.touched or all(k[0] != task for k in self.shapes)
        shape = real(self, task, host)
        if new and len(seen) < 3:
            before = [g.clone() for g in self.grads.values()]
            totals = (self.tr.totals.loss.clone(), self.tr.totals.flagged.clone())
            rng = torch.get_rng_state()
            self._warm_up(task, shape)
            assert all(torch.equal(a, b) for a, b in zip(before, self.grads.values()))
            assert torch.equal(totals[0], self.tr.totals.loss) and torch.equal(totals[1], self.tr.totals.flagged)
            assert torch.equal(rng, torch.get_rng_state())
            seen.append(task)
        return shape

    monkeypatch.setattr(CapturedSteps, "_shape", warm_up_each_new_shape)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=2, schedule="simultaneous")   # dropout on
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert seen == ["sst", "para", "sts"]
