"""Sentences of the docs that describe behaviour, checked on tiny runs where the demo would cost
minutes: gradient accumulation's numbers (docs/finetuning.md: the whole batch's in float32 without
dropout, tests/test_trainer_options.py; another run's with dropout or in bf16), the one line that
fp16 on a CPU is slow, and Snakemake's benchmark of a job DVC ran again (docs/workflow.md, "The two
engines' records")."""
from __future__ import annotations

import logging
import os
import time

import pytest
import torch
from test_train import finetune_experiment, make_exp, restore_threads, state_dict, write_prepared  # noqa: F401

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "heads": {"dropout": 0.0}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=16)


def largest_difference(tiny_model_dir, prepared, out, precision: str, **finetune) -> float:
    """The largest weight difference between one run on whole batches of 8 and one in 4 micro-batches."""
    ft = {"epochs": 1, "max_steps_per_epoch": 3, "batch_size": 8, **finetune}
    runs = []
    for name, parts in (("whole", 1), ("accumulated", 4)):
        exp = make_exp(tiny_model_dir, gradient_accumulation_steps=parts, **ft).model_copy(update={"precision": precision})
        finetune_experiment(exp, prepared, out / name)
        runs.append(state_dict(out / name / "model.pt"))
    return max(float((runs[0][k].float() - runs[1][k].float()).abs().max()) for k in runs[0])


def test_accumulation_is_the_whole_batch_in_float32_without_dropout_and_another_run_otherwise(tiny_model_dir,
                                                                                              prepared, tmp_path):
    exact = largest_difference(tiny_model_dir, prepared, tmp_path / "exact", "fp32", **NO_DROPOUT)
    dropout = largest_difference(tiny_model_dir, prepared, tmp_path / "dropout", "fp32")
    bf16 = largest_difference(tiny_model_dir, prepared, tmp_path / "bf16", "bf16", **NO_DROPOUT)
    assert exact < 1e-5                       # float rounding (test_trainer_options compares every weight)
    assert dropout > 100 * max(exact, 1e-7)   # other masks: other numbers
    assert bf16 > 100 * max(exact, 1e-7)      # each slice rounded on its own, in bf16's 8 bits


def test_fp16_on_a_cpu_is_said_in_one_line(caplog):
    from minbert.core.runtime import configure_precision

    cpu = torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger="minbert"):
        assert configure_precision(cpu, "fp16") == "fp16"
    lines = [r.getMessage() for r in caplog.records if "fp16" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("precision: fp16 on a CPU: float16 autocast is made for GPUs and "
                                                   "runs several times slower on a CPU than precision: auto (")
    assert "\n" not in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minbert"):
        configure_precision(cpu, "fp32")
    assert not caplog.records


def test_a_snakemake_benchmark_older_than_its_jobs_last_run_is_dropped_at_planning(tmp_path, monkeypatch):
    """A job DVC ran again after Snakemake had run it: Snakemake's benchmark, which it dates among the
    job's outputs, is older than the job file DVC's run rewrote; planning removes it (and keeps a
    benchmark written after the run, as Snakemake writes it)."""
    from minbert.core.layout import Layout
    from workflow import dag

    monkeypatch.chdir(tmp_path)
    layout = Layout()
    stale, fresh = ("finetune", "a"), ("finetune", "b")
    for stage, name in (stale, fresh):
        for path in (layout.benchmark(stage, name), layout.run_record(stage, name)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
    past = time.time() - 60
    os.utime(layout.benchmark(*stale), (past, past))           # Snakemake's run, then DVC's
    os.utime(layout.run_record(*fresh), (past, past))          # the run, then Snakemake's benchmark of it

    class Job:
        def __init__(self, stage, name):
            self.stage, self.name, self.run_record = stage, name, layout.run_record(stage, name)

    monkeypatch.setattr(dag, "LAYOUT", layout)
    dag._drop_stale_benchmarks([Job(*stale), Job(*fresh), Job("predict", "c")])
    assert not os.path.exists(layout.benchmark(*stale)) and os.path.exists(layout.benchmark(*fresh))
