"""Score a folder of predictions (`<task>-<split>.csv`, see docs/pipeline.md) into metrics.json.

Dev predictions are always scored. A metric that is undefined (Pearson r of constant labels or
predictions) is null, with the reason under `undefined` (and so are `overall` and `mean`), and
a warning is logged. Test predictions are scored only when the file carries labels
(the CS224N SST and STS test files do not): `test` is then null, or holds the tasks that have them.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.layout import prediction_file
from minbert.core.metrics import metric_undefined, summarise, task_metric
from minbert.core.tasks import TASKS
from minbert.data.read import read_split
from minbert.scoring.predictions import labelled, read_predictions

log = logging.getLogger(__name__)


def expected_files(paths) -> dict[str, list[str]]:
    """split -> the tasks whose `<task>-<split>.csv` is among `paths` (a job's declared reads or outputs)."""
    out: dict[str, list[str]] = {}
    for p in paths:
        task, _, split = Path(p).name.removesuffix(".csv").partition("-")
        if Path(p).suffix == ".csv" and task in TASKS and split:
            out.setdefault(split, []).append(task)
    return out


def check_against_split(df: pd.DataFrame, path: Path, task: str, split_path: str | Path) -> None:
    """The predictions of `path` cover the rows of the prepared split they claim (`split_path`): every
    id exactly once (`read_predictions` refuses duplicates), no other id, and the split's labels."""
    split_path = Path(split_path)
    truth = read_split(split_path)
    ids = pd.Index(truth["id"])
    have = pd.Index(df["id"])
    extra = ~have.isin(ids)
    if extra.any():
        row = int(extra.nonzero()[0][0])
        raise MinBertError(f"{path}: line {row + 2}: id '{have[row]}' is not in {split_path} ({int(extra.sum())} such "
                           f"rows); these predictions are from other data: re-run the predict stage")
    missing = ~ids.isin(have)
    if missing.any():
        raise MinBertError(f"{path}: no prediction for id '{ids[int(missing.nonzero()[0][0])]}' of {split_path} "
                           f"({int(missing.sum())} of {len(ids)} rows missing); re-run the predict stage")
    if truth["label"].notna().any():
        want = pd.Series(truth["label"].to_numpy(), index=ids).reindex(have)
        got = df["label"].to_numpy(dtype=float)
        differ = ~np.isclose(got, want.to_numpy(dtype=float), rtol=1e-5, atol=1e-6, equal_nan=True)
        if differ.any():
            row = int(differ.nonzero()[0][0])
            raise MinBertError(f"{path}: line {row + 2}: id '{have[row]}' has label {df['label'].iloc[row]:g}, "
                               f"{split_path} says {want.iloc[row]:g}; re-run the predict stage")


def score_split(folder: str | Path, split: str, tasks=None, layout=None) -> dict | None:
    """Metrics of one split; None when no task has labels. `tasks`: the tasks whose predictions must
    be there (a missing file is an error; default: the tasks present in `folder`); `layout` (a
    minbert.core.layout.Layout): every file is checked against its prepared split (`check_against_split`)."""
    scores: dict = {}
    counts: dict = {}
    undefined: dict = {}          # metric key -> why it is undefined
    for task in (TASKS if tasks is None else tasks):
        path = Path(prediction_file(folder, task, split))
        if not (path.exists() or path.is_symlink()):
            if tasks is None:
                continue
            raise MinBertError(f"{path}: predictions file not found; re-run the predict stage")
        df = read_predictions(path, task)
        if layout is not None:
            check_against_split(df, path, task, layout.split(task, split))
        if not labelled(df, path):
            continue
        key = TASKS[task].metric_key
        scores[key] = task_metric(task, df["prediction"], df["label"])
        if scores[key] is None:
            undefined[key] = f"{path}: {metric_undefined(task, df['prediction'], df['label'])}"
            log.warning("%s is undefined: %s", key, undefined[key])
        counts[task] = len(df)
    if not scores:
        return None
    out = summarise(scores)
    for whole in ("overall", "mean"):
        if whole in out and out[whole] is None:
            undefined[whole] = f"{', '.join(undefined)} undefined"
    return {**out, "n": counts, **({"undefined": undefined} if undefined else {})}


def evaluate_folder(folder: str | Path, expected: dict[str, list[str]] | None = None, layout=None) -> dict:
    """metrics.json content for a predictions folder (an experiment's or an ensemble's).

    `expected` (split -> tasks, see `expected_files`): the files the job declares; each must be
    there, so no task is dropped silently. `layout`: check every file against its prepared split."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinBertError(f"{folder}: predictions folder not found; run the predict stage first")
    if expected is None and not any(Path(prediction_file(folder, t, "dev")).is_file() for t in TASKS):
        raise MinBertError(f"{folder}: no dev predictions (expected files like sst-dev.csv)")
    tasks = (lambda split: None) if expected is None else (lambda split: expected.get(split, []))
    dev = score_split(folder, "dev", tasks("dev"), layout)
    if dev is None:
        raise MinBertError(f"{folder}: the dev predictions carry no labels")
    return {"dev": dev, "test": score_split(folder, "test", tasks("test"), layout)}


def summary_line(name: str, metrics: dict) -> str:
    """One line of dev scores for the terminal, e.g. `a: sst_acc=0.5000, ..., overall=0.7000`."""
    return f"{name}: " + ", ".join(f"{k}={fmt(v)}" for k, v in metrics["dev"].items() if k not in ("n", "undefined"))


def fmt(value) -> str:
    """A metric for the log: 4 decimals, or "undefined"."""
    return "undefined" if value is None else f"{value:.4f}"
