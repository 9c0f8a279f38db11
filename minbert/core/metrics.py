"""Task metrics, the overall score and the selection score.

- `task_metric`: accuracy, or Pearson r for a regression task (minbert.core.tasks says which); an
  undefined metric (Pearson r of constant labels or predictions) is None, `metric_undefined` says
  why, and it makes the overall score and the selection score undefined too;
- `overall_score`: the course leaderboard's (sst_acc + para_acc + (sts_r + 1) / 2) / 3;
- `selection_score`: what picks the best epoch, the best model and the best ensemble member: the
  mean over the tasks present of accuracy, or (r + 1) / 2 for a correlation. Over SST, Quora and
  STS it is the leaderboard score; over any other set of tasks it stays on the same 0-1 scale.
"""
from __future__ import annotations

import math

import numpy as np

from minbert.core.tasks import LEADERBOARD_TASKS, TASKS

# Plain numpy, as scikit-learn's accuracy_score and scipy's pearsonr compute them (tests/test_guards.py
# holds them to those): importing either costs a training job 2-4 s at its first evaluation.

def accuracy(pred, true) -> float:
    true, pred = np.asarray(true).reshape(-1), np.asarray(pred).reshape(-1)
    if len(true) != len(pred) or not len(true):
        raise ValueError(f"accuracy of {len(pred)} predictions against {len(true)} labels")
    return float(np.mean(true == pred))


def pearson_undefined(pred, true) -> str | None:
    """Why Pearson r of `pred` and `true` is undefined (fewer than 2 rows, constant labels or
    constant predictions), or None when it is defined."""
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if len(pred) < 2:
        return f"{len(pred)} row(s); a correlation needs 2 or more"
    for name, x in (("labels", true), ("predictions", pred)):
        if np.ptp(x) == 0:
            return f"the {name} are constant (all {x[0]:g}); a correlation with a constant is undefined"
    return None


def pearson(pred, true) -> float | None:
    """Pearson r; None when it is undefined (`pearson_undefined` says why): never a number made up."""
    if pearson_undefined(pred, true) is not None:
        return None
    # scipy.stats.pearsonr's computation: centred, scaled by the largest deviation (no overflow), normalised
    x, y = (np.asarray(v, dtype=np.float64) for v in (pred, true))
    xm, ym = x - x.mean(), y - y.mean()
    xm, ym = xm / np.abs(xm).max(), ym / np.abs(ym).max()
    r = float(np.clip(np.dot(xm / np.linalg.norm(xm), ym / np.linalg.norm(ym)), -1.0, 1.0))
    return r if math.isfinite(r) else None


def metric_undefined(task: str, pred, true) -> str | None:
    """Why the task's metric is undefined on these rows, or None (accuracy is always defined)."""
    return pearson_undefined(pred, true) if TASKS[task].metric == "pearson" else None


def task_metric(task: str, pred, true) -> float | None:
    """The task's metric; None when it is undefined (see `metric_undefined`)."""
    return pearson(pred, true) if TASKS[task].metric == "pearson" else accuracy(pred, true)


def overall_score(sst_acc: float, para_acc: float, sts_pearson: float) -> float:
    """The course leaderboard's score: (sst_acc + para_acc + (sts_r + 1) / 2) / 3."""
    return (sst_acc + para_acc + (sts_pearson + 1.0) / 2.0) / 3.0


def selection_score(metrics: dict, tasks=None) -> float | None:
    """Mean over `tasks` (default: every task with a metric in `metrics`) of the task's metric on a
    0-1 scale (accuracy; (r + 1) / 2 for Pearson r). None when no task has a finite metric, and
    None when one of them is undefined (present but not a number): such a result is never selected."""
    names = TASKS if tasks is None else tasks
    if any(TASKS[t].metric_key in metrics and not _finite(metrics[TASKS[t].metric_key]) for t in names):
        return None
    values = [TASKS[t].score(metrics[TASKS[t].metric_key]) for t in names
              if _finite(metrics.get(TASKS[t].metric_key))]
    return float(np.mean(values)) if values else None


def summarise(metrics: dict[str, float]) -> dict[str, float]:
    """Add `overall` (leaderboard formula) and `mean` (plain mean) when the leaderboard's three
    tasks are present."""
    out = dict(metrics)
    keys = [TASKS[t].metric_key for t in LEADERBOARD_TASKS]
    if all(_finite(metrics.get(k)) for k in keys):
        out["overall"] = overall_score(*(metrics[k] for k in keys))
        out["mean"] = float(np.mean([metrics[k] for k in keys]))
    elif all(k in metrics for k in keys):       # every part is there, one is undefined: so is the whole
        out["overall"] = out["mean"] = None
    return out


class Undefined:
    """A metric that is undefined (shown as "undefined", never as a number), with the reason."""

    def __init__(self, reason: str = ""):
        self.reason = reason

    def __str__(self) -> str:
        return "undefined"

    def __repr__(self) -> str:
        return f"Undefined({self.reason!r})"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
