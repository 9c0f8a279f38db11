"""Running a job: clean start, fingerprint, and the run record (provenance) at the end.

`running(job)` wraps a stage's work:
- first: no path the job writes under the results folder is (or lies under) a symlink, and the
  job's lock is taken (minbert.pipeline.lock: one process per job, whichever engine started it;
  a job that finds another process running it waits for it);
- the job's fingerprint: the hash of its resolved description (minbert.pipeline.job) and of the
  contents of what it reads, for the resume check of the training stages;
- when the job's last finished run had this very fingerprint, its outputs are put back as they
  were (minbert.pipeline.finished) and nothing runs (`UpToDate`): work another process finished,
  or one an engine deleted, is never redone;
- before: the job's declared outputs left from an earlier run are removed (a failure can then
  never leave a stale output behind) and temporaries left by a killed run beside them are deleted;
  a folder outside the results folder (the report's pages under --out) loses only the files its
  manifest says the stage wrote there, never a user's own;
- after success: results/runs/<stage>/<name>.json with the git revision, the environment and
  device, the precision that ran, wall time and peak memory, the fingerprint and the resolved
  description; then the outputs are kept as the job's finished work.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.io import MANIFEST, clean_stale_temporaries, refuse_links, remove_owned, write_json
from minbert.core.layout import Layout
from minbert.core.provenance import fingerprint_of, git_revision
from minbert.pipeline import finished
from minbert.pipeline.job import Job, inside, refuse_inputs_inside_outputs
from minbert.pipeline.lock import job_lock


def peak_rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / 1024, 1)


def hardware(device="cpu") -> dict:
    """Where the job ran. torch is asked only when the stage loaded it (evaluate, ensemble and the
    report do not, and start faster without it)."""
    torch = sys.modules.get("torch")
    try:
        version = torch.__version__ if torch else importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": version, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads() if torch else None,
            "device": str(device)}
    if torch and str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@dataclass
class Running:
    """A running job: its fingerprint and description, and fields for its run record."""
    job: Job
    fingerprint: str
    description: dict
    fields: dict = field(default_factory=dict)


def _remove(path: Path, results: Path) -> None:
    """Remove an output left by an earlier run: a file; a folder under the results folder (the
    pipeline owns it whole); a folder elsewhere (the report's pages under --out) only as far as
    its manifest lists what the stage wrote there."""
    if path.is_dir() and not path.is_symlink():
        if (path / MANIFEST).is_file() or not inside(path, results):
            remove_owned(path)
        else:
            shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class UpToDate(Exception):
    """The job's outputs for this very description and inputs are in place: nothing to run."""


def network_record(network) -> dict:
    """Where a stage that runs the network runs and in which precision, as the run record says it
    (minbert.params.settings.NetworkSettings; nothing is set up here)."""
    from minbert.core.runtime import pick_device, precision_on

    device = pick_device(network.device)
    return {"device": device, "precision": precision_on(network.precision, device)}


@contextlib.contextmanager
def running(job: Job, network=None, extra_reads=(), main_process: bool = True, force: bool = False):
    """Run `job`'s body (see the module docstring); yields a `Running`. `network`: the settings of a
    stage that runs the network (its device and precision go into the record); `extra_reads`: what
    the job reads outside its declared inputs (e.g. the packaged model folder); `force`: run even
    when the finished outputs of this fingerprint are kept."""
    L = Layout(job.results)
    lock = job_lock(L.lock(job.stage, job.name), job.id) if main_process else contextlib.nullcontext()
    if main_process:
        for path in owned_paths(job):
            refuse_links(path, job.results)
        refuse_inputs_inside_outputs(job, extra_reads)
    record = network_record(network) if network is not None else {"device": "cpu"}
    with lock:
        description = job.runtime_description(extra_reads)
        run = Running(job, fingerprint_of(description), description)
        if main_process and not force and finished.restore(job, run.fingerprint):
            raise UpToDate(f"{job.id}: up to date (its outputs for these settings, inputs and code are in place); "
                           f"nothing to run")
        if main_process:
            for out in job.outputs:
                path = Path(out)
                clean_stale_temporaries(path.parent, path.name)
                _remove(path, Path(job.results))
        start, t0 = dt.datetime.now(dt.timezone.utc), time.perf_counter()
        yield run
        if main_process:
            write_json(Path(job.run_record), {
                "stage": job.stage, "name": job.name, "git_revision": git_revision(),
                "started": start.isoformat(timespec="seconds"),
                "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "wall_seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": peak_rss_mib(),
                **hardware(record["device"]), **{k: v for k, v in record.items() if k != "device"}, **run.fields,
                "fingerprint": run.fingerprint, "description": description,
            })
            finished.keep_dates(job)       # outputs as they were: their dates as they were
            finished.keep(job, run.fingerprint)


def owned_paths(job: Job) -> list[str]:
    """Every path under the results folder the job writes, removes or resumes from: its outputs, its
    run record and description, its resumable state, its lock, the shared token cache."""
    L = Layout(job.results)
    return [*job.outputs, L.job_file(job.stage, job.name), L.state(job.stage, job.name),
            L.finished(job.stage, job.name), L.lock(job.stage, job.name), L.token_cache]
