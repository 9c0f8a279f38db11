"""Score a folder of predictions (`<task>-<split>.csv`, see docs/pipeline.md) into metrics.json.

Dev predictions are always scored. Test predictions are scored only when the file carries labels
(the CS224N SST and STS test files do not): `test` is then null, or holds the tasks that have them.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import MinBertError
from .layout import prediction_file as _prediction_file
from .metrics import summarise, task_metric
from .tasks import TASKS


def prediction_file(folder: str | Path, task: str, split: str) -> Path:
    return Path(_prediction_file(str(folder), task, split))


def _numbers(df: pd.DataFrame, column: str, path: Path, what: str) -> pd.Series:
    """A column as finite numbers (empty cells: NaN), or a one-line error naming the line."""
    text = df[column].str.strip()
    values = pd.to_numeric(text.where(text != ""), errors="coerce")
    bad = values.isna() & (text != "") | values.isin([np.inf, -np.inf])
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise MinBertError(f"{path}: line {row + 2}: {what} {df[column].iloc[row]!r} is not a finite number; "
                           f"re-run the stage that wrote it")
    return values


def read_predictions(path: str | Path, task: str) -> pd.DataFrame:
    """One predictions CSV, checked: rows present, ids unique (text, never NaN), the task's columns
    present, predictions finite numbers and, for a classification or binary task, labels and
    predictions among the task's labels; a regression label within its range."""
    from .io import read_input

    path = Path(path)
    data = read_input(path, "predictions file")
    try:
        df = pd.read_csv(io.StringIO(data.decode("utf-8")), dtype=str, keep_default_na=False)
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); re-run the stage that wrote it") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise MinBertError(f"{path}: cannot read predictions ({str(e).splitlines()[0]})") from None
    need = ["id", "label", "prediction"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise MinBertError(f"{path}: missing column '{missing[0]}' (expected id, ..., label, prediction)")
    if not len(df):
        raise MinBertError(f"{path}: the file has no rows; re-run the stage that wrote it")
    if df["id"].duplicated().any():
        raise MinBertError(f"{path}: id '{df['id'][df['id'].duplicated()].iloc[0]}' appears twice")
    text = df[["label", "prediction"]].copy()
    df["prediction"] = _numbers(df, "prediction", path, "prediction")
    df["label"] = _numbers(df, "label", path, "label")
    spec = TASKS[task]
    if spec.kind == "regression":
        lo, hi = spec.label_range
        outside = df["label"].notna() & ~df["label"].between(lo, hi)
        checks = [("label", outside)]
    else:
        allowed = list(spec.labels)
        checks = [(c, df[c].notna() & ~df[c].isin(allowed)) for c in ("label", "prediction")]
    for column, bad in checks:
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            rule = (f"one of {allowed}" if spec.kind != "regression" else f"from {lo:g} to {hi:g}")
            raise MinBertError(f"{path}: line {row + 2}: {column} {text[column].iloc[row]!r} is not a {spec.name} "
                               f"{column} ({rule}); re-run the stage that wrote it")
    for column in spec.prob_columns:
        if column in df.columns:
            df[column] = _numbers(df, column, path, column)
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
        if not (path.exists() or path.is_symlink()):
            continue
        df = read_predictions(path, task)
        if not labelled(df, path):
            continue
        scores[TASKS[task].metric_key] = task_metric(task, df["prediction"], df["label"])
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
