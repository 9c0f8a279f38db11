"""Where a pipeline run stands, read from the files its jobs keep, whichever engine runs them (or
several at once): `minbert progress [--watch]`, and every few seconds on Snakemake's terminal.

- the run's jobs: the job files the engine's planner wrote (results/jobs/), each done (its run
  record holds the job file's description, and is newer than the records of the jobs it reads
  from, each done too), running (a process holds its lock: minbert.pipeline.lock) or waiting;
- each running job: who runs it and since when, and, for a training job, its phase, epoch and
  updates, their rate and the time left (progress.json in its state folder: minbert.core.progress);
- the time left of the run: the running jobs' own estimates and each waiting job's price, spread
  over the jobs that run at once. A waiting job is priced from its planned work, as `minbert
  estimate` prices it (minbert.pipeline.estimate: its updates, dev evaluations and predictions over
  the prepared rows, in passes of the encoder), at the speed this run's training jobs showed (their
  seconds per unit of planned work: those done, and those running by their own estimates); else by
  the wall time of its own last run; a job that runs no network by its start-up. A job that cannot
  be priced yet (no prepared data, no training job seen) is said;
- `watch`: the run printed every few seconds until nothing is left to do, or nothing runs and no
  engine runs in the folder (a targeted run finished, an engine stopped): waiting jobs then wait
  for a run that nobody started.

Nothing here writes: the jobs' logs and records are read as they are.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.progress import PROGRESS_FILE
from minbert.pipeline.lock import engines_in


@dataclass
class JobState:
    stage: str
    name: str | None
    status: str = "waiting"                  # done | running | waiting
    holder: dict = field(default_factory=dict)
    progress: dict = field(default_factory=dict)
    last_seconds: float | None = None        # the wall time of its last recorded run
    work: float | None = None                # its planned work (`planned_work`); None: not known
    price: float | None = None               # waiting: the seconds it will take (`_price`); None: not known

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
    from minbert.pipeline.job import Job

    root = Path(layout.job_files)
    for path in sorted(root.rglob("*.json")) if root.is_dir() else ():
        rel = path.relative_to(root)
        stage, name = (rel.parts[0], path.name[:-len(".json")]) if len(rel.parts) == 2 else (path.stem, None)
        try:
            yield Job.read(path, stage, name)
        except MinBertError:          # a file of another version or another job: not this run's
            continue


def job_states(layout: Layout = Layout(), outputs: set[str] | None = None) -> list[JobState]:
    """Every job of the run the job files describe, with its status (see the module docstring); with
    `outputs`, only the jobs that write one of them (the jobs an engine's run was started for)."""
    jobs = list(_jobs(layout))
    if outputs is not None:
        jobs = [job for job in jobs if not outputs.isdisjoint(job.outputs)]
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
    _price(jobs, states, layout)
    return states


# ---------------------------------------------------------------- what the waiting jobs cost

# the encoder's cost of one sentence: a training pass 1, a forward pass alone a third (its backward
# pass costs about twice its forward one); `minbert estimate` measures both, a running pipeline
# takes the scale from its own training jobs
UNIT = (0.0, 1.0), (0.0, 1 / 3)


def _rows(layout: Layout) -> dict[str, dict[str, int]] | None:
    """{split: {task: rows kept}} of the prepared data (its summary.json); None before prepare ran."""
    files = _json(Path(layout.data_summary)).get("files")
    if not isinstance(files, dict):
        return None
    rows: dict[str, dict[str, int]] = {"train": {}, "dev": {}, "test": {}}
    for name, info in files.items():
        task, _, split = str(name).removesuffix(".tsv").rpartition("-")
        if split in rows and isinstance(info, dict) and isinstance(info.get("rows_kept"), int):
            rows[split][task] = info["rows_kept"]
    return rows


def planned_work(job, rows: dict[str, dict[str, int]] | None) -> float | None:
    """A job's planned work, priced as `minbert estimate` prices it (minbert.pipeline.estimate.
    network_seconds) at a unit cost per sentence (`UNIT`): its training updates and dev evaluations,
    a pretraining's steps and dev passes, the predictions' forward passes over the prepared `rows`;
    0 for a job that runs no network; None when it does and the rows are not known."""
    from minbert.pipeline.estimate import StepCost, network_seconds, runs_network

    if not runs_network(job):
        return 0.0
    if rows is None:
        return None
    return network_seconds(job, rows, StepCost(*UNIT))[0]


_WORK: dict[tuple, float | None] = {}


def _price(jobs: list, states: list[JobState], layout: Layout) -> None:
    """Each waiting job's price (see the module docstring), from the speed the run's training jobs
    showed: their seconds (less the start-up) per unit of planned work."""
    from minbert.pipeline.estimate import STARTUP

    rows = _rows(layout)
    for job, state in zip(jobs, states, strict=True):
        key = (job.stage, json.dumps(job.settings, sort_keys=True, default=str), json.dumps(rows, sort_keys=True))
        if key not in _WORK:          # a watch prices the same jobs every few seconds
            try:
                _WORK[key] = planned_work(job, rows)
            except (ValueError, KeyError, TypeError, ArithmeticError):   # settings of another version
                _WORK[key] = None
        state.work = _WORK[key]
    seen = []
    for s in states:
        taken = s.last_seconds if s.status == "done" else \
            (_since(s.holder.get("started")) or 0) + s.progress["seconds_left"] if "seconds_left" in s.progress else None
        if s.work and isinstance(taken, (int, float)):
            seen.append((max(taken - STARTUP, 0.0), s.work))
    scale = sum(t for t, _ in seen) / sum(w for _, w in seen) if seen else None
    for s in states:
        if s.status != "waiting":
            continue
        if s.work == 0:
            s.price = s.last_seconds if s.last_seconds is not None else STARTUP
        elif s.work is not None and scale is not None:
            s.price = STARTUP + s.work * scale
        else:
            s.price = s.last_seconds


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
    known = [s.price for s in waiting if s.price is not None]
    head = f"{len(done)} of {len(states)} jobs done, {len(running)} running, {len(waiting)} waiting"
    if running or waiting:
        estimate = max(left, default=0.0) + sum(known) / max(1, len(running))
        unknown = len(waiting) - len(known)
        why = "no prepared data yet" if any(s.work is None and s.price is None for s in waiting) else \
            "no training job has shown its speed yet"
        head += f"; about {_clock(estimate)} left" + (f" (and {unknown} job(s) not priced: {why})" if unknown else "")
    return [head] + ["  " + job_line(s) for s in running]


def render(layout: Layout = Layout()) -> str:
    return "\n".join(summary(job_states(layout)))


MAX_INTERVAL = 86_400.0      # a day: what a watch may sleep between prints


def interval(value, what: str) -> float:
    """A number of seconds between prints, given by a user: a finite number above 0 and at most a
    day; a one-line error naming `what` (`--watch `) otherwise (NaN passed a `<= 0` check, and sleeping NaN or
    1e300 seconds is a traceback)."""
    seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_INTERVAL):
        shown = format(value, "g") if isinstance(value, float) else value
        raise MinBertError(f"{what}{shown}: expected a number of seconds above 0 and at most {MAX_INTERVAL:g}")
    return seconds


def watch(seconds: float, layout: Layout = Layout(), out=None) -> str:
    """Print the run every `seconds` until every job is done, or nothing runs and no engine runs in
    the folder (minbert.pipeline.lock.engines_in; where processes cannot be listed, once nothing
    runs). Returns why it ended, which it prints last."""

    stream = out or sys.stdout
    while True:
        states = job_states(layout)
        stamp = time.strftime("%H:%M:%S")
        print("\n".join(f"{stamp} {line}" if k == 0 else line for k, line in enumerate(summary(states))),
              file=stream, flush=True)
        if all(s.status == "done" for s in states):
            return ""
        if not any(s.status == "running" for s in states) and not engines_in(layout.results):
            waiting = sum(s.status == "waiting" for s in states)
            why = (f"nothing is running and no engine (Snakemake, DVC) runs in this folder: {waiting} job(s) wait "
                   f"for the next run")
            print(why, file=stream, flush=True)
            return why
        time.sleep(seconds)


def print_every(seconds: float, layout: Layout = Layout(), out=None,
                outputs: set[str] | None = None) -> Printing:
    """Print the run's progress from a thread of the calling process (Snakemake's: its terminal, never
    a job's log) while jobs run: its counts each time a job finishes (Snakemake's own count is
    quieted, profiles/default: one count, of the jobs this run was started for, `outputs`), and every
    `seconds` (0: never) the counts with each running job. Returns what stops it (`run_end`)."""
    seconds = interval(seconds, "progress every ") if seconds else 0.0
    stream = out or sys.stderr      # the terminal's, taken now: a job run in-process redirects sys.stderr to its log
    poll = min(seconds, POLL) if seconds else POLL
    ended = Printing()

    def loop():
        done, last = None, time.monotonic()
        while not ended.is_set():
            states = job_states(layout, outputs)
            now_done = sum(s.status == "done" for s in states)
            lines = summary(states)
            if ended.is_set():
                return
            if seconds and time.monotonic() - last >= seconds and any(s.status == "running" for s in states):
                print("\n".join(["[progress] " + lines[0], *lines[1:]]), file=stream, flush=True)
                last, ended.last = time.monotonic(), lines[0]
            elif done is not None and now_done != done:
                print("[progress] " + lines[0], file=stream, flush=True)
                ended.last = lines[0]
            done = now_done
            ended.wait(poll)

    threading.Thread(target=loop, name="minbert-progress", daemon=True).start()
    return ended


POLL = 2.0      # seconds between looks at the run's files: a finished job is counted within them


class Printing(threading.Event):
    """Set: the progress thread prints no more. `last`: the count it printed last."""
    last = ""


def run_end(outputs: set[str], layout: Layout | None = None, out=None, report_log: str | None = None,
            header: str = "summary:", printing: Printing | None = None) -> None:
    """What a successful run ends on: the count of its jobs, all done, and, when the run rendered the
    report (`report_log`, the report job's log), the summary it printed after `header` (the best
    model, its scores, the claims, where the report is). `printing`: the progress thread to stop
    first (`print_every`)."""
    if printing is not None:
        printing.set()
    stream = out or sys.stderr
    jobs = job_states(layout or Layout(), outputs)
    count = f"{len(jobs)} of {len(jobs)} jobs done"
    if printing is None or not printing.last.startswith(count + ","):      # not said already
        print(f"[progress] {count}", file=stream, flush=True)
    if report_log is None or not any(s.stage == "report" for s in jobs):
        return
    try:
        lines = Path(report_log).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    if header in lines:
        at = len(lines) - 1 - lines[::-1].index(header)
        print("\n".join(line.strip() for line in lines[at + 1:] if line.startswith("  ")), file=stream, flush=True)
