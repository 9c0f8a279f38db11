"""A job's finished work: outputs that come out of a new run byte for byte as the last finished run
wrote them keep that run's dates, so an engine that judges by date (Snakemake after DVC made the
outputs) runs nothing after a job whose outputs did not change; changed outputs get new dates."""
from __future__ import annotations

import os

from minbert.pipeline.job import Job
from minbert.pipeline.runinfo import running

OLD = 1_000_000_000 * 10**9          # 2001, in nanoseconds


def write_outputs(b_text: str) -> None:
    os.makedirs("results/data", exist_ok=True)
    with open("results/data/a.tsv", "w") as f:
        f.write("id\tsentence\n1\tthe same\n")
    with open("results/data/b.tsv", "w") as f:
        f.write(b_text)
    with open("results/summary.json", "w") as f:
        f.write('{"rows": 1}\n')


def run_job(job: Job, b_text: str) -> None:
    with running(job, force=True):
        write_outputs(b_text)


def test_outputs_that_come_out_the_same_keep_their_dates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = Job("prepare", None, {"setting": 1}, reads=[], outs=["results/data", "results/summary.json"],
              run_record="results/runs/prepare.json", code_roots=["minbert.core.io"])
    run_job(job, "b first\n")
    for path in ("results/data/a.tsv", "results/data/b.tsv", "results/summary.json", "results/data"):
        os.utime(path, ns=(OLD, OLD))           # as if made long ago
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
