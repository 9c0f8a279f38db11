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
        # b's 14 s, then the waiting evaluation's start-up (it runs no network): 6 s
        assert lines[0] == "2 of 4 jobs done, 1 running, 1 waiting; about 0:00:20 left"
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
    assert capsys.readouterr().out.strip().endswith("0 of 1 jobs done, 0 running, 1 waiting; about 0:00:06 left")
    _record(tmp_path, "prepare", None, desc)
    cli.main(["progress", "--watch", "0.1"])        # nothing left: one print, then it ends
    assert capsys.readouterr().out.strip().endswith("1 of 1 jobs done, 0 running, 0 waiting")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "NaN", "inf", "-inf", "1e300", "86401"])
def test_the_watch_refuses_an_interval_that_is_no_finite_positive_number(tmp_path, monkeypatch, capsys, value):
    """`--watch nan` passed the check `<= 0` and ended in a traceback in time.sleep (issue 51)."""
    from conftest import error_line

    from minbert import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(["progress", f"--watch={value}"])
    shown = format(float(value), "g")
    assert e.value.code == 2
    assert error_line(capsys.readouterr().err) == f"error: --watch {shown}: expected a number of seconds above 0 " \
                                                  f"and at most 86400"


def _sleeps(monkeypatch, limit: int, at=None):
    """time.sleep in the watch, counted: the `at`-th call runs `at[1]`; past `limit` calls, the
    watch never ends (a test of its end fails instead of hanging)."""
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if at is not None and len(calls) == at[0]:
            at[1]()
        assert len(calls) <= limit, "the watch goes on while nothing runs and no engine runs in the folder"

    monkeypatch.setattr(progress.time, "sleep", sleep)
    return calls


def test_the_watch_ends_when_nothing_runs_and_no_engine_drives_the_folder(tmp_path, monkeypatch, capsys,
                                                                          tiny_model_dir):
    """Jobs wait (a targeted run finished, or no engine was started): the watch printed "0 running,
    7 waiting" forever (issue 51); it now prints once and says why it ends."""
    from minbert import cli

    monkeypatch.chdir(tmp_path)
    jobs = _plan(tmp_path, tiny_model_dir)
    for job in jobs.values():
        _job_file(tmp_path, job)
    calls = _sleeps(monkeypatch, limit=3)
    cli.main(["progress", "--watch", "0.01"])
    out = capsys.readouterr().out.splitlines()
    assert calls == [] and f"0 of {len(jobs)} jobs done, 0 running, {len(jobs)} waiting" in out[0]
    assert out[-1] == f"nothing is running and no engine (Snakemake, DVC) runs in this folder: {len(jobs)} job(s) " \
                      f"wait for the next run"


def test_the_watch_goes_on_while_an_engine_runs_in_the_folder(tmp_path, monkeypatch, capsys, tiny_model_dir):
    """An engine between two jobs holds no job's lock: the watch goes on while a Snakemake (or DVC)
    process runs in the folder, and ends once it has gone."""
    from minbert import cli
    from minbert.pipeline.lock import engines_in

    if engines_in(tmp_path) is None:
        pytest.skip("processes cannot be listed here (no /proc)")
    monkeypatch.chdir(tmp_path)
    _job_file(tmp_path, _plan(tmp_path, tiny_model_dir)["prepare"])
    fake = tmp_path / "bin" / "snakemake"         # what the process list shows: python .../bin/snakemake
    fake.parent.mkdir()
    fake.write_text("import time\ntime.sleep(120)\n")
    engine = subprocess.Popen([sys.executable, str(fake), "--cores", "1"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not engines_in(tmp_path / "results"):
            assert time.monotonic() < deadline and engine.poll() is None
            time.sleep(0.05)
        assert engines_in(tmp_path / "results") == [{"engine": "snakemake", "pid": engine.pid}]
        assert engines_in(tmp_path.parent / "elsewhere") == []

        def stop():
            engine.kill()
            engine.wait()

        calls = _sleeps(monkeypatch, limit=10, at=(3, stop))
        cli.main(["progress", "--watch", "0.01"])
    finally:
        engine.kill()
        engine.wait()
    out = capsys.readouterr().out
    assert len(calls) == 3 and out.count("0 of 1 jobs done, 0 running, 1 waiting") == 4
    assert out.splitlines()[-1].startswith("nothing is running and no engine (Snakemake, DVC) runs in this folder")


def test_the_time_left_prices_the_waiting_jobs_from_their_planned_work(tmp_path, monkeypatch, tiny_model_dir):
    """Five to twelve jobs waiting with "about 0:00:02 left" (issue 50): a waiting job with no run of
    its own is priced from its planned work (minbert.pipeline.estimate's price of its updates,
    evaluations and predictions over the prepared rows) at the speed the run's finished training
    showed; a job that runs no network at its start-up."""
    from minbert.pipeline.estimate import STARTUP

    monkeypatch.chdir(tmp_path)
    L = Layout("results")
    jobs = _plan(tmp_path, tiny_model_dir)
    wanted = ("prepare", "finetune@a", "finetune@b", "predict@a", "evaluate@a")
    desc = {j: _job_file(tmp_path, jobs[j]) for j in wanted}
    summary = tmp_path / L.data_summary
    summary.parent.mkdir(parents=True)
    rows = {"train": 240, "dev": 80, "test": 80}
    summary.write_text(json.dumps({"files": {f"{t}-{s}.tsv": {"rows_kept": n} for t in ("sst", "para", "sts")
                                             for s, n in rows.items()}}))
    _record(tmp_path, "prepare", None, desc["prepare"], seconds=3.0)
    time.sleep(0.05)
    _record(tmp_path, "finetune", "a", desc["finetune@a"], seconds=60.0)
    states = {s.id: s for s in progress.job_states(L)}
    assert {i for i, s in states.items() if s.status == "waiting"} == {"finetune b", "predict a", "evaluate a"}
    # b plans the very work a did (the same settings): a's time
    assert states["finetune b"].price == pytest.approx(60.0)
    scale = (60.0 - STARTUP) / states["finetune a"].work
    assert states["predict a"].price == pytest.approx(STARTUP + states["predict a"].work * scale)
    assert 0 < states["predict a"].work < states["finetune a"].work
    assert states["evaluate a"].price == STARTUP
    line = progress.summary(list(states.values()))[0]
    left = 60.0 + states["predict a"].price + STARTUP
    assert line == f"2 of 5 jobs done, 0 running, 3 waiting; about {progress._clock(left)} left"
    # no training seen yet: said, not counted as nothing
    (tmp_path / L.run_record("finetune", "a")).unlink()
    line = progress.summary(progress.job_states(L))[0]
    assert line.endswith("waiting; about 0:00:06 left (and 3 job(s) not priced: no training job has shown its "
                         "speed yet)")


def test_no_job_files_is_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert progress.summary(progress.job_states(Layout("results")))[0].startswith("no jobs")


def test_snakemakes_progress_lines_refuse_an_interval_they_cannot_sleep():
    """`--config progress=N` is a whole number; one too large to sleep killed the printing thread
    with a traceback on Snakemake's terminal: refused in one line before any thread starts (the
    Snakefile checks it with the same function while it reads its config)."""
    from minbert.core.errors import MinBertError

    with pytest.raises(MinBertError, match=r"^progress every 1000000000000000000000: expected a number of seconds "
                                           r"above 0 and at most 86400$"):
        progress.print_every(10**21)
    assert progress.interval(30, "--config progress=") == 30.0


def test_one_count_of_the_runs_jobs_as_each_finishes_then_the_runs_last_lines(tmp_path, monkeypatch, tiny_model_dir):
    """Snakemake's own count (quieted in profiles/default) counted the target rule as a step and ended
    at "25 of 26 steps (96%)", beside a count of every planned job, the export its run did not build
    included. The one count left is of the jobs the run was started for (their outputs), printed as
    each one finishes; the run ends on it, all done, then on the summary the report printed."""
    import io

    from minbert.pipeline.progress import print_every, run_end

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "POLL", 0.05)
    L = Layout("results")
    jobs = _plan(tmp_path, tiny_model_dir)
    descs = {i: _job_file(tmp_path, jobs[i]) for i in ("prepare", "finetune@a", "finetune@b", "report")}
    run = {o for i in ("prepare", "finetune@a", "report") for o in jobs[i].outputs}     # b: not this run's
    assert {s.id for s in progress.job_states(L, run)} == {"prepare", "finetune a", "report"}
    out = io.StringIO()
    printing = print_every(0, L, out, outputs=run)
    time.sleep(0.5)
    assert out.getvalue() == ""                                   # nothing finished yet: nothing said
    _record(tmp_path, "prepare", None, descs["prepare"])
    deadline = time.time() + 10
    while "1 of 3" not in out.getvalue() and time.time() < deadline:
        time.sleep(0.05)
    assert out.getvalue().splitlines()[0].startswith("[progress] 1 of 3 jobs done, 0 running, 2 waiting")
    log = tmp_path / L.log("report")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("wrote reports/final.html and 2 experiment page(s) in reports/experiments\nsummary:\n"
                   "  best model: a, dev overall score 0.612 [0.580, 0.641]\n  report: reports/final.html\n")
    end = io.StringIO()
    run_end(run, L, end, report_log=str(log), printing=printing)
    assert end.getvalue().splitlines() == ["[progress] 3 of 3 jobs done",
                                           "best model: a, dev overall score 0.612 [0.580, 0.641]",
                                           "report: reports/final.html"]
    said = out.getvalue()
    _record(tmp_path, "finetune", "a", descs["finetune@a"])
    time.sleep(0.3)
    assert out.getvalue() == said                                 # ended: the thread says no more
    end = io.StringIO()
    run_end({o for o in jobs["prepare"].outputs}, L, end, report_log=str(log))   # a run without the report
    assert end.getvalue().splitlines() == ["[progress] 1 of 1 jobs done"]
