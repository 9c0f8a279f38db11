"""run.json: what produced an artifact (git revision, hardware, wall time, peak memory)."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import resource
import subprocess
import time
from pathlib import Path

import torch

from .io import write_json


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


def hardware(device: torch.device | str = "cpu") -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "device": str(device)}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@contextlib.contextmanager
def recorded_run(path: str | os.PathLike, stage: str, name: str | None = None, device="cpu", **extra):
    """Time the body and write run.json at `path` when it succeeds. Yields a dict for extra fields."""
    start, t0 = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    fields: dict = dict(extra)
    yield fields
    write_json(Path(path), {
        "stage": stage, "name": name, "git_revision": git_revision(),
        "started": start.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": peak_rss_mib(),
        **hardware(device), **fields,
    })
