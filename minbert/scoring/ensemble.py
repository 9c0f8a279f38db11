"""Combine the predictions of several experiments (e.g. five seeds, or five dropout settings).

Classification tasks (sst, para):
    mode       the most frequent member prediction; a tie goes to the smallest label
               (so for para an even split counts as "not a paraphrase")
    mean_prob  the class with the highest mean member probability (para: mean prob_1 > 0.5)
Similarity (sts):
    median | mean of the member scores

The written files have the members' format (docs/pipeline.md): probabilities are the members'
mean in both modes, so the report can draw calibration and confusion plots for the ensemble too.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path
from minbert.core.layout import PREDICTED_SPLITS, prediction_file
from minbert.core.tasks import TASKS
from minbert.scoring.predictions import read_predictions


def mode_smallest(votes: np.ndarray) -> np.ndarray:
    """Row-wise mode of integer labels [rows, members]; ties go to the smallest label."""
    votes = votes.astype(np.int64)
    n_labels = int(votes.max()) + 1 if votes.size else 1
    counts = np.zeros((votes.shape[0], n_labels), dtype=np.int64)
    for m in range(votes.shape[1]):
        np.add.at(counts, (np.arange(votes.shape[0]), votes[:, m]), 1)
    return counts.argmax(axis=1)   # argmax returns the first (smallest) label among equal counts


def combine(task: str, frames: list[pd.DataFrame], classification: str = "mode",
            similarity: str = "median") -> pd.DataFrame:
    """One task/split: member frames with the same ids (any order) -> the ensemble's frame."""
    first = frames[0]
    ids = first["id"]
    aligned = [first] + [f.set_index("id").loc[ids].reset_index() for f in frames[1:]]
    out = first[["id", *TASKS[task].text_columns, "label"]].copy()
    preds = np.stack([f["prediction"].to_numpy() for f in aligned], axis=1)   # [rows, members]
    if TASKS[task].kind == "regression":
        out["prediction"] = np.median(preds, axis=1) if similarity == "median" else preds.mean(axis=1)
        return out
    probs = TASKS[task].prob_columns
    have_probs = all(c in f.columns for f in aligned for c in probs)
    mean_probs = (np.mean([f[probs].to_numpy(dtype=float) for f in aligned], axis=0)
                  if have_probs else None)                                     # [rows, len(probs)]
    if classification == "mean_prob":
        if mean_probs is None:
            raise MinBertError(f"{task}: mean_prob needs the members' {', '.join(probs)} columns; "
                               f"use classification: mode")
        pred = (mean_probs[:, 0] > 0.5).astype(int) if TASKS[task].kind == "binary" else mean_probs.argmax(axis=1)
    else:
        pred = mode_smallest(np.rint(preds).astype(int))
    out["prediction"] = pred
    if mean_probs is not None:
        for j, c in enumerate(probs):
            out[c] = mean_probs[:, j]
    return out


def _member_frame(folder: Path, member: str, task: str, split: str) -> pd.DataFrame | None:
    path = Path(prediction_file(folder, task, split))
    return read_predictions(path, task) if path.exists() or path.is_symlink() else None


def ensemble_folder(members: dict[str, Path], out_dir: str | Path, classification: str = "mode",
                    similarity: str = "median", expected: dict[str, list[str]] | None = None) -> list[str]:
    """Write the ensemble's `<task>-<split>.csv` for every task/split all members predicted.

    `members` maps member name -> its predictions folder; `expected` (split -> tasks): the files
    the job declares, each of which every member must have (default: those all members have).
    Returns the files written.
    """
    for name, folder in members.items():
        if not Path(folder).is_dir():
            raise MinBertError(f"{folder}: predictions of ensemble member '{name}' not found; "
                               f"run its predict stage first")
    written = []
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for task in TASKS:
            for split in PREDICTED_SPLITS:
                if expected is not None and task not in expected.get(split, []):
                    continue
                frames = {m: _member_frame(Path(f), m, task, split) for m, f in members.items()}
                if any(f is None for f in frames.values()):
                    if expected is not None:
                        m = next(m for m, f in frames.items() if f is None)
                        raise MinBertError(f"{prediction_file(members[m], task, split)}: predictions file of "
                                           f"ensemble member '{m}' not found; re-run its predict stage")
                    continue   # a task/split not every member predicted is left out
                _check_same_ids(frames, task, split)
                df = combine(task, list(frames.values()), classification, similarity)
                df.to_csv(tmp / f"{task}-{split}.csv", index=False)
                written.append(f"{task}-{split}.csv")
        if not written:
            raise MinBertError(f"the members {', '.join(members)} share no predictions file "
                               f"(<task>-<split>.csv) to combine")
    return written


def _check_same_ids(frames: dict[str, pd.DataFrame], task: str, split: str) -> None:
    names = list(frames)
    ref = set(frames[names[0]]["id"])
    for m in names[1:]:
        ids = set(frames[m]["id"])
        if ids != ref:
            diff = sorted(ids ^ ref)[0]
            raise MinBertError(f"{task}-{split}.csv: members '{names[0]}' and '{m}' predicted different "
                               f"rows (e.g. id '{diff}'); re-run their predict stages on the same data")
        first = frames[names[0]].set_index("id")["label"]
        other = frames[m].set_index("id")["label"].reindex(first.index)
        differ = ~((first == other) | (first.isna() & other.isna()))
        if differ.any():
            rid = differ[differ].index[0]
            raise MinBertError(f"{task}-{split}.csv: members '{names[0]}' and '{m}' give id '{rid}' different labels "
                               f"({first[rid]!r} and {other[rid]!r}); re-run their predict stages on the same data")
