"""Task metrics and the overall score."""
from __future__ import annotations

import numpy as np
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score

METRIC_OF_TASK = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson", "cfimdb": "cfimdb_acc"}


def accuracy(pred, true) -> float:
    return float(accuracy_score(np.asarray(true), np.asarray(pred)))


def pearson(pred, true) -> float:
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if len(pred) < 2 or np.std(pred) == 0 or np.std(true) == 0:
        return 0.0  # undefined correlation (constant predictions) scores as no correlation
    return float(pearsonr(pred, true)[0])


def task_metric(task: str, pred, true) -> float:
    return pearson(pred, true) if task == "sts" else accuracy(pred, true)


def overall_score(sst_acc: float, para_acc: float, sts_pearson: float) -> float:
    """The course leaderboard's score: (sst_acc + para_acc + (sts_r + 1) / 2) / 3."""
    return (sst_acc + para_acc + (sts_pearson + 1.0) / 2.0) / 3.0


def summarise(metrics: dict[str, float]) -> dict[str, float]:
    """Add `overall` (leaderboard formula) and `mean` (plain mean) when all three tasks are present."""
    out = dict(metrics)
    keys = ("sst_acc", "para_acc", "sts_pearson")
    if all(k in metrics and metrics[k] is not None for k in keys):
        out["overall"] = overall_score(*(metrics[k] for k in keys))
        out["mean"] = float(np.mean([metrics[k] for k in keys]))
    return out
