"""Downsampling: how many rows of each task a stage trains on (`target_sizes`) and which
(`downsample`: seeded and stable, the same seed keeping the same rows)."""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError


def target_sizes(sizes: dict[str, int], spec) -> dict[str, int]:
    """Rows to keep per task: `spec.mode` (none | smallest | fixed), then the per-task caps."""
    if spec.mode == "none":
        out = dict(sizes)
    elif spec.mode == "smallest":
        smallest = min(sizes.values()) if sizes else 0
        out = {t: smallest for t in sizes}
    elif spec.mode == "fixed":
        out = {t: min(n, spec.size) for t, n in sizes.items()}
    else:
        raise MinBertError(f"downsample.mode: unknown mode {spec.mode!r} (none, smallest or fixed)")
    for task, cap in (spec.caps or {}).items():
        if cap is None:              # no cap: an experiment lifting a cap its base sets
            continue
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise MinBertError(f"downsample.caps.{task}: {cap!r} is not a number of rows (an integer >= 0)")
        if task in out:
            out[task] = min(out[task], cap)
    return out


def _task_seed(seed: int, task: str) -> list[int]:
    # per-task stream: the rows kept for one task do not depend on the other tasks or dict order
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(task.encode("utf-8"))]


def downsample(frames: dict[str, pd.DataFrame], spec, seed: int) -> dict[str, pd.DataFrame]:
    """Subsample each task's frame per `spec` (a minbert.params.Downsample), seeded and stable.

    The kept rows are the first n of a seeded permutation of the task's rows, returned in their
    original order: same seed, same rows; a smaller n keeps a subset of a larger n's rows.
    """
    sizes = {t: len(f) for t, f in frames.items()}
    targets = target_sizes(sizes, spec)
    out = {}
    for task, frame in frames.items():
        n = targets[task]
        if n >= len(frame):
            out[task] = frame
            continue
        order = np.random.default_rng(_task_seed(seed, task)).permutation(len(frame))
        keep = np.sort(order[:n])
        out[task] = frame.iloc[keep].reset_index(drop=True)
    return out
