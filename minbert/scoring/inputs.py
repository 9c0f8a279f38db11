"""New text a trained model is asked about, checked once for `minbert predict` and `minbert.api`:
the columns the tasks read are there, and every text they read is a string, not blank, and at most
MAX_TEXT_CHARS long. A failure is one MinBertError naming where the row came from (a file and the
line it starts on, or the API's row number) and what to do, in the same words for both."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.tasks import Task
from minbert.data.read import refuse_repeated_columns

SINGLE, PAIR = ["sentence"], ["sentence1", "sentence2"]
# the longest text predicted, as for the pipeline's data files (minbert.data.read.MAX_FIELD_CHARS): the
# model reads at most max_length (<= 512) word pieces, and tokenising megabytes to keep a few would
# cost seconds and gigabytes
MAX_TEXT_CHARS = 131072


@dataclass(frozen=True)
class Origin:
    """Where rows came from, as messages name it: a file (or <stdin>) with the line each row starts
    on, or, without `lines`, what the API was given (its rows numbered from 0, as a list is)."""
    name: str
    lines: Sequence[int] | None = None

    def row(self, k: int) -> str:
        return f"{self.name}:{self.lines[k]}" if self.lines is not None else f"{self.name}: row {k}"

    @property
    def header(self) -> str:
        return f"{self.name}:1" if self.lines is not None else self.name


def text_columns(specs: Iterable[Task]) -> list[str]:
    """The text columns the tasks (their declarations) read, in the order a file has them."""
    specs = list(specs)
    return [c for c in SINGLE + PAIR if any(c in (PAIR if s.pair else SINGLE) for s in specs)]


def tasks_for(origin: Origin, columns, tasks: list[str] | None, model_tasks: Mapping[str, Task]) -> list[str]:
    """The tasks to predict for an input with these columns: those asked (each must fit the columns),
    or every task of the model (`model_tasks`: name -> declaration, from its registry) that the columns
    fit; a one-line error when they do not fit."""
    columns = [str(c) for c in columns]
    refuse_repeated_columns(origin.header, columns)
    cols, shown = set(columns), ", ".join(columns) or "none"
    pair, single = set(PAIR) <= cols, "sentence" in cols
    if tasks:
        for t in tasks:
            if model_tasks[t].pair and not pair:
                missing = " or ".join(repr(c) for c in PAIR if c not in cols)
                raise MinBertError(f"{origin.header}: {t} reads sentence pairs but the input has no column {missing} "
                                   f"(columns: {shown}); name the columns sentence1 and sentence2")
            if not model_tasks[t].pair and not single:
                hint = (f"{t} reads one sentence per row, but this is a pair file (sentence1, sentence2); give a "
                        f"'sentence' column, or ask for a pair task (para, sts)") if pair else \
                    f"no column 'sentence' (columns: {shown}); name the text column sentence"
                raise MinBertError(f"{origin.header}: {hint}")
        return list(tasks)
    fitting = [t for t, spec in model_tasks.items() if (pair if spec.pair else single)]
    if not fitting:
        kinds = "sentence pairs (sentence1, sentence2)" if any(s.pair for s in model_tasks.values()) else ""
        ones = "one sentence (sentence)" if any(not s.pair for s in model_tasks.values()) else ""
        raise MinBertError(f"{origin.header}: the model's tasks ({', '.join(model_tasks)}) read "
                           f"{' or '.join(x for x in (ones, kinds) if x)}; the input's columns are {shown}: name "
                           f"them so, or pass --task")
    return fitting


def _kind(value) -> str:
    name = type(value.item() if hasattr(value, "item") and not isinstance(value, str) else value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def check_texts(origin: Origin, frame: pd.DataFrame, columns: list[str]) -> None:
    """Every text in `columns` is a string, not blank, and at most MAX_TEXT_CHARS long (a missing
    value, None or NaN, is an empty text); else a one-line error at the first row that is not."""
    for c in columns:
        values = frame[c]
        if values.empty:
            continue
        is_text = values.map(lambda v: isinstance(v, str)).astype(bool)
        empty = values.isna() | (is_text & values.where(is_text, "").str.strip().eq(""))
        if empty.any():
            k = int(empty.to_numpy().argmax())
            raise MinBertError(f"{origin.row(k)}: empty text in column '{c}'; fill it or remove the row")
        if not is_text.all():
            k = int((~is_text).to_numpy().argmax())
            value = values.iloc[k]
            raise MinBertError(f"{origin.row(k)}: the text in column '{c}' is {_kind(value)} ({str(value)[:40]!r}), "
                               f"not a string; give every text as a string")
        long = values.str.len().gt(MAX_TEXT_CHARS)
        if long.any():
            k = int(long.to_numpy().argmax())
            raise MinBertError(f"{origin.row(k)}: the text in column '{c}' has {len(values.iloc[k]):,} characters, "
                               f"more than {MAX_TEXT_CHARS:,} (a broken line?); the model reads only its first few "
                               f"hundred word pieces: shorten it or split it into rows")
