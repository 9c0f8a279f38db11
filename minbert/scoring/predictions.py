"""Reading a predictions file (`<task>-<split>.csv`, docs/pipeline.md), checked once for every
reader: the evaluate and ensemble stages, the report, the export's model card and the submission.

A file that does not hold what the predict stage writes is a one-line MinBertError naming the file,
the line and what to do, never a score computed on it.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import read_input
from minbert.core.tasks import TASKS


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


def _table(path: Path) -> pd.DataFrame:
    """The file as a table of text cells ("NA" and "null" are words here, not missing values)."""
    data = read_input(path, "predictions file")
    try:
        return pd.read_csv(io.StringIO(data.decode("utf-8")), dtype=str, keep_default_na=False)
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); re-run the stage that wrote it") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise MinBertError(f"{path}: cannot read predictions ({str(e).splitlines()[0]}); re-run the stage "
                           f"that wrote it") from None


def _check_values(df: pd.DataFrame, text: pd.DataFrame, path: Path, task: str) -> None:
    """Every row has a prediction; labels and predictions are among a classification or binary
    task's labels, or within a regression task's range."""
    empty = df["prediction"].isna()
    if empty.any():
        row = int(empty.to_numpy().nonzero()[0][0])
        raise MinBertError(f"{path}: line {row + 2}: the prediction is empty; re-run the stage that wrote it")
    spec = TASKS[task]
    if spec.kind == "regression":
        lo, hi = spec.label_range
        # predictions too: the model clips its scores to the range (minbert.model.outputs), so one
        # outside it was not written by this pipeline and would be scored as it is
        checks = [(c, df[c].notna() & ~df[c].between(lo, hi)) for c in ("label", "prediction")]
        rule = f"from {lo:g} to {hi:g}"
    else:
        allowed = list(spec.labels)
        checks = [(c, df[c].notna() & ~df[c].isin(allowed)) for c in ("label", "prediction")]
        rule = f"one of {allowed}"
    for column, bad in checks:
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise MinBertError(f"{path}: line {row + 2}: {column} {text[column].iloc[row]!r} is not a {spec.name} "
                               f"{column} ({rule}); re-run the stage that wrote it")


def labelled(df: pd.DataFrame, path: str | Path) -> bool:
    """True when every row has a label, False when none has; a partly labelled file is an error."""
    has = df["label"].notna()
    if has.all() and len(df):
        return True
    if not has.any():
        return False
    row = int((~has).to_numpy().nonzero()[0][0])
    raise MinBertError(f"{path}: row {row + 2} has no label while others do; label all rows or none")


def read_predictions(path: str | Path, task: str) -> pd.DataFrame:
    """One predictions CSV of `task`, checked: UTF-8 CSV with rows; the columns id, the task's text
    columns, label and prediction; ids unique (text, never NaN); a prediction on every row; labels
    on every row or none; labels, predictions and every `prob_*` column finite numbers, labels and
    predictions among the task's labels (classification, binary) or within its range (regression).
    Ids and texts stay text; label, prediction and probabilities are floats (a missing label: NaN)."""
    path = Path(path)
    df = _table(path)
    expected = ["id", *TASKS[task].text_columns, "label", "prediction"]
    missing = [c for c in expected if c not in df.columns]
    if missing:
        raise MinBertError(f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(expected)}, ...); "
                           f"re-run the stage that wrote it")
    if not len(df):
        raise MinBertError(f"{path}: the file has no rows; re-run the stage that wrote it")
    if df["id"].duplicated().any():
        raise MinBertError(f"{path}: id '{df['id'][df['id'].duplicated()].iloc[0]}' appears twice")
    text = df[["label", "prediction"]].copy()
    for column in ["label", "prediction"] + [c for c in df.columns if c.startswith("prob_")]:
        df[column] = _numbers(df, column, path, column)
    _check_values(df, text, path, task)
    labelled(df, path)
    return df
