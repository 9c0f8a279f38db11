"""The pipeline's jobs (minbert.pipeline.job), planned from the stage specs
(minbert.pipeline.stage_specs): each stage's jobs in a params file, what each reads and writes, and
which job's output each read is.

Who uses it:
- Snakemake and DVC (workflow/dag.py): each job depends on its job file
  (results/jobs/<stage>/<name>.json, rewritten only when it changes: `write_job_file`) and on the
  outputs it reads; so a job re-runs exactly when its settings, inputs or code change;
- a stage run by hand (without `--job`) plans its own job alone (`job_for`);
- run records (results/runs/...): the description and fingerprint of what ran.
Planning is linear in the number of jobs: every lookup is by path, never a scan of all outputs.
The planner is in no job's code (minbert.pipeline.code.NOT_JOB_CODE): what it decides for a job is
the job's description itself, which its fingerprint covers.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import TEMP_SUFFIX, read_input
from minbert.core.layout import Layout
from minbert.core.provenance import canonical, path_hash
from minbert.params.catalogue import LoadedParams
from minbert.params.load import load_params
from minbert.params.messages import close
from minbert.pipeline import finished
from minbert.pipeline.job import Job, refuse_inputs_inside_outputs
from minbert.pipeline.stage_specs import STAGES

# ---------------------------------------------------------------- the jobs of a params file


def pipeline(params: str | Path | LoadedParams = "params.yaml", layout: Layout = Layout()) -> list[Job]:
    """Every job, in an order where each comes after the jobs whose outputs it reads."""
    lp = params if isinstance(params, LoadedParams) else load_params(params)
    by_name: dict[tuple, list[Job]] = {}        # an experiment's jobs together, in the stage specs' order
    with lp.registry.active():                  # the params' own tasks, losses and heads
        for spec in STAGES.values():
            for name in spec.names(lp):
                job = Job.build(spec.name, name, spec.settings(lp, name), layout)
                by_name.setdefault((spec.name,) if name is None else (spec.what, name), []).append(job)
        jobs = [j for group in by_name.values() for j in group]
        for job in jobs:
            if job.spec.gathers is not None:
                job.reads = gathered(job, jobs)
        for job in jobs:    # an engine deletes a job's outputs before it runs: refuse before any engine starts
            refuse_inputs_inside_outputs(job)
        return _link(jobs)


def gathered(job: Job, jobs: list[Job]) -> dict[str, list[str]]:
    """What a job that reads the other jobs' outputs (its stage `gathers` them: the report) reads,
    each output under `<job id>:<output name>` (a job's run record: `<job id>:run_record`)."""
    admits = job.spec.gathers
    reads = {}
    for other in jobs:
        if other.spec.gathers is not None:
            continue
        for name, paths in [*other.writes.items(), ("run_record", [other.run_record])]:
            if admits(other.spec, name):
                reads[f"{other.id}:{name}"] = list(paths)
    return reads


def _holder(path: str, maker: dict) -> str | None:
    """The output that holds `path` (itself or a folder above it), by walking up its parents."""
    cur = path
    while cur:
        if cur in maker:
            return cur
        cur = cur.rpartition("/")[0]
    return None


def _link(jobs: list[Job]) -> list[Job]:
    """Each job's `deps`: what it reads, as the engines track it (the upstream output holding each
    path, or the path itself when no job makes it), with the reads inside each (`holders`); its
    `sources` left to what no job makes; the jobs in an order where every job comes after the jobs
    it reads from (a student's teacher before the student)."""
    maker = {o: j for j in jobs for o in j.outputs}
    for job in jobs:
        holders: dict[str, list[str]] = {}
        for path in job.read_paths:
            holders.setdefault(_holder(path, maker) or path, []).append(path)
        job.deps, job.holders = list(holders), holders
        job.sources = [s for s in job.sources if _holder(s, maker) is None]
        job.models = [m for m in job.models if _holder(m, maker) is None]
    ordered, placed, visiting = [], set(), set()

    def place(job: Job) -> None:
        stack = [(job, iter(job.deps))]
        visiting.add(job.id)
        while stack:
            current, deps = stack[-1]
            nxt = next((maker[d] for d in deps if d in maker and maker[d].id not in placed
                        and maker[d].id not in visiting), None)
            if nxt is not None:
                visiting.add(nxt.id)
                stack.append((nxt, iter(nxt.deps)))
                continue
            stack.pop()
            visiting.discard(current.id)
            placed.add(current.id)
            ordered.append(current)

    for job in jobs:
        if job.id not in placed:
            place(job)
    return ordered


def job_for(params_path: str | Path, stage: str, name: str | None, layout: Layout = Layout()) -> Job:
    """One job of the pipeline (what a stage CLI runs by hand), planned alone: its settings, reads and
    outputs, without the other jobs (a stage that gathers their outputs, the report, plans them all);
    a one-line error for a name it lacks."""
    lp = load_params(params_path)
    spec = STAGES[stage]
    if spec.gathers is not None:       # it reads the other jobs' outputs: they are planned with it
        return next(j for j in pipeline(lp, layout) if j.stage == stage)
    with lp.registry.active():
        if name in spec.runnable(lp):
            job = Job.build(stage, name, spec.settings(lp, name), layout)
            refuse_inputs_inside_outputs(job)
            return job
    raise MinBertError(_no_such_job(params_path, lp, spec, name))


def _no_such_job(params_path, lp: LoadedParams, spec, name) -> str:
    known = spec.known(lp)
    if spec.what == "experiment" and name in lp.groups:
        seeds = lp.groups[name]
        shown = ", ".join(seeds[:5]) + (f", ... ({len(seeds)} in all)" if len(seeds) > 5 else "")
        return f"{params_path}: experiment '{name}' runs as {len(seeds)} seeds; name one of them ({shown})"
    if name in known:   # it exists, but this stage does not apply to it
        return f"{params_path}: {spec.what} '{name}' has no {spec.name} job{'; ' + spec.hint if spec.hint else ''}"
    return f"{params_path}: unknown {spec.what} '{name}'{close(str(name), known)}"


# ---------------------------------------------------------------- job files

def write_job_file(job: Job) -> bool:
    """Write the job's file (minbert.pipeline.job) when its content changed; returns whether it was
    written.

    Snakemake compares the file's date with the job's outputs (and, the date being newer, its
    content with the one it recorded). A description that is the one the outputs were made from
    (their run record says so, or an acceptance of its code: minbert.pipeline.accept; an edit
    undone, or outputs made by DVC) gets the date the run started, so it counts as older than them;
    any other new content is newer. When the outputs were made from this description but from
    other inputs than those in place now (a stage run by hand on inputs changed since, then put
    back), the file names those inputs (`stale`): new content, so either engine runs the job again."""
    text, date = planned_file(job)
    path = Path(job.job_file)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    _replace(path, text)
    if date is not None:
        os.utime(path, (date, date))
    return True


def planned_file(job: Job) -> tuple[str, float | None]:
    """The job file as a plan writes it (`write_job_file`): its content, and the date it gets when
    written (the start of the run that made the outputs from it; None: the time of writing)."""
    last = last_run(job)
    current = last is not None and last.made(job.description())
    stale = last.changed_reads(job) if current else []
    return job.file_text(stale), (last.started if current and not stale else None)


def _replace(path: Path, text: str) -> None:
    """Write a job file at once (a temporary beside it, renamed over it): one create and one rename,
    as a plan of thousands of jobs writes thousands of them."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


RUN_ONLY = ("read_hashes", "runtime")     # in a run record's description, beside the job's own
ACCEPTED = ("code", "modules")            # what an acceptance of a reviewed edit re-stamps (minbert.pipeline.accept)


@dataclass(frozen=True)
class LastRun:
    """A job's last finished run, as its run record says (with the code accepted since, if any)."""
    description: dict          # the job's own description (the run-only keys apart), code as accepted
    ran: dict                  # the same, code as it ran (the run record's own)
    recorded: dict             # the whole description the run recorded (its fingerprint's), code as accepted
    started: float             # when it started, a second early (the record keeps whole seconds)
    run_fingerprint: str       # the fingerprint its run record holds (of the code that ran)

    def made(self, description: dict) -> bool:
        """Whether the run made its outputs for `description` (with the code that ran, or the code
        accepted since)."""
        return canonical(description) in (canonical(self.description), canonical(self.ran))

    def changed_reads(self, job: Job) -> list[str]:
        """The job's reads (as its description names them) that are not what the run read: each read
        changed (content or status) since the run started is hashed again and compared with the hash
        the run recorded; one not changed since is what it read. A read that is not there is none of
        them: the job that writes it runs first, and its readers are judged by what it writes."""
        recorded = self.recorded.get("read_hashes") or {}
        changed = []
        for path in job.read_paths:
            name = job.portable(path)
            if name in recorded and _touched_since(Path(path), self.started) and os.path.lexists(path) \
                    and job.read_hash(path) != recorded[name]:
                changed.append(name)
        return changed


def _touched_since(path: Path, when: float) -> bool:
    """Whether a file, or a file of a folder, changed content or status (a copy put back with its old
    date still changes the status) at or after `when`; a path not there counts as changed."""
    try:
        stats = [path.stat()] + ([q.stat() for q in path.rglob("*")] if path.is_dir() else [])
    except OSError:
        return True
    return any(max(st.st_mtime, st.st_ctime) >= when for st in stats)


def last_run(job: Job) -> LastRun | None:
    """The job's last finished run (minbert.pipeline.runinfo writes its run record), its recorded code
    replaced by the code accepted since (minbert.pipeline.finished.accepted); None when it has none
    or its record does not read."""
    record = Path(job.run_record)
    try:
        if not record.is_file():
            return None
        info = json.loads(read_input(record, "run record", limit=64 << 20).decode("utf-8"))
        recorded = {**info["description"], **finished.accepted(job, info["fingerprint"])}
        own = {k: v for k, v in recorded.items() if k not in RUN_ONLY}
        ran = {k: v for k, v in info["description"].items() if k not in RUN_ONLY}
        return LastRun(own, ran, recorded, dt.datetime.fromisoformat(info["started"]).timestamp() - 1.0,
                       str(info["fingerprint"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MinBertError):
        return None


def made_from(job: Job, description: dict) -> float | None:
    """When the job's last run started, if that run had this description and read what is in place
    now; else None."""
    last = last_run(job)
    if last is None or not last.made(description) or last.changed_reads(job):
        return None
    return last.started


__all__ = ["Job", "LastRun", "last_run", "made_from", "pipeline", "job_for", "planned_file", "write_job_file"]
