"""Where a pipeline run stands, read from the files its jobs keep, whichever engine runs them (or
several at once): `minbert progress [--watch]`, and every few seconds on Snakemake's terminal.

- the run's jobs: the job files the engine's planner wrote (results/jobs/), each done (its run
  record holds the job file's description, and is newer than the records of the jobs it reads
  from, each done too), running (a process holds its lock: minbert.pipeline.lock) or waiting;
- each running job: who runs it and since when, and, for a training job, its phase, epoch and
  updates, their rate and the time left (progress.json in its state folder: minbert.core.progress);
- the time left of the run: the running jobs' own estimates and the waiting jobs' last recorded
  wall times, spread over the jobs that run at once.

Nothing here writes: the jobs' logs and records are read as they are.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.layout import Layout
from minbert.core.progress import PROGRESS_FILE


@dataclass
class JobState:
    stage: str
    name: str | None
    status: str = "waiting"                  # done | running | waiting
    holder: dict = field(default_factory=dict)
    progress: dict = field(default_factory=dict)
    last_seconds: float | None = None        # the wall time of its last recorded run

    @property
    def id(self) -> str:
        return self.stage if self.name is None else f"{self.stage} {self.name}"


def _json(path: Path) -> dict:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(holder: dict) -> bool:
    """Whether the process a lock file names runs (on this machine; on another, its word is taken)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    if holder.get("host") not in (None, socket.gethostname()):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _jobs(layout: Layout):
    """The jobs of the job files under the layout's jobs folder (minbert.pipeline.job.Job.read)."""
    from minbert.core.errors import MinBertError
    from minbert.pipeline.job import Job

    root = Path(layout.job_files)
    for path in sorted(root.rglob("*.json")) if root.is_dir() else ():
        rel = path.relative_to(root)
        stage, name = (rel.parts[0], path.name[:-len(".json")]) if len(rel.parts) == 2 else (path.stem, None)
        try:
            yield Job.read(path, stage, name)
        except MinBertError:          # a file of another version or another job: not this run's
            continue


def job_states(layout: Layout = Layout()) -> list[JobState]:
    """Every job of the run the job files describe, with its status (see the module docstring)."""
    jobs = list(_jobs(layout))
    maker = {o: i for i, job in enumerate(jobs) for o in job.outputs}
    records = [_json(Path(job.run_record)) if job.run_record else {} for job in jobs]
    recorded = [_mtime(Path(job.run_record)) if job.run_record else None for job in jobs]
    states = [JobState(job.stage, job.name, last_seconds=records[i].get("wall_seconds")) for i, job in enumerate(jobs)]
    done: dict[int, bool] = {}

    def is_done(i: int, path: tuple = ()) -> bool:
        """Its last run was of this description, after every job it reads from, each done too."""
        if i not in done:
            # the record's description with what it adds of the run (the inputs' hashes, where it ran)
            ran = {k: v for k, v in (records[i].get("description") or {}).items() if k not in ("read_hashes", "runtime")}
            upstream = {maker[d] for d in jobs[i].deps if d in maker} - {i} - set(path)
            done[i] = states[i].status != "running" and bool(ran) and ran == jobs[i].description() and all(
                is_done(j, path + (i,)) and (recorded[j] or 0) <= (recorded[i] or 0) for j in upstream)
        return done[i]

    for state in states:
        holder = _json(Path(layout.lock(state.stage, state.name)))
        if holder and _alive(holder):
            state.status, state.holder = "running", holder
            progress = _json(Path(layout.state(state.stage, state.name)) / PROGRESS_FILE)
            if progress.get("pid") == holder.get("pid"):
                state.progress = progress
    for i, state in enumerate(states):
        if state.status != "running" and is_done(i):
            state.status = "done"
    return states


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(max(seconds, 0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _since(started: str | None) -> float | None:
    try:
        return time.time() - dt.datetime.fromisoformat(started).timestamp()
    except (TypeError, ValueError):
        return None


def job_line(s: JobState) -> str:
    """A running job in one line: what, who, how long, and where a training job is."""
    line = f"{s.id}: {s.holder.get('engine', '?')} pid {s.holder.get('pid', '?')}, {_clock(_since(s.holder.get('started')))}"
    p = s.progress
    if p:
        phase = f"{p['phase']}, " if p.get("phases", 1) > 1 else ""
        rate = p.get("updates_per_second")
        line += (f", {phase}epoch {p.get('epoch')}/{p.get('epochs')} update {p.get('epoch_update')}/"
                 f"{p.get('epoch_updates')} ({p.get('update')}/{p.get('updates')} in all)"
                 f", {rate:.2f} upd/s" if rate else "")
        line += f", ETA {_clock(p.get('seconds_left'))}"
        if time.time() - p.get("updated", 0) > 120:
            line += f" (as of {_clock(time.time() - p['updated'])} ago: evaluating or saving)"
    return line


def summary(states: list[JobState]) -> list[str]:
    """The run in a few lines: the counts, the time left, each running job."""
    if not states:
        return ["no jobs: the job files (results/jobs/) are written when an engine plans the run"]
    done = [s for s in states if s.status == "done"]
    running = [s for s in states if s.status == "running"]
    waiting = [s for s in states if s.status == "waiting"]
    left = [s.progress.get("seconds_left") for s in running if s.progress.get("seconds_left") is not None]
    known = [s.last_seconds for s in waiting if s.last_seconds is not None]
    head = f"{len(done)} of {len(states)} jobs done, {len(running)} running, {len(waiting)} waiting"
    if running or waiting:
        estimate = max(left, default=0.0) + sum(known) / max(1, len(running))
        unknown = len(waiting) - len(known)
        head += f"; about {_clock(estimate)} left" + (f" (and {unknown} job(s) with no earlier run to go by)"
                                                      if unknown else "")
    return [head] + ["  " + job_line(s) for s in running]


def render(layout: Layout = Layout()) -> str:
    return "\n".join(summary(job_states(layout)))


def print_every(seconds: float, layout: Layout = Layout(), out=None) -> None:
    """Print the run's progress (its counts and each running job) every `seconds`, from a thread
    of the calling process (Snakemake's: its terminal, never a job's log), while jobs run."""
    import sys
    import threading

    stream = out or sys.stderr      # the terminal's, taken now: a job run in-process redirects sys.stderr to its log

    def loop():
        while True:
            time.sleep(seconds)
            states = job_states(layout)
            if any(s.status == "running" for s in states):
                lines = summary(states)
                print("\n".join(["[progress] " + lines[0], *lines[1:]]), file=stream, flush=True)

    threading.Thread(target=loop, name="minbert-progress", daemon=True).start()
