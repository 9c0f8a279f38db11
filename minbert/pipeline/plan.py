"""The pipeline's jobs (minbert.pipeline.job), planned from the stage registry
(minbert.pipeline.registry): each stage's jobs in a params file, what each reads and writes, and
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
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import TEMP_SUFFIX, read_input
from minbert.core.layout import MODEL_FILE, Layout
from minbert.core.provenance import canonical
from minbert.params.catalogue import LoadedParams
from minbert.params.load import load_params
from minbert.params.messages import close
from minbert.pipeline.job import Job, refuse_inputs_inside_outputs
from minbert.pipeline.registry import STAGES

# ---------------------------------------------------------------- the jobs of a params file


def pipeline(params: str | Path | LoadedParams = "params.yaml", layout: Layout = Layout()) -> list[Job]:
    """Every job, in an order where each comes after the jobs whose outputs it reads."""
    lp = params if isinstance(params, LoadedParams) else load_params(params)
    by_name: dict[tuple, list[Job]] = {}        # an experiment's jobs together, in the registry's order
    with lp.registry.active():                  # the params' own tasks, losses and heads
        for spec in STAGES.values():
            for name in ([] if spec.name == "report" else spec.names(lp)):
                job = Job.build(spec.name, name, spec.settings(lp, name), layout)
                by_name.setdefault((spec.name,) if name is None else (spec.what, name), []).append(job)
        jobs = [j for group in by_name.values() for j in group]
        for job in jobs:    # an engine deletes a job's outputs before it runs: refuse before any engine starts
            refuse_inputs_inside_outputs(job)
        return _link(jobs + [_report(lp, layout, jobs)])


def _report(lp: LoadedParams, layout: Layout, jobs: list[Job]) -> Job:
    """The report reads every earlier output but the models and the exports (minbert.report.data
    loads what it shows by the layout)."""
    report = Job.build("report", None, STAGES["report"].settings(lp, None), layout)
    report.reads = {"outputs": [o for j in jobs if j.spec.reported for o in j.outputs
                                if not o.endswith((f"/{MODEL_FILE}", "/model"))]}
    return report


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
    outputs, without the other jobs (the report, which reads every output, plans them all); a
    one-line error for a name it lacks."""
    lp = load_params(params_path)
    spec = STAGES[stage]
    if spec.name == "report":
        return next(j for j in pipeline(lp, layout) if j.stage == "report")
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
    (their run record says so: an edit undone, or outputs made by DVC) gets the date the run
    started, so it counts as older than them; any other new content is newer."""
    path = Path(job.job_file)
    text = job.file_text()
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    _replace(path, text)
    started = _made_from(job, job.description())
    if started is not None:
        os.utime(path, (started, started))
    return True


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


def _made_from(job: Job, description: dict) -> float | None:
    """When the job's recorded run started, if that run had this description; else None."""
    record = Path(job.run_record)
    try:
        if not record.is_file():
            return None
        info = json.loads(read_input(record, "run record", limit=64 << 20).decode("utf-8"))
        recorded = {k: v for k, v in info["description"].items() if k not in RUN_ONLY}
        if canonical(recorded) != canonical(description):
            return None
        return dt.datetime.fromisoformat(info["started"]).timestamp() - 1.0
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MinBertError):
        return None


__all__ = ["Job", "pipeline", "job_for", "write_job_file"]
