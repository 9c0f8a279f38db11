"""Score a folder of predictions (`<task>-<split>.csv`, see docs/pipeline.md) into metrics.json.

Dev predictions are always scored. Test predictions are scored only when the file carries labels
(the CS224N SST and STS test files do not): `test` is then null, or holds the tasks that have them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import MinBertError
from .metrics import METRIC_OF_TASK, summarise, task_metric
from .params import TASKS

SPLITS = ("dev", "test")
PROB_COLUMNS = {"sst": [f"prob_{k}" for k in range(5)], "para": ["prob_1"], "sts": []}
TEXT_COLUMNS = {"sst": ["sentence"], "para": ["sentence1", "sentence2"], "sts": ["sentence1", "sentence2"]}


def prediction_file(folder: str | Path, task: str, split: str) -> Path:
    return Path(folder) / f"{task}-{split}.csv"


def read_predictions(path: str | Path, task: str) -> pd.DataFrame:
    """One predictions CSV, checked: ids unique, the task's columns present, predictions numeric."""
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype={"id": str}, keep_default_na=True)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise MinBertError(f"{path}: cannot read predictions ({str(e).splitlines()[0]})") from None
    need = ["id", "label", "prediction"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise MinBertError(f"{path}: missing column '{missing[0]}' (expected id, ..., label, prediction)")
    if df["id"].duplicated().any():
        raise MinBertError(f"{path}: id '{df['id'][df['id'].duplicated()].iloc[0]}' appears twice")
    pred = pd.to_numeric(df["prediction"], errors="coerce")
    if pred.isna().any():
        row = int(pred.isna().to_numpy().nonzero()[0][0])
        raise MinBertError(f"{path}: row {row + 2}: prediction '{df['prediction'].iloc[row]}' is not a number")
    df["prediction"] = pred
    df["label"] = pd.to_numeric(df["label"], errors="coerce")
    return df


def labelled(df: pd.DataFrame, path: str | Path) -> bool:
    """True when every row has a label, False when none has; a partly labelled file is an error."""
    has = df["label"].notna()
    if has.all() and len(df):
        return True
    if not has.any():
        return False
    row = int((~has).to_numpy().nonzero()[0][0])
    raise MinBertError(f"{path}: row {row + 2} has no label while others do; label all rows or none")


def score_split(folder: str | Path, split: str) -> dict | None:
    """Metrics of one split over the tasks present in `folder`; None when no task has labels."""
    scores: dict = {}
    counts: dict = {}
    for task in TASKS:
        path = prediction_file(folder, task, split)
        if not path.is_file():
            continue
        df = read_predictions(path, task)
        if not labelled(df, path):
            continue
        scores[METRIC_OF_TASK[task]] = task_metric(task, df["prediction"], df["label"])
        counts[task] = len(df)
    if not scores:
        return None
    return {**summarise(scores), "n": counts}


def evaluate_folder(folder: str | Path) -> dict:
    """metrics.json content for a predictions folder (an experiment's or an ensemble's)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinBertError(f"{folder}: predictions folder not found; run the predict stage first")
    if not any(prediction_file(folder, t, "dev").is_file() for t in TASKS):
        raise MinBertError(f"{folder}: no dev predictions (expected files like sst-dev.csv)")
    dev = score_split(folder, "dev")
    if dev is None:
        raise MinBertError(f"{folder}: the dev predictions carry no labels")
    return {"dev": dev, "test": score_split(folder, "test")}


def summary_line(name: str, metrics: dict) -> str:
    """One line of dev scores for the terminal, e.g. `a: sst_acc=0.5000, ..., overall=0.7000`."""
    return f"{name}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics["dev"].items() if k != "n")
