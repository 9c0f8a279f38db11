"""Where a running pipeline stands (minbert.pipeline.progress, `minbert progress`): a training job
writes where it is (phase, epoch, updates, rate, time left) beside its resumable state; the command
counts the run's jobs done, running and waiting from the job files, locks and run records, and
shows each running job, whichever process runs it."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, child_env
from test_train import finetune_experiment, make_exp, write_prepared

import minbert.core.progress as progress_file
from minbert.core.layout import Layout
from minbert.pipeline import progress


def test_a_training_job_says_where_it_is_beside_its_state(tiny_model_dir, tmp_path, monkeypatch):
    seen = []
    real = progress_file.Progress.update

    def update(self, force=False, **fields):
        seen.append(dict(fields))
        real(self, force=True, **fields)
        seen[-1]["on_disk"] = json.loads(self.path.read_text())

    monkeypatch.setattr(progress_file.Progress, "update", update)
    monkeypatch.setattr(progress_file.Progress, "due", lambda self: True)   # every update, not every 2 s
    data = write_prepared(tmp_path / "data", n_train=24, n_dev=16)
    finetune_experiment(make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=3, tasks=["sst"]), data,
                        tmp_path / "run")
    assert [(s["epoch"], s["epoch_update"], s["update"]) for s in seen] == \
        [(1, 1, 1), (1, 2, 2), (1, 3, 3), (2, 1, 4), (2, 2, 5), (2, 3, 6)]
    last = seen[-1]
    assert last["epochs"] == 2 and last["updates"] == 6 and last["epoch_updates"] == 3 and last["phase"] == "sst"
    assert last["updates_per_second"] > 0 and last["seconds_left"] >= 0
    assert last["on_disk"]["stage"] == "finetune" and last["on_disk"]["update"] == 6
    assert not (tmp_path / "run.state").exists()              # finished: the state folder and its progress go


def _plan(root: Path, model: Path) -> dict:
    """The jobs of a two-experiment params file (a and b) on the demo data, by id, as the planner
    makes them for the results folder `results` under `root`."""
    from minbert.params import validate_params
    from minbert.pipeline.plan import pipeline

    lp = validate_params({"data": {"dir": str(REPO / "data/demo"), "nli_file": str(REPO / "data/demo/nli-sample.jsonl")},
                          "base": {"model": str(model)}, "experiments": {"a": {}, "b": {}}})
    return {j.id: j for j in pipeline(lp, Layout("results"))}


def _job_file(root: Path, job) -> dict:
    """Write the job's file where the planner writes it; returns its description."""
    path = root / job.job_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job.file_text())
    return job.description()


def _record(root: Path, stage: str, name: str | None, desc: dict, seconds: float = 12.0) -> None:
    path = root / Layout("results").run_record(stage, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    # as runinfo writes it: the description with the inputs' hashes and where it ran
    runtime = {"device": "cpu", "precision": "fp32", "world": 1}
    path.write_text(json.dumps({"description": {**desc, "read_hashes": {}, "runtime": runtime}, "wall_seconds": seconds}))


def test_the_run_is_counted_and_a_running_job_shown(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    L = Layout("results")
    jobs = _plan(tmp_path, tiny_model_dir)
    a = _job_file(tmp_path, jobs["finetune@a"])
    b = _job_file(tmp_path, jobs["finetune@b"])
    p = _job_file(tmp_path, jobs["predict@a"])
    _job_file(tmp_path, jobs["evaluate@a"])
    _record(tmp_path, "finetune", "a", a)
    time.sleep(0.05)
    _record(tmp_path, "predict", "a", p, seconds=30.0)
    _record(tmp_path, "finetune", "b", {**b, "settings": {**b["settings"], "seed": 2}})   # other settings: to do again
    states = {s.id: s.status for s in progress.job_states(L)}
    assert states == {"finetune a": "done", "finetune b": "waiting", "predict a": "done", "evaluate a": "waiting"}
    # a process holds b's lock and says where it is: b is running, its line shows the epoch, rate, ETA
    holder = subprocess.Popen([sys.executable, "-c", f"""
import json, os, sys, time
from minbert.pipeline.lock import job_lock
with job_lock({L.lock('finetune', 'b')!r}, "finetune@b"):
    os.makedirs({L.state('finetune', 'b')!r}, exist_ok=True)
    with open({L.state('finetune', 'b') + '/progress.json'!r}, "w") as f:
        json.dump({{"pid": os.getpid(), "updated": time.time(), "phase": "sst+para+sts", "phases": 1, "epoch": 2,
                   "epochs": 3, "epoch_update": 5, "epoch_updates": 20, "update": 25, "updates": 60,
                   "updates_per_second": 2.5, "seconds_left": 14}}, f)
    print("held", flush=True)
    time.sleep(60)
"""], stdout=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path)
    try:
        assert holder.stdout.readline().strip() == "held"
        lines = progress.summary(progress.job_states(L))
        assert lines[0] == "2 of 4 jobs done, 1 running, 1 waiting; about 0:00:14 left (and 1 job(s) with no " \
                           "earlier run to go by)"
        assert lines[1].startswith(f"  finetune b: hand pid {holder.pid}, 0:00:0")
        assert lines[1].endswith("epoch 2/3 update 5/20 (25/60 in all), 2.50 upd/s, ETA 0:00:14")
    finally:
        holder.kill()
        holder.wait()
    # the holder gone (killed: the system released its lock), b is waiting again
    assert {s.id: s.status for s in progress.job_states(L)}["finetune b"] == "waiting"


def test_the_command_prints_the_run_and_watches_until_nothing_is_left(tmp_path, monkeypatch, capsys, tiny_model_dir):
    from minbert import cli

    monkeypatch.chdir(tmp_path)
    desc = _job_file(tmp_path, _plan(tmp_path, tiny_model_dir)["prepare"])
    cli.main(["progress"])
    assert capsys.readouterr().out.strip().endswith("0 of 1 jobs done, 0 running, 1 waiting; about 0:00:00 left "
                                                    "(and 1 job(s) with no earlier run to go by)")
    _record(tmp_path, "prepare", None, desc)
    cli.main(["progress", "--watch", "0.1"])        # nothing left: one print, then it ends
    assert capsys.readouterr().out.strip().endswith("1 of 1 jobs done, 0 running, 0 waiting")
    with pytest.raises(SystemExit):
        cli.main(["progress", "--watch", "0"])
    assert "--watch 0: expected a number of seconds above 0" in capsys.readouterr().err


def test_no_job_files_is_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert progress.summary(progress.job_states(Layout("results")))[0].startswith("no jobs")
