"""Task metrics, the overall score and the selection score.

- `task_metric`: accuracy, or Pearson r for a regression task (minbert.tasks says which);
- `overall_score`: the course leaderboard's (sst_acc + para_acc + (sts_r + 1) / 2) / 3;
- `selection_score`: what picks the best epoch, the best model and the best ensemble member: the
  mean over the tasks present of accuracy, or (r + 1) / 2 for a correlation. Over SST, Quora and
  STS it is the leaderboard score; over any other set of tasks it stays on the same 0-1 scale.
"""
from __future__ import annotations

import math

import numpy as np

from .tasks import LEADERBOARD_TASKS, TASKS


# scipy and scikit-learn are imported where used: every stage start-up would pay a second for them

def accuracy(pred, true) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(np.asarray(true), np.asarray(pred)))


def pearson(pred, true) -> float:
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if len(pred) < 2 or np.std(pred) == 0 or np.std(true) == 0:
        return 0.0  # undefined correlation (constant predictions) scores as no correlation
    from scipy.stats import pearsonr

    return float(pearsonr(pred, true)[0])


def task_metric(task: str, pred, true) -> float:
    return pearson(pred, true) if TASKS[task].metric == "pearson" else accuracy(pred, true)


def overall_score(sst_acc: float, para_acc: float, sts_pearson: float) -> float:
    """The course leaderboard's score: (sst_acc + para_acc + (sts_r + 1) / 2) / 3."""
    return (sst_acc + para_acc + (sts_pearson + 1.0) / 2.0) / 3.0


def selection_score(metrics: dict, tasks=None) -> float | None:
    """Mean over `tasks` (default: every task with a metric in `metrics`) of the task's metric on a
    0-1 scale (accuracy; (r + 1) / 2 for Pearson r). None when no task has a finite metric."""
    names = TASKS if tasks is None else tasks
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
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
