"""A job's finished work, recorded by content (minbert.pipeline.finished) and what a run does with
it (minbert.pipeline.runinfo): outputs that come out of a new run byte for byte as the files they
replace keep those files' dates (none in place: as the last finished run wrote them, its dates); a run by hand, or one that waited for another
process running the job, has nothing to run only when every output is, hashed again, what that run
wrote; an output edited in place, a forced run or a job an engine starts always runs; no second
name of an output is kept (deleting it gives its disk back), and what a plan no longer has is
pruned. Jobs here are small hand-made ones: no model, no engine."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from minbert.core.layout import Layout
from minbert.pipeline import finished
from minbert.pipeline.job import Job
from minbert.pipeline.runinfo import UpToDate, running

OLD = 1_000_000_000 * 10**9          # 2001, in nanoseconds


def _job(results: str = "results") -> Job:
    return Job("prepare", None, {"setting": 1}, reads={}, writes={"data": [f"{results}/data"],
                                                                  "summary": [f"{results}/summary.json"]},
               run_record=f"{results}/runs/prepare.json", results=results, code_roots=["minbert.core.io"])


def write_outputs(b_text: str, results: str = "results") -> None:
    os.makedirs(f"{results}/data", exist_ok=True)
    with open(f"{results}/data/a.tsv", "w") as f:
        f.write("id\tsentence\n1\tthe same\n")
    with open(f"{results}/data/b.tsv", "w") as f:
        f.write(b_text)
    with open(f"{results}/summary.json", "w") as f:
        f.write('{"rows": 1}\n')


def run_job(job: Job, b_text: str, force: bool = True) -> bool:
    """Run the job's body (writing its outputs); False when it had nothing to run."""
    try:
        with running(job, force=force):
            write_outputs(b_text, job.results)
    except UpToDate:
        return False
    return True


def test_outputs_that_come_out_the_same_keep_their_dates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = _job()
    run_job(job, "b first\n")
    for path in ("results/data/a.tsv", "results/data/b.tsv", "results/summary.json", "results/data"):
        os.utime(path, ns=(OLD, OLD))           # as if made long ago
    os.unlink(Layout().finished("prepare"))                      # recorded anew with these dates
    finished.record(job, json.loads(open("results/runs/prepare.json").read())["fingerprint"])
    run_job(job, "b changed\n")
    dates = {p: os.stat(p).st_mtime_ns for p in
             ("results/data/a.tsv", "results/data/b.tsv", "results/summary.json", "results/data")}
    assert dates["results/data/a.tsv"] == OLD and dates["results/summary.json"] == OLD
    assert dates["results/data/b.tsv"] > OLD          # new content, new date
    assert dates["results/data"] > OLD                # a folder with a changed file is changed
    # all the same: every file and the folder keep the dates they had
    run_job(job, "b changed\n")
    assert {p: os.stat(p).st_mtime_ns for p in dates} == dates
    # the run record is new at every run
    assert os.stat("results/runs/prepare.json").st_mtime_ns > OLD


def test_an_output_that_comes_out_as_the_file_it_replaced_keeps_that_files_date(tmp_path, monkeypatch):
    """DVC restored an earlier run's outputs from its cache (the earlier content, the cache's older
    date) after the last run wrote others: a run that writes the restored content again gives each
    file the date of the file it replaced, not the last run's, so what reads it (older than the last
    run, newer than the restored file) is not taken as out of date; where nothing was in place, the
    last run's dates as before."""
    monkeypatch.chdir(tmp_path)
    job = _job()
    run_job(job, "b first\n")
    restored = {p: open(p).read() for p in ("results/data/a.tsv", "results/data/b.tsv", "results/summary.json")}
    time.sleep(0.01)
    run_job(job, "b second\n")                    # the last run: b.tsv of other content, a new date
    last_b = os.stat("results/data/b.tsv").st_mtime_ns
    for path, text in restored.items():           # DVC's restore of the first run's files, dated long ago
        with open(path, "w") as f:
            f.write(text)
        os.utime(path, ns=(OLD, OLD))
    run_job(job, "b first\n")
    assert {p: os.stat(p).st_mtime_ns for p in restored} == dict.fromkeys(restored, OLD)
    os.unlink("results/data/b.tsv")                # none in place: the last run's date, where its content is
    run_job(job, "b first\n")
    assert os.stat("results/data/b.tsv").st_mtime_ns == OLD and last_b > OLD


def test_a_hand_run_keeps_outputs_only_as_their_run_wrote_them(tmp_path, monkeypatch):
    """Issue 37: kept outputs were hard links, so an output edited in place changed its kept copy
    too and the next run "restored" the edited file as up to date. Now a run by hand has nothing to
    run only when every output, hashed again, is what the last finished run wrote; an edit in place
    (same file, same size and date), a replaced or a removed output runs the job; --force always
    runs it; and no second name of an output is kept."""
    monkeypatch.chdir(tmp_path)
    job = _job()
    assert run_job(job, "b first\n", force=False)
    assert not run_job(job, "b first\n", force=False)            # up to date: nothing ran
    b = "results/data/b.tsv"
    st = os.stat(b)
    with open(b, "r+") as f:                                      # in place: same inode, same size
        f.write("B")
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))              # and the date it had
    assert os.stat(b).st_ino == st.st_ino
    assert run_job(job, "b first\n", force=False)                # runs: its output is not what was written
    assert open(b).read() == "b first\n"
    assert not run_job(job, "b first\n", force=False)
    os.unlink("results/summary.json")                             # an output removed: runs again
    assert run_job(job, "b first\n", force=False)
    assert run_job(job, "b first\n", force=True)                  # forced: always runs
    # nothing but records under results/finished: every output has one name, so removing it frees its disk
    assert all(p.suffix == ".json" and p.is_file() for p in (tmp_path / "results/finished").rglob("*"))
    assert all(os.stat(p).st_nlink == 1 for p in ("results/data/a.tsv", b, "results/summary.json"))


def test_a_job_an_engine_starts_always_runs(tmp_path, monkeypatch):
    """An engine runs a job because it judged it stale or was told to (snakemake --forcerun, dvc
    repro -f): the stage runs it even when its outputs are in place, as its last run wrote them."""
    monkeypatch.chdir(tmp_path)
    job = _job()
    assert run_job(job, "b\n", force=False)
    monkeypatch.setenv("DVC_STAGE", "prepare")                    # as DVC starts a stage
    assert run_job(job, "b\n", force=False)


def test_a_job_that_waited_keeps_what_its_holder_finished(tmp_path, monkeypatch):
    """The same job started by an engine while another process runs it waits, then finds the
    holder's outputs made for its fingerprint, checks them by content and has nothing to run; had
    the holder's outputs been changed since, it would run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "prepare")
    job = _job()
    started, go = threading.Event(), threading.Event()

    def holder():
        with running(job, force=True):
            started.set()
            go.wait(60)
            write_outputs("holder's\n")

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert started.wait(60)
        threading.Timer(1.0, go.set).start()          # the holder finishes while the second one waits
        with pytest.raises(UpToDate, match="finished by the process it waited for"):
            with running(job):
                raise AssertionError("ran although the holder finished it")
    finally:
        go.set()
        thread.join(60)
    assert open("results/data/b.tsv").read() == "holder's\n"


def test_one_results_folder_named_two_ways_is_one_job(tmp_path, monkeypatch):
    """Paths under the results folder are described relative to it: `--results results` and
    `--results $PWD/results` give one description and one fingerprint."""
    monkeypatch.chdir(tmp_path)
    write_outputs("b\n")
    rel = Job.build("evaluate", "a", {"predicts": ["sst"]}, Layout("results"))
    absolute = Job.build("evaluate", "a", {"predicts": ["sst"]}, Layout(str(tmp_path / "results")))
    assert rel.read_paths != absolute.read_paths
    assert rel.description() == absolute.description()
    assert rel.runtime_description() == absolute.runtime_description()
    assert rel.description()["reads"]["splits"][0] == "<results>/data/sst-dev.tsv"


def test_prune_removes_old_records_and_hard_link_folders(tmp_path, monkeypatch):
    """The records of jobs a plan no longer has go, and so does every folder of hard links an
    earlier version kept (results/finished/<stage>/<name>/ with finished.json), which held the disk
    of outputs long deleted."""
    monkeypatch.chdir(tmp_path)
    job = _job()
    run_job(job, "b\n")
    legacy = tmp_path / "results/finished/finetune/gone"
    legacy.mkdir(parents=True)
    (legacy / "0").write_bytes(b"x" * 1000)
    (legacy / "finished.json").write_text("{}")
    stale = tmp_path / "results/finished/evaluate/removed.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    removed = finished.prune("results", [job])
    assert {str(p) for p in removed} == {"results/finished/finetune/gone", "results/finished/evaluate/removed.json"}
    assert not legacy.exists() and not stale.exists()
    assert (tmp_path / Layout().finished("prepare")).is_file()


def test_checking_a_bert_base_sized_output_takes_about_a_second(tmp_path, monkeypatch):
    """The check before trusting kept outputs hashes every output again: cheap enough for a
    bert-base checkpoint (440 MB; measured here on a 64 MB file, scaled)."""
    monkeypatch.chdir(tmp_path)
    job = Job("finetune", "a", {}, reads={}, writes={"model": ["results/model.pt"]},
              run_record="results/runs/finetune/a.json", code_roots=["minbert.core.io"])
    os.makedirs("results/runs/finetune")
    with open("results/model.pt", "wb") as f:
        f.write(os.urandom(64 << 20))
    with open(job.run_record, "w") as f:
        f.write("{}")
    finished.record(job, "f")
    from minbert.core import provenance

    provenance._HASHES.clear()
    t0 = time.perf_counter()
    assert finished.in_place(job, "f")
    per_440_mb = (time.perf_counter() - t0) * 440 / 64
    assert per_440_mb < 10, f"{per_440_mb:.1f} s for 440 MB"


def test_an_earlier_run_restored_as_it_was_is_in_place_under_its_own_fingerprint(tmp_path, monkeypatch):
    """A setting tried, then undone: DVC restores the earlier run's outputs and run record from its
    cache, while the record of finished work last said the tried run's. The earlier run is still in
    place by its own fingerprint (the record keeps a few runs), not the tried one's; an acceptance
    made for it is found again; outputs that are neither run's are in place under none."""
    from minbert.pipeline import finished

    monkeypatch.chdir(tmp_path)
    job = _job()
    os.makedirs("results/runs", exist_ok=True)

    def write_outputs(b_text):                                 # the outputs and the run record of a run
        globals()["write_outputs"](b_text)
        with open("results/runs/prepare.json", "w") as f:
            f.write(json.dumps({"b": b_text}))
    write_outputs("b first\n")
    finished.record(job, "first-run")
    write_outputs("b tried\n")
    finished.record(job, "tried-run")
    assert finished.in_place(job, "tried-run") and not finished.in_place(job, "first-run")
    write_outputs("b first\n")                                   # the first run's outputs, restored
    assert finished.in_place(job, "first-run") and not finished.in_place(job, "tried-run")
    finished.accept(job, "first-run", "first-run-accepted", {"code": {"x.py": "1"}})
    assert finished.in_place(job, "first-run-accepted")
    assert finished.accepted(job, "first-run") == {"code": {"x.py": "1"}}
    write_outputs("b tried\n")                                   # the tried run's, back again
    assert finished.in_place(job, "tried-run") and not finished.in_place(job, "first-run-accepted")
    write_outputs("b edited by hand\n")
    assert not any(finished.in_place(job, f) for f in ("first-run", "tried-run", "first-run-accepted"))
