"""Running a job: clean start, fingerprint, and the run record (provenance) at the end.

`running(job)` wraps a stage's work:
- before: the job's declared outputs left from an earlier run are removed (a failure can then
  never leave a stale output behind) and temporaries left by a killed run beside them are deleted;
- the job's fingerprint: the hash of its resolved description (minbert.jobs) and of the contents of
  what it reads, for the resume check of the training stages;
- after success: results/runs/<stage>/<name>.json with the git revision, the environment and
  device, wall time and peak memory, the fingerprint and the resolved description.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .io import clean_stale_temporaries, write_json
from .jobs import Job, fingerprint_of


def git_revision(cwd: str | os.PathLike | None = None) -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("-dirty" if dirty else "")) if rev else "unknown"


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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def running(job: Job, device="cpu", extra_reads=(), main_process: bool = True):
    """Run `job`'s body (see the module docstring); yields a `Running`. `extra_reads` are what the
    job reads outside its declared inputs (e.g. the packaged model folder)."""
    if main_process:
        for out in job.outputs:
            path = Path(out)
            clean_stale_temporaries(path.parent, path.name)
            _remove(path)
    description = job.runtime_description(extra_reads)
    run = Running(job, fingerprint_of(description), description)
    start, t0 = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    yield run
    if main_process:
        write_json(Path(job.run_record), {
            "stage": job.stage, "name": job.name, "git_revision": git_revision(),
            "started": start.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": peak_rss_mib(),
            **hardware(device), **run.fields, "fingerprint": run.fingerprint, "description": description,
        })
