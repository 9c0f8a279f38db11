"""The prepared splits (results/data/<task>-<split>.tsv) that every later stage reads: what each
holds (its columns, how a label is read back), how the prepare stage writes them (`write_split`)
and how every stage reads them (`read_split`, `load_splits`).

The format: tab-separated, UTF-8, a header row, one row per line, no quoting (no text holds a tab or
line break: the raw readers, minbert.data.raw, turn them into spaces or refuse the row). A file that
does not parse is a one-line error saying to re-run the prepare stage.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, read_input
from minbert.core.nli_data import NLI_DATA
from minbert.core.tasks import TASKS, Task

# ---------------------------------------------------------------- the tasks' prepared columns

MAX_FIELD_CHARS = 131072        # a longer field (the csv module's limit) is a bad row, not a text
LINE_BREAKS = re.compile(r"[\t\r\n]")   # never inside a prepared field


@dataclass(frozen=True)
class Prepared:
    """What results/data holds for one source: a task of the registry (minbert.core.tasks) or a
    pretraining source that is no task (NLI): its columns, how a label is read back, the splits
    the prepare stage writes."""
    columns: tuple[str, ...]
    parse: Callable[[str], object]                    # a label's text -> its value, None when invalid
    rule: str                                         # what a label must be, for messages
    dtype: object = None                              # the label column's numpy type (None: as read)
    splits: tuple[str, ...] = ("train", "dev", "test")


# the NLI pretraining's data (minbert.core.nli_data): a source of its own, no task
NLI = Prepared(NLI_DATA.columns, NLI_DATA.label, "one of " + ", ".join(NLI_DATA.labels), splits=NLI_DATA.splits)


def refuse_repeated_columns(where: str, header) -> None:
    """A header that names a column twice is refused in one line (`where`: the file and line): which
    of the two a reader would take is a guess. The one check of every header the pipeline reads: the
    CS224N files, a declared task's files, `minbert predict`'s input."""
    seen = set()
    for name in header:
        if name in seen:
            raise MinBertError(f"{where}: column '{name}' appears twice in the header; keep one")
        seen.add(name)


def prepared(source: str) -> Prepared:
    """What results/data holds for a task of the registry (built in or declared) or for NLI."""
    if NLI_DATA.names(source):
        return NLI
    spec = TASKS[source]
    return Prepared(("id", *spec.text_columns, "label"), partial(parse_label, spec), label_rule(spec),
                    float if spec.kind == "regression" else np.int64, spec.splits)


def prepared_sources() -> list[str]:
    return [*TASKS, NLI_DATA.name]


def output_columns(task: str) -> list[str]:
    return list(prepared(task).columns)


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def parse_label(spec: Task, value: str):
    """The label as int/float, or None when it is not a valid label of the task."""
    if not _NUMBER.fullmatch(value):   # float() would also take "1_0", "٣" or "nan"
        return None
    x = float(value)
    if not math.isfinite(x):
        return None
    if spec.kind != "regression":
        return int(x) if x.is_integer() and int(x) in spec.labels else None
    lo, hi = spec.label_range
    return x if lo <= x <= hi else None


def label_rule(spec: Task) -> str:
    if spec.kind != "regression":
        return "an integer in {" + ", ".join(map(str, spec.labels)) + "}"
    return f"a number from {spec.label_range[0]:g} to {spec.label_range[1]:g}"




# ---------------------------------------------------------------- prepared splits (results/data)


def _task_of(path: Path) -> str:
    task = path.name.split("-", 1)[0]
    if task not in prepared_sources():
        raise MinBertError(f"{path}: cannot tell the task from the file name (expected "
                           f"<task>-<split>.tsv with task one of {', '.join(prepared_sources())})")
    return task


def _cell(value) -> str:
    """One cell of a prepared split: text as is, a missing label empty, a float exactly (repr)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"a prepared split cannot hold the boolean {value!r}")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def write_split(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a prepared split atomically: UTF-8, a header, one row per line, fields separated by
    tabs, no quoting. Text is written as is, so any text round-trips through `read_split` (quotes,
    backslashes, "NA", "null", leading spaces); the readers guarantee that no text holds a tab or a
    line break, and this refuses one that does."""
    path = Path(path)
    columns = [str(c) for c in frame.columns]
    lines = ["\t".join(columns)]
    for row_no, row in enumerate(frame.itertuples(index=False, name=None)):
        cells = [_cell(v) for v in row]
        for name, cell in zip(columns, cells):
            if LINE_BREAKS.search(cell):
                raise ValueError(f"{path}: row {row_no}, column '{name}' holds a tab or line break; the readers "
                                 f"should have removed it")
        lines.append("\t".join(cells))
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(lines) + "\n")


def read_split(path: str | Path) -> pd.DataFrame:
    """Read a prepared results/data/<task>-<split>.tsv (written by `write_split`).

    `id` and text as str (a sentence "NA" stays text); `label` int for sst/para/cfimdb, float for
    sts, str for nli; all NaN when the split has no labels (test). A file that does not parse is
    a one-line error naming the line, saying to re-run the prepare stage.
    """
    path = Path(path)
    task = _task_of(path)
    redo = "re-run the prepare stage (python -m stages.prepare)"
    if not path.exists() and not path.is_symlink():
        raise MinBertError(f"{path}: prepared split not found; run the prepare stage first "
                           f"(python -m stages.prepare)")
    data = read_input(path, "prepared split")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = data.count(b"\n", 0, e.start) + 1
        raise MinBertError(f"{path} line {line_no}: not UTF-8 text (byte {e.start} of the file); {redo}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    source = prepared(task)
    expected = list(source.columns)
    if not lines:
        raise MinBertError(f"{path}: the file is empty; {redo}")
    header = lines[0].split("\t")
    if header != expected:
        raise MinBertError(f"{path}: columns {header[:8]}, expected {expected}; {redo}")
    width = len(expected)
    columns: list[list[str]] = [[] for _ in expected]
    for line_no, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != width or "\r" in line:
            raise MinBertError(f"{path} line {line_no}: {len(fields)} tab-separated fields, expected {width} "
                               f"({', '.join(expected)}); {redo}")
        for store, value in zip(columns, fields):
            store.append(value)
    return _checked(pd.DataFrame(dict(zip(expected, columns)), columns=expected), source, f"{path}", redo)


def _checked(frame: pd.DataFrame, source: Prepared, where: str, redo: str) -> pd.DataFrame:
    """A prepared split's rows as read (text): ids and texts not empty, each id once, labels on every
    row or on none (then NaN), each a label of the source, in its type."""
    for name in frame.columns[:-1]:
        empty = [i for i, v in enumerate(frame[name]) if not v.strip()]
        if empty:
            raise MinBertError(f"{where} line {empty[0] + 2}: column '{name}' is empty; {redo}")
    dup = frame["id"].duplicated()
    if dup.any():
        i = int(dup.to_numpy().nonzero()[0][0])
        raise MinBertError(f"{where} line {i + 2}: id {frame['id'][i]} appears twice; {redo}")
    raw_labels = list(frame["label"])
    has = [v != "" for v in raw_labels]
    if not any(has):
        frame["label"] = np.nan
        return frame
    if not all(has):
        i = has.index(False)
        raise MinBertError(f"{where} line {i + 2}: no label while other rows have one; {redo}")
    labels = []
    for i, v in enumerate(raw_labels):
        x = source.parse(v)
        if x is None:
            raise MinBertError(f"{where} line {i + 2}: label {v!r} is not {source.rule}; {redo}")
        labels.append(x)
    frame["label"] = labels if source.dtype is None else np.array(labels, dtype=source.dtype)
    return frame


def load_splits(data_dir: str | Path, task: str, splits=("train", "dev", "test")) -> dict[str, pd.DataFrame]:
    """The `splits` of `task` from the prepared folder. Every split the prepare stage writes must be
    there (a folder with some of them missing is a broken one); a split it never writes (nli has no
    test) is left out of the result."""
    if task not in prepared_sources():
        raise MinBertError(f"unknown task '{task}' (expected one of {', '.join(prepared_sources())})")
    data_dir = Path(data_dir)
    written = prepared(task).splits
    wanted = [s for s in splits if s in written]
    found = {split: data_dir / f"{task}-{split}.tsv" for split in wanted}
    present = {s: p for s, p in found.items() if p.exists() or p.is_symlink()}
    again = " with data.include_cfimdb: true" if task == "cfimdb" else ""
    if not present:
        raise MinBertError(f"{data_dir}: no prepared {task} data ({task}-train.tsv ...); run the "
                           f"prepare stage first (python -m stages.prepare){again}")
    absent = [p for s, p in found.items() if s not in present]
    if absent:
        raise MinBertError(f"{absent[0]}: prepared split not found while other {task} splits are there; re-run "
                           f"the prepare stage (python -m stages.prepare){again}")
    return {s: read_split(p) for s, p in found.items()}
