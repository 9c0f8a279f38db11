"""Error analysis of one run's dev predictions: confusion matrices, the worst similarity pairs and
the most confident mistakes (the papers' qualitative sections)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from .data import RunResults

SST_CLASSES = ["very negative", "negative", "neutral", "positive", "very positive"]
PARA_CLASSES = ["not paraphrase", "paraphrase"]


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
    if task == "sst":
        cols = [f"prob_{k}" for k in range(5)]
        if not all(c in frame.columns for c in cols):
            return None
        probs = frame[cols].to_numpy(dtype=float)
        return pd.Series(probs[np.arange(len(frame)), frame["prediction"].astype(int)], index=frame.index)
    if "prob_1" not in frame.columns:
        return None
    p1 = frame["prob_1"].astype(float)
    return p1.where(frame["prediction"].astype(int) == 1, 1.0 - p1)


def confident_mistakes(frame: pd.DataFrame, task: str, k: int) -> list[dict] | None:
    """Groups of wrong predictions, most confident first: one group per true class."""
    conf = _confidence(frame, task)
    if conf is None:
        return None
    frame = frame.assign(confidence=conf)
    wrong = frame[frame["prediction"].astype(int) != frame["label"].astype(int)]
    names = SST_CLASSES if task == "sst" else PARA_CLASSES
    groups = []
    for cls, name in enumerate(names):
        rows = wrong[wrong["label"].astype(int) == cls]
        top = rows.sort_values(["confidence", "id"], ascending=[False, True], kind="stable").head(k)
        groups.append({"label": cls, "name": name, "n_wrong": len(rows),
                       "n_class": int((frame["label"].astype(int) == cls).sum()),
                       "rows": _records(top, task)})
    return groups


def _records(frame: pd.DataFrame, task: str) -> list[dict]:
    out = []
    for _, r in frame.iterrows():
        rec = {"id": r["id"], "label": r["label"], "prediction": r["prediction"]}
        if task == "sst":
            rec["texts"] = [r["sentence"]]
        else:
            rec["texts"] = [r["sentence1"], r["sentence2"]]
        for extra in ("confidence", "error"):
            if extra in r:
                rec[extra] = float(r[extra])
        out.append(rec)
    return out


def worst_pairs(frame: pd.DataFrame, k: int) -> list[dict]:
    """The similarity pairs with the largest absolute error."""
    frame = frame.assign(error=(frame["prediction"] - frame["label"]).abs())
    top = frame.sort_values(["error", "id"], ascending=[False, True], kind="stable").head(k)
    return _records(top, "sts")


def analyse(run: RunResults, k: int, split: str = "dev") -> dict:
    """Everything the error-analysis section shows for one run; a task without labelled
    predictions on `split` is absent (None)."""
    out = {"split": split, "sst": None, "para": None, "sts": None}
    sst = run.labelled("sst", split)
    if sst is not None:
        out["sst"] = {"n": len(sst), "confusion": confusion(sst["label"], sst["prediction"], 5),
                      "classes": SST_CLASSES, "mistakes": confident_mistakes(sst, "sst", k)}
    para = run.labelled("para", split)
    if para is not None:
        out["para"] = {"n": len(para), "confusion": confusion(para["label"], para["prediction"], 2),
                       "classes": PARA_CLASSES, "mistakes": confident_mistakes(para, "para", k)}
    sts = run.labelled("sts", split)
    if sts is not None:
        err = (sts["prediction"] - sts["label"]).abs()
        out["sts"] = {"n": len(sts), "mae": float(err.mean()),
                      "rmse": float(np.sqrt(((sts["prediction"] - sts["label"]) ** 2).mean())),
                      "worst": worst_pairs(sts, k)}
    out["any"] = any(out[t] is not None for t in ("sst", "para", "sts"))
    return out
