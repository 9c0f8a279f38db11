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
        exp = make_exp(tiny_model_dir, gradient_accumulation_steps=parts, **ft)
        exp = exp.model_copy(update={"precision": precision})
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


def test_the_estimate_says_it_too(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`minbert estimate` of params that run fp16 on a CPU prints the same line after its estimate."""
    from pathlib import Path

    from minbert import cli

    demo = Path(__file__).resolve().parents[1] / "data" / "demo"
    (tmp_path / "params.yaml").write_text(f"data: {{dir: {demo}, nli_file: null}}\nbase: {{model: {tiny_model_dir}, "
                                          f"precision: fp16, finetune: {{epochs: 1}}}}\nexperiments: {{plain: {{}}}}\n")
    monkeypatch.chdir(tmp_path)
    cli.main(["estimate", "--device", "cpu", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("about ") and "on cpu (fp16, " in lines[0]
    assert [x for x in lines if x.startswith("precision: fp16 on a CPU: ")], lines


def test_a_job_file_is_dated_no_later_than_the_outputs_its_description_made(tmp_path, monkeypatch):
    """DVC ran a job again after Snakemake had run it (Snakemake's benchmark older than the job file
    DVC's `resolve` rewrote), or restored its outputs from its cache (with the cache copies' old
    dates): planning dates the job file no later than the oldest of them, Snakemake's benchmark included,
    when its run record says they were made from that description; a job file of another description
    keeps its date (the job runs)."""
    import datetime as dt
    import json

    from minbert.core.layout import Layout
    from workflow import jobfiles

    monkeypatch.chdir(tmp_path)
    now = time.time()

    class Job:
        def __init__(self, name, described, ran):
            self.stage, self.name, self.results = "finetune", name, "results"
            self.job_file, self.run_record = f"jobs/{name}.json", f"runs/{name}.json"
            self.outputs = [f"out/{name}/model.pt", f"out/{name}/predictions"]
            self.described, self.read_paths = described, []          # it reads nothing that changed since
            bench = Layout().benchmark("finetune", name)
            for path in (self.job_file, self.outputs[0], f"{self.outputs[1]}/a.csv", bench):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").close()
            os.makedirs(os.path.dirname(self.run_record), exist_ok=True)
            with open(self.run_record, "w") as f:
                started = dt.datetime.fromtimestamp(now - 300).isoformat()
                json.dump({"description": {**ran, "runtime": {}}, "started": started, "fingerprint": f"{name}-run"}, f)

        def description(self):
            return self.described

    made, other = Job("made", {"settings": 1}, {"settings": 1}), Job("other", {"settings": 2}, {"settings": 1})
    for job in (made, other):
        for path, age in ((job.job_file, 30), (job.outputs[0], 10), (f"{job.outputs[1]}/a.csv", 20),
                          (Layout().benchmark("finetune", job.name), 200)):
            os.utime(path, (now - age, now - age))
    jobfiles.date_job_files([made, other])
    assert os.path.getmtime(made.job_file) <= now - 200              # before the benchmark, the oldest
    assert os.path.getmtime(other.job_file) == pytest.approx(now - 30)   # another description: it runs


def test_an_output_older_than_what_its_finished_job_read_is_dated_as_its_run_a_shared_file_copied_first(
        tmp_path, monkeypatch):
    """Two jobs' identical outputs, one file under a hard-linked cache (`cache.type hardlink`), share
    the date of the first: the second job's output then reads as older than its input. Planning dates
    it as its run started, after making it a file of its own, so the first job's file keeps its date;
    an output whose job's record does not say it made it keeps its date."""
    import datetime as dt
    import json

    from workflow import jobfiles

    monkeypatch.chdir(tmp_path)
    now = time.time()

    class Job:
        def __init__(self, name, reads, ran_at):
            self.stage, self.name, self.results = "predict", name, "results"
            self.job_file, self.run_record = f"jobs/{name}.json", f"runs/{name}.json"
            self.read_paths, self.output_files = reads, [f"out/{name}.csv"]
            for path in (self.job_file, self.run_record):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(self.run_record, "w") as f:
                json.dump({"description": {"settings": name, "runtime": {}}, "fingerprint": name,
                           "started": dt.datetime.fromtimestamp(ran_at).isoformat()}, f)

        def description(self):
            return {"settings": self.name}

        def portable(self, path):
            return path

    os.makedirs("out")
    for name, age in (("model_a", 400), ("model_b", 200)):
        with open(f"{name}.pt", "w") as f:
            f.write(name)
        os.utime(f"{name}.pt", (now - age, now - age))
    a, b = Job("a", ["model_a.pt"], now - 390), Job("b", ["model_b.pt"], now - 190)
    with open("out/a.csv", "w") as f:
        f.write("the same predictions\n")
    os.link("out/a.csv", "out/b.csv")                      # DVC's one copy of that content, linked twice
    os.utime("out/a.csv", (now - 380, now - 380))
    jobfiles.date_outputs([a, b])
    assert os.path.getmtime("out/a.csv") == pytest.approx(now - 380)      # a's file: its date, its inode
    assert os.path.getmtime("out/b.csv") >= os.path.getmtime("model_b.pt")   # after what b read
    assert os.stat("out/b.csv").st_nlink == 1 and open("out/b.csv").read() == "the same predictions\n"
    unrecorded = Job("c", ["model_b.pt"], now - 190)
    os.remove(unrecorded.run_record)
    with open("out/c.csv", "w") as f:
        f.write("x")
    os.utime("out/c.csv", (now - 300, now - 300))
    jobfiles.date_outputs([unrecorded])
    assert os.path.getmtime("out/c.csv") == pytest.approx(now - 300)       # no record: it runs, as it is
