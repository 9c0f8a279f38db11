"""Accepting a reviewed edit that changes nothing computed: `minbert accept-code [JOB...]`.

A job's description holds the code it runs (minbert.pipeline.code), so any real edit of that code (a
renamed local variable, a lint fix) re-describes the job and both engines run it again. After such
an edit has been reviewed, `accept-code` keeps the finished work instead, as `dvc commit` accepts a
changed dependency: for each job whose last run had the settings, inputs, sources and runtime of
its description now, and whose outputs are in place as that run wrote them, the code now is recorded
as that run's (minbert.pipeline.finished.accept: a new fingerprint for the outputs in place), its job
file is written again with the date of that run (Snakemake takes it as older than the outputs:
minbert.pipeline.plan.write_job_file), and in a DVC project dvc.lock records the new job files
(`dvc commit` of the `resolve` stage and of each accepted job's, the outputs' dates kept). A job
whose settings or inputs changed is refused in one line: its outputs would not be what it computes.

It is the user's word that the edit computes the same: nothing here can check it (running the job
is the check). Use it for a rename, a comment-free refactor, a lint fix; never for an edit that
may change a number (a changed default, a fixed bug, another library version): run those.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.provenance import canonical, describe_change, fingerprint_of, one_pass
from minbert.params.load import load_params
from minbert.pipeline import finished
from minbert.pipeline.job import REPORTS_MARK, RESULTS_MARK, Job
from minbert.pipeline.plan import ACCEPTED, last_run, pipeline, write_job_file

RESOLVE_STAGE = "resolve"     # dvc.yaml's first stage, which writes the job files (workflow/dvc.py)


@dataclass
class Verdict:
    job: Job
    status: str               # accepted | refused | current (nothing to accept) | never (no finished run)
    why: str                  # what was accepted, or why not


def judge(job: Job) -> Verdict:
    """Whether `job`'s last run can be taken as the run of its description now (only its code
    differs), and why not."""
    last = last_run(job)
    if last is None:
        return Verdict(job, "never", "has no finished run to accept (run it)")
    now = job.description()
    if canonical(last.description) == canonical(now):
        return Verdict(job, "current", "is up to date (nothing to accept)")
    marks = {RESULTS_MARK: job.results, REPORTS_MARK: job.reports}
    old = {k: v for k, v in last.description.items() if k not in ACCEPTED}
    new = {k: v for k, v in now.items() if k not in ACCEPTED}
    if canonical(old) != canonical(new):
        return Verdict(job, "refused", f"its settings or inputs changed ({describe_change(old, new, 2, marks)}); run it")
    changed = last.changed_reads(job)
    if changed:
        return Verdict(job, "refused", f"input {changed[0].replace(RESULTS_MARK, job.results)} changed since its last "
                                   f"run; run it")
    if not finished.in_place(job, fingerprint_of(last.recorded)):
        return Verdict(job, "refused", "its outputs are not those its last run wrote (edited, removed or never "
                                   "recorded); run it")
    code = describe_change({"code": last.description.get("code")}, {"code": now.get("code")}, 2)
    return Verdict(job, "accepted", code)


def accept(job: Job) -> None:
    """Record the code of `job`'s description as its last run's (`judge` said it may be)."""
    last = last_run(job)
    code = {k: job.description()[k] for k in ACCEPTED if k in job.description()}
    finished.accept(job, last.run_fingerprint, fingerprint_of({**last.recorded, **code}), code)
    write_job_file(job)


def accept_code(params: str | Path = "params.yaml", names: list[str] = (), layout: Layout = Layout()) -> list[str]:
    """`minbert accept-code`: accept the code of the jobs named (default: every job with a finished
    run whose description changed); one line per job. A named job that cannot be accepted is an
    error (nothing is accepted then); unnamed, it is said and left to run."""
    lp = load_params(params)
    with lp.registry.active(), one_pass():
        jobs = pipeline(lp, layout)
        by_id = {j.id: j for j in jobs}
        unknown = [n for n in names if n not in by_id]
        if unknown:
            raise MinBertError(f"accept-code: no job '{unknown[0]}' in {params} (jobs are named stage@name, e.g. "
                               f"{next((j.id for j in jobs if j.name), 'prepare')}; `python -m workflow.dag` lists them)")
        verdicts = [judge(by_id[n]) for n in dict.fromkeys(names)] if names else [judge(j) for j in jobs]
        refused = [v for v in verdicts if v.status == "refused" or (names and v.status == "never")]
        if names and refused:
            raise MinBertError(f"accept-code: {refused[0].job.id} {refused[0].why}")
        taken = [v for v in verdicts if v.status == "accepted"]
        for v in taken:
            accept(v.job)
    lines = [f"accepted {v.job.id}: {v.why}" for v in taken]
    lines += [f"{v.job.id} {v.why}" for v in verdicts if names and v.status == "current"]
    lines += [f"not accepted {v.job.id}: {v.why}" for v in refused]
    behind = [v.job for v in verdicts if v.status == "current" and lock_behind(v.job)] if dvc_project() else []
    if (taken or behind) and dvc_project():      # a current job whose job file dvc.lock has not: an edit undone
        done = [v.job for v in taken] + behind
        lines.append(dvc_commit([RESOLVE_STAGE, *(dvc_stage(j) for j in done)], done))
    return lines or ["accept-code: nothing to accept (no finished job of the params was re-described)"]


# ---------------------------------------------------------------- DVC

def dvc_stage(job: Job) -> str:
    """The job's stage in dvc.yaml."""
    return job.id.replace("@", "-")


def dvc_project(folder: str | Path = ".") -> bool:
    """A DVC project whose lock records runs (dvc.yaml, dvc.lock and .dvc/ here)."""
    folder = Path(folder)
    return all((folder / p).exists() for p in ("dvc.yaml", "dvc.lock", ".dvc"))


def lock_behind(job: Job, repo: str | Path = ".") -> bool:
    """Whether dvc.lock records another job file for the job's stage than the one in place (the job
    is current: an accepted edit undone leaves dvc.lock with the accepted file)."""
    try:
        lock = _lock(Path(repo) / "dvc.lock")
        deps = (lock.get("stages") or {}).get(dvc_stage(job), {}).get("deps") or []
        recorded = next((d.get("md5") for d in deps if d.get("path") == job.job_file), None)
        return recorded is not None and recorded != hashlib.md5((Path(repo) / job.job_file).read_bytes()).hexdigest()
    except (OSError, ValueError, AttributeError):
        return False


_LOCKS: dict[tuple[str, float], dict] = {}


def _lock(path: Path) -> dict:
    """dvc.lock, read once per date."""
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _LOCKS:
        _LOCKS.clear()
        _LOCKS[key] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return _LOCKS[key]


def dvc_commit(stages: list[str], jobs: list[Job], repo: str | Path = ".") -> str:
    """Record `stages` in dvc.lock as they are (`dvc commit --force STAGE...`), the dates of the jobs'
    outputs and job files kept: DVC re-links committed files into the workspace, which would make
    them look newer to Snakemake than the jobs that read them."""
    if shutil.which("dvc") is None:
        raise MinBertError("accept-code: this is a DVC project and the `dvc` command is not installed; install "
                           "the workflow extra (pip install -e '.[workflow]') and run accept-code again")
    repo = Path(repo)
    times = {}
    for job in jobs:
        for out in job.outputs + [job.job_file]:
            path = repo / out
            for p in ([path] + sorted(path.rglob("*")) if path.is_dir() else [path]):
                if p.exists():
                    st = p.stat()
                    times[p] = (st.st_atime_ns, st.st_mtime_ns)
    done = subprocess.run(["dvc", "commit", "--force", "--quiet", *stages], cwd=repo, capture_output=True, text=True)
    for p in sorted(times, key=lambda q: len(q.parts), reverse=True):   # files before their folders
        if p.exists():
            os.utime(p, ns=times[p], follow_symlinks=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise MinBertError(f"accept-code: dvc commit failed ({last[:300]}); the acceptance is recorded for Snakemake "
                           f"and hand runs: run `dvc commit --force {' '.join(stages)}` once DVC works")
    return f"recorded in dvc.lock: {', '.join(stages)}"


__all__ = ["accept_code", "judge"]
