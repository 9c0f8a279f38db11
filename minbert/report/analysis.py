"""Error analysis of one run's dev predictions, one section per task of the registry
(minbert.core.tasks): confusion matrices and the most confident mistakes of classification and binary
tasks, the worst pairs of a regression task (the papers' qualitative sections)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from minbert.core.tasks import TASKS, Task
from minbert.report.data import RunResults


def confusion(true, pred, n_classes: int) -> dict:
    """Counts and row-normalised rates (each true class sums to 1), plus per-class precision/recall."""
    labels = list(range(n_classes))
    counts = confusion_matrix(np.asarray(true, dtype=int), np.asarray(pred, dtype=int), labels=labels)
    row_sums = counts.sum(axis=1, keepdims=True)
    rates = np.divide(counts, row_sums, out=np.zeros(counts.shape, dtype=float), where=row_sums > 0)
    precision, recall, f1, support = precision_recall_fscore_support(
        true, pred, labels=labels, zero_division=0)
    return {"counts": counts.tolist(), "rates": rates.tolist(), "precision": precision.tolist(),
            "recall": recall.tolist(), "f1": f1.tolist(), "support": support.tolist(),
            "total": int(counts.sum()), "correct": int(np.trace(counts))}


def _confidence(frame: pd.DataFrame, task: str) -> pd.Series | None:
    """The probability the model gave to the class it predicted, when predictions carry probabilities."""
    cols = TASKS[task].prob_columns
    if not cols or not all(c in frame.columns for c in cols):
        return None
    if TASKS[task].kind == "classification":
        probs = frame[cols].to_numpy(dtype=float)
        return pd.Series(probs[np.arange(len(frame)), frame["prediction"].astype(int)], index=frame.index)
    p1 = frame["prob_1"].astype(float)
    return p1.where(frame["prediction"].astype(int) == 1, 1.0 - p1)


def confident_mistakes(frame: pd.DataFrame, task: str, k: int) -> list[dict] | None:
    """Groups of wrong predictions, most confident first: one group per true class."""
    conf = _confidence(frame, task)
    if conf is None:
        return None
    frame = frame.assign(confidence=conf)
    wrong = frame[frame["prediction"].astype(int) != frame["label"].astype(int)]
    groups = []
    for cls, name in enumerate(TASKS[task].classes):
        rows = wrong[wrong["label"].astype(int) == cls]
        top = rows.sort_values(["confidence", "id"], ascending=[False, True], kind="stable").head(k)
        groups.append({"label": cls, "name": name, "n_wrong": len(rows),
                       "n_class": int((frame["label"].astype(int) == cls).sum()),
                       "rows": _records(top, task)})
    return groups


def _records(frame: pd.DataFrame, task: str) -> list[dict]:
    out = []
    columns = TASKS[task].text_columns
    for _, r in frame.iterrows():
        rec = {"id": r["id"], "label": r["label"], "prediction": r["prediction"],
               "texts": [r[c] for c in columns]}
        for extra in ("confidence", "error"):
            if extra in r:
                rec[extra] = float(r[extra])
        out.append(rec)
    return out


def worst_pairs(frame: pd.DataFrame, k: int, task: str = "sts") -> list[dict]:
    """The examples of a regression task with the largest absolute error."""
    frame = frame.assign(error=(frame["prediction"] - frame["label"]).abs())
    top = frame.sort_values(["error", "id"], ascending=[False, True], kind="stable").head(k)
    return _records(top, task)


def _section(task: Task, frame: pd.DataFrame, k: int, split: str) -> dict:
    section = {"task": task.name, "kind": task.kind, "split": split, "prob_columns": task.prob_columns, "title": task.title[:1].upper() + task.title[1:],
               "unit": "pairs" if task.pair else "sentences", "pair": task.pair, "n": len(frame),
               "classes": list(task.classes)}
    if task.kind == "regression":
        diff = frame["prediction"] - frame["label"]
        section |= {"mae": float(diff.abs().mean()), "rmse": float(np.sqrt((diff ** 2).mean())),
                    "worst": worst_pairs(frame, k, task.name), "label_range": task.label_range}
    else:
        section |= {"confusion": confusion(frame["label"], frame["prediction"], len(task.classes)),
                    "mistakes": confident_mistakes(frame, task.name, k)}
    return section


def analyse(run: RunResults, k: int, split: str = "dev") -> dict:
    """Everything the error-analysis section shows for one run: `sections`, one per task with
    labelled predictions on `split` in registry order (also reachable by task name; a task without
    them is None)."""
    out: dict = {"split": split}
    sections = []
    for task in TASKS.values():
        frame = run.labelled(task.name, split)
        out[task.name] = None if frame is None else _section(task, frame, k, split)
        if frame is not None:
            sections.append(out[task.name])
    out["sections"] = sections
    out["any"] = bool(sections)
    return out
