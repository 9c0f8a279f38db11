"""Reading the files of a task a params file declares (`tasks:`, docs/extending.md): CSV or TSV with
a header row, or JSON lines, their columns named by the declaration. The prepare stage's alone.

Every row goes through the bad-row rules of the CS224N reader (minbert.data.raw.Rows: an empty id,
text or label, a label the task does not have, an id given twice; a line that is not UTF-8 or holds
a NUL byte; a field over the size limit): an error naming the file and line, or a dropped row
counted by reason (`data.on_bad_rows`). A CSV field may be quoted and span lines; tabs and line
breaks inside a text become spaces (a BERT tokenizer reads them as spaces; in the prepared split
they would end the row). A label is a class's name or number, or a number in a regression task's
range. Without an id column a row's id is its file's split and line number.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import read_input
from minbert.core.tasks import Task
from minbert.data.raw import BadRows, FileReport, Rows, decoded_lines, json_object
from minbert.data.read import LINE_BREAKS, MAX_FIELD_CHARS, output_columns, refuse_repeated_columns


def _text(value) -> str | None:
    """A JSON value as a field: text as is, a number as written; None for anything else."""
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def _records_csv(path: Path, delimiter: str, bad: BadRows, columns: list[str]):
    """(line, {column: text}) per data row of a CSV/TSV file with a header row."""
    data = read_input(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if "\x00" in text:
        raise MinBertError(f"{path}: the file holds a NUL byte (binary data?); save it as text")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise MinBertError(f"{path}: the file is empty; expected a header row and data rows") from None
    refuse_repeated_columns(f"{path} line 1", header)
    missing = [c for c in columns if c not in header]
    if missing:
        raise MinBertError(f"{path}: no column '{missing[0]}' (the header has {', '.join(map(repr, header[:12]))}); "
                           f"fix the file or the task's `files` in params")
    index = {c: header.index(c) for c in columns}
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            bad(reader.line_num, "invalid_csv", f"not valid CSV ({e})")
            continue
        if not fields:
            continue
        if len(fields) != len(header):
            bad(reader.line_num, "field_count", f"{len(fields)} fields, the header has {len(header)}")
            continue
        yield reader.line_num, {c: fields[i] for c, i in index.items()}


def _records_jsonl(path: Path, bad: BadRows, columns: list[str]):
    lines, numbers = decoded_lines(path, bad, header=False)
    if not lines and not bad.reasons:
        raise MinBertError(f"{path}: the file is empty; expected one JSON object per line")
    for line, text in zip(numbers, lines):
        record = json_object(text, line, bad)
        if record is None:
            continue
        values = {c: _text(record.get(c)) for c in columns}
        wrong = [c for c, v in values.items() if v is None and record.get(c) is not None]
        if wrong:
            bad(line, "not_text", f"key '{wrong[0]}' is {type(record[wrong[0]]).__name__}, not a text or number")
            continue
        yield line, {c: v or "" for c, v in values.items()}


def read_declared(spec: Task, split: str, on_bad_rows: str = "error", labelled: bool = True
                  ) -> tuple[pd.DataFrame, FileReport, list[str]]:
    """The rows of `spec`'s `split` file: (the prepared split's columns, what reading did, each kept
    row's group when the task declares a group column)."""
    path = Path(spec.files[split])
    if not (path.exists() or path.is_symlink()):
        raise MinBertError(f"{path}: file not found (task {spec.name}'s {split} file); fix tasks.{spec.name}.files")
    bad = BadRows(path, on_bad_rows)
    label = spec.raw_label_column if labelled else None
    columns = list(spec.raw_text_columns) + [c for c in (label, spec.id_column, spec.group_column) if c]
    records = (_records_jsonl(path, bad, columns) if spec.format == "jsonl" else
               _records_csv(path, "\t" if spec.format == "tsv" else ",", bad, columns))
    rows = Rows(spec, spec.raw_text_columns, label, bad, spec.group_column)
    read = 0
    for line, values in records:
        read += 1
        long = [c for c, v in values.items() if len(v) > MAX_FIELD_CHARS]
        if long:
            bad(line, "field_too_long", f"column '{long[0]}' has {len(values[long[0]]):,} characters, more than "
                                        f"{MAX_FIELD_CHARS:,}")
            continue
        values = {c: LINE_BREAKS.sub(" ", v) for c, v in values.items()}
        values["id"] = values[spec.id_column] if spec.id_column else f"{split}-{line}"
        rows.add(line, values)
    frame = rows.frame(output_columns(spec.name))
    n_read = read + bad.reasons.get("encoding", 0) + bad.reasons.get("control_character", 0)
    return frame, FileReport(str(path), read=n_read, kept=len(frame), dropped=dict(bad.reasons)), rows.groups


def held_out(frame: pd.DataFrame, groups: list[str], fraction: float, seed: int
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, dev): a seeded share of the rows held out as dev, every row of a group on one side
    (no groups: each row its own)."""
    keys = np.array(groups if groups else list(frame["id"]))
    distinct = np.array(sorted(set(keys)))
    if len(distinct) < 2:
        raise MinBertError(f"{len(distinct)} group(s) of rows: a dev split needs at least 2 (give a dev file)")
    n_dev = min(len(distinct) - 1, max(1, round(fraction * len(distinct))))
    dev_keys = set(np.random.default_rng(seed).permutation(distinct)[:n_dev])
    is_dev = np.array([k in dev_keys for k in keys])
    return frame[~is_dev].reset_index(drop=True), frame[is_dev].reset_index(drop=True)
