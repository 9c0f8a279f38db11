"""Rows a dev or test split shares with its train split: prepare counts them into summary.json, and
the log and the report warn when they are many (scores on such a split are inflated)."""
from __future__ import annotations

import pandas as pd

from minbert.core.tasks import TASKS

# the share of a dev or test split's rows found in the train split above which its scores are
# said to be inflated (the CS224N files share 0-2%: a few sentences occur in both by chance)
OVERLAP_WARNING = 0.05


def _text_keys(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    key = frame[columns[0]].str.lower()
    for c in columns[1:]:
        key = key.str.cat(frame[c].str.lower(), sep="\t")       # no text holds a tab (the readers)
    return key


def overlap_with_train(task: str, train: pd.DataFrame, other: pd.DataFrame) -> int:
    """How many rows of `other` (a dev or test split) have a text (a pair, in either order) that a
    train row has too, case aside: rows the model has trained on."""
    columns = list(TASKS[task].text_columns)
    seen = set(_text_keys(train, columns))
    found = _text_keys(other, columns).isin(seen)
    if len(columns) == 2:
        found |= _text_keys(other, columns[::-1]).isin(seen)
    return int(found.sum())


def overlap_warnings(summary: dict) -> list[str]:
    """One sentence per prepared split that shares more than OVERLAP_WARNING of its rows with its
    train split (from summary.json), for the log and the report."""
    out = []
    for name, f in (summary.get("files") or {}).items():
        o = f.get("overlap_with_train") if isinstance(f, dict) else None
        if isinstance(o, dict) and o.get("warn"):
            split = name.removesuffix(".tsv").rpartition("-")[2]
            out.append(f"{o.get('source', name)}: {o['rows']:,} of {o['of']:,} {split} rows ({o['share']:.0%}) are also "
                       f"in the train file {o.get('train', '')} (same text): {split} scores of every experiment "
                       f"overstate how the models do on unseen text; use a {split} file apart from the train file")
    return out
