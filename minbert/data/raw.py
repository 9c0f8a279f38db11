"""Reading and validating the raw task files: what the prepare stage alone runs.

Raw input comes in two formats:

- the CS224N layout: tab-separated lines, a header row, a leading unnamed index column, then `id`
  and the task's columns (`ids-sst-*.csv`, `ids-cfimdb-*.csv`, `quora-*.csv`, `sts-*.csv`); the
  test-student files carry no label column (and the SST/CFIMDB ones an extra unnamed column).
  One line is one row, with exactly the header's number of fields; a wholly quoted field is
  unquoted as the csv module would, any other quote is text (`unquote_field`);
- SNLI / MNLI jsonl: `sentence1`, `sentence2`, `gold_label`, and `captionID` (SNLI) or
  `promptID` (MNLI) naming the premise group. Rows labelled "-" (no annotator majority) are
  always dropped, and counted.

`read_cs224n` / `read_nli` validate every row: bad rows either raise a one-line MinBertError
naming file, line and column (`on_bad_rows="error"`), or are dropped and counted by reason
(`"drop"`). The prepare stage writes the clean splits with minbert.data.read.write_split, which
every later stage reads back. docs/failures.md lists every check.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.datasets import RAW_SPLITS, raw_path  # noqa: F401  (the prepare stage's, named there)
from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, read_input
from minbert.core.nli_data import NLI_DATA
from minbert.core.tasks import TASKS, Task
from minbert.data.read import (
    LINE_BREAKS,
    MAX_FIELD_CHARS,
    label_rule,
    output_columns,
    parse_label,
    refuse_repeated_columns,
)


def class_label(spec: Task, value: str):
    """A raw label: a class's number (or a regression label), or a class's name; None when invalid."""
    if spec.classes and value in spec.classes:
        return spec.classes.index(value)
    return parse_label(spec, value)


# ---------------------------------------------------------------- reports of what was read


@dataclass
class FileReport:
    """What reading one raw file did: the prepare stage's summary.json is a list of these."""
    source: str
    read: int = 0
    kept: int = 0
    dropped: dict = field(default_factory=dict)   # reason -> count

    def as_dict(self) -> dict:
        return {"source": self.source, "rows_read": self.read, "rows_kept": self.kept,
                "rows_dropped": sum(self.dropped.values()), "dropped_by_reason": dict(self.dropped)}


class BadRows:
    """Collects bad rows: raises at the first one (mode "error") or counts them (mode "drop")."""

    def __init__(self, path: Path, mode: str):
        if mode not in ("error", "drop"):
            raise MinBertError(f"data.on_bad_rows must be 'error' or 'drop' (got {mode!r})")
        self.path, self.mode, self.reasons = path, mode, Counter()

    def __call__(self, line: int, reason: str, what: str) -> None:
        if self.mode == "error":
            raise MinBertError(f"{self.path} line {line}: {what}; fix the file or set "
                               f"data.on_bad_rows: drop to drop such rows")
        self.reasons[reason] += 1


# ---------------------------------------------------------------- decoding

def decoded_lines(path: Path, bad: BadRows, header: bool = True) -> tuple[list[str], list[int]]:
    """The file's lines as text, with their 1-based line numbers.

    Lines end with "\n" or "\r\n"; a file with no "\n" at all but "\r" uses old Mac line endings
    and is split at "\r". Lines that are not UTF-8 are bad rows (reason "encoding") and left out;
    so are lines holding a NUL byte or a carriage return inside the line ("control_character").
    Empty lines are left out. With `header`, a first line that cannot be read is an error.
    """
    data = read_input(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise MinBertError(f"{path}: the file is UTF-16 text; save it as UTF-8")
    cr_only = b"\n" not in data and b"\r" in data
    raw_lines = data.split(b"\r" if cr_only else b"\n")
    lines, numbers = [], []
    for i, raw in enumerate(raw_lines, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip() and b"\t" not in raw:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if header and not lines:
                raise MinBertError(f"{path} line {i}: the header is not UTF-8 text ({e.reason}); "
                                   f"save the file as UTF-8") from None
            bad(i, "encoding", f"not UTF-8 text at byte {e.start} ({e.reason}); save the file as UTF-8")
            continue
        for char, name in (("\x00", "a NUL byte"), ("\r", "a carriage return")):
            if char in text:
                why = "binary data?" if char == "\x00" else "mixed line endings?"
                what = f"{name} at character {text.index(char) + 1} ({why}); remove it"
                if header and not lines:
                    raise MinBertError(f"{path} line {i}: the header holds {what}")
                bad(i, "control_character", f"the line holds {what}")
                break
        else:
            lines.append(text)
            numbers.append(i)
    return lines, numbers


# ---------------------------------------------------------------- CS224N layout

def unquote_field(field: str) -> str:
    """A field of a CS224N file as text.

    The files are tab-separated lines; a field that is wholly enclosed in double quotes with every
    quote inside doubled (`"a ""b"" c"`) is a quoted text, as the csv module and pandas write it,
    and is unquoted (`a "b" c`). Any other quote is an ordinary character, and a record
    never continues on the next line, so a stray quote cannot merge rows.
    """
    if len(field) >= 2 and field[0] == '"' and field[-1] == '"':
        inner = field[1:-1]
        if '"' not in inner.replace('""', ""):
            return inner.replace('""', '"')
    return field


def _header(path: Path, line: str, required: list[str]) -> dict[str, int]:
    header = [unquote_field(h).strip() for h in line.split("\t")]
    missing = [c for c in required if c not in header]
    if missing:
        hint = ("; the file is not tab-separated (it looks comma-separated)"
                if len(header) == 1 and "," in line else "")
        raise MinBertError(f"{path}: missing column '{missing[0]}' (header has: "
                           f"{', '.join(repr(h) for h in header)}){hint}; expected the CS224N layout "
                           f"with columns {', '.join(required)}")
    refuse_repeated_columns(f"{path} line 1", header)
    return {c: header.index(c) for c in required}


def read_cs224n(path: str | Path, task: str, labelled: bool = True,
                on_bad_rows: str = "error") -> tuple[pd.DataFrame, FileReport]:
    """Read and validate one CS224N-layout file.

    Returns the clean rows with the columns of `output_columns(task)` (label None when not
    `labelled`) and the report of rows read, kept and dropped by reason. Every line is one row
    with exactly as many tab-separated fields as the header (see `unquote_field` for quotes).
    """
    if task not in TASKS:
        raise MinBertError(f"unknown task '{task}' (expected one of {', '.join(TASKS)})")
    spec, path = TASKS[task], Path(path)
    bad = BadRows(path, on_bad_rows)
    lines, numbers = decoded_lines(path, bad)
    if not lines:
        raise MinBertError(f"{path}: the file is empty; expected a header row and data rows")
    label_column = spec.raw_label_column if labelled else None
    col = _header(path, lines[0], ["id", *spec.raw_text_columns] + ([label_column] if labelled else []))
    width = lines[0].count("\t") + 1
    if len(lines) == 1 and not bad.reasons:
        raise MinBertError(f"{path}: the file has a header row but no data rows")
    rows = Rows(spec, spec.raw_text_columns, label_column, bad)
    for line, text in zip(numbers[1:], lines[1:]):
        fields = _fields(text, width, line, bad)
        if fields is not None:
            rows.add(line, {c: fields[i] for c, i in col.items()})
    frame = rows.frame(output_columns(task))
    n_read = len(lines) - 1 + bad.reasons.get("encoding", 0) + bad.reasons.get("control_character", 0)
    report = FileReport(str(path), read=n_read, kept=len(frame), dropped=dict(bad.reasons))
    assert report.kept + sum(bad.reasons.values()) == report.read
    return frame, report


def _fields(text: str, width: int, line: int, bad: BadRows) -> list[str] | None:
    """A line's tab-separated fields, unquoted; None (a bad row) with another count or a field too long."""
    fields = text.split("\t")
    if len(fields) != width:
        quote = " (a tab inside a quoted text is not allowed)" if '"' in text else ""
        bad(line, "field_count", f"{len(fields)} tab-separated fields, the header has {width}{quote}")
        return None
    long = [i for i, f in enumerate(fields) if len(f) > MAX_FIELD_CHARS]
    if long:
        bad(line, "field_too_long", f"field {long[0] + 1} has {len(fields[long[0]]):,} characters, more "
                                    f"than {MAX_FIELD_CHARS:,} (a broken line?)")
        return None
    return [unquote_field(f) for f in fields]


class Rows:
    """A task's rows as they are read: each row's id, texts and label checked (the bad-row rules:
    an empty id, text or label, a label the task does not have, an id given twice), the good ones
    kept in order."""

    def __init__(self, spec: Task, text_columns, label_column: str | None, bad: BadRows,
                 group_column: str | None = None):
        self.spec, self.text_columns, self.label_column, self.bad = spec, tuple(text_columns), label_column, bad
        self.group_column = group_column
        self.ids: list[str] = []
        self.texts: list[list[str]] = [[] for _ in self.text_columns]
        self.labels: list = []
        self.groups: list[str] = []
        self.seen: dict[str, int] = {}

    def add(self, line: int, values: dict[str, str]) -> None:
        """One row from its values by raw column name (the id under `id`)."""
        bad, spec = self.bad, self.spec
        rid = values["id"].strip()
        if not rid:
            return bad(line, "missing_id", "column 'id' is empty")
        texts = [values[c].strip() for c in self.text_columns]
        empty = [c for c, t in zip(self.text_columns, texts) if not t]
        if empty:
            return bad(line, "empty_text", f"column '{empty[0]}' is empty (id {rid})")
        label = None
        if self.label_column is not None:
            raw_label = values[self.label_column].strip()
            if not raw_label:
                return bad(line, "missing_label", f"column '{self.label_column}' is empty (id {rid})")
            label = class_label(spec, raw_label)
            if label is None:
                named = f" or a class name ({', '.join(spec.classes)})" if spec.classes else ""
                return bad(line, "bad_label", f"column '{self.label_column}' is {raw_label!r}, expected "
                                              f"{label_rule(spec)}{named} (id {rid})")
        if rid in self.seen:
            return bad(line, "duplicate_id", f"column 'id': {rid} already appears on line {self.seen[rid]}")
        self.seen[rid] = line
        self.ids.append(rid)
        for store, text in zip(self.texts, texts):
            store.append(text)
        self.labels.append(label)
        if self.group_column is not None:
            self.groups.append(values[self.group_column].strip())

    def frame(self, names: list[str]) -> pd.DataFrame:
        """The kept rows under the prepared split's column names (`id`, the texts, `label`)."""
        frame = pd.DataFrame({names[0]: self.ids, **dict(zip(names[1:-1], self.texts)), "label": self.labels})
        if self.label_column is not None:
            frame["label"] = frame["label"].astype(float if self.spec.kind == "regression" else int)
        return frame


# ---------------------------------------------------------------- SNLI / MNLI jsonl


def _nli_text(rec: dict, key: str) -> tuple[str | None, str, str]:
    """(text, reason, what): the text of `key`, or None with the bad-row reason and message."""
    value = rec.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "empty_text", f"'{key}' is missing or empty"
    if not isinstance(value, str):
        return None, "not_text", f"'{key}' is {type(value).__name__} {json.dumps(value)[:40]}, not a string"
    if "\x00" in value:
        return None, "control_character", f"'{key}' holds a NUL character"
    if len(value) > MAX_FIELD_CHARS:
        return None, "field_too_long", f"'{key}' has {len(value):,} characters, more than {MAX_FIELD_CHARS:,}"
    # tabs and line breaks are whitespace to a BERT tokenizer; the prepared splits hold one row per line
    return LINE_BREAKS.sub(" ", value).strip(), "", ""


def _nli_key(value) -> str | None:
    """A captionID / promptID / pairID as text; None when absent, empty or not a string or integer."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    value = LINE_BREAKS.sub(" ", str(value)).strip()
    return value or None


class _RepeatedKey(ValueError):
    pass


def _unique(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _RepeatedKey(k)
        out[k] = v
    return out


def json_object(text: str, line_no: int, bad: BadRows) -> dict | None:
    """One line of a JSON-lines file as its object; a line that is not valid JSON or not an object is
    a bad row (`invalid_json`), and so is an object that gives a key twice (JSON would keep the last,
    silently): None."""
    try:
        record = json.loads(text, object_pairs_hook=_unique)
    except _RepeatedKey as e:
        bad(line_no, "invalid_json", f"key '{e.args[0]}' is given twice in one object")
        return None
    except (json.JSONDecodeError, RecursionError) as e:
        bad(line_no, "invalid_json", f"not valid JSON ({getattr(e, 'msg', 'nested too deeply')})")
        return None
    if not isinstance(record, dict):
        bad(line_no, "invalid_json", "expected a JSON object per line")
        return None
    return record


def read_nli(path: str | Path, on_bad_rows: str = "error") -> tuple[pd.DataFrame, FileReport]:
    """Read SNLI/MNLI jsonl: columns id, group, sentence1, sentence2, label.

    `group` is the premise's captionID (SNLI) or promptID (MNLI); `id` the pairID when present.
    Rows with gold_label "-" are dropped as "no_gold_label" in both modes (that is how SNLI marks
    pairs without annotator agreement, not an error). Tabs and line breaks inside a sentence become
    spaces (a BERT tokenizer reads them as spaces anyway).
    """
    path = Path(path)
    bad = BadRows(path, on_bad_rows)
    lines, numbers = decoded_lines(path, bad, header=False)
    if not lines and not bad.reasons:
        raise MinBertError(f"{path}: the file is empty; expected one JSON object per line (SNLI/MNLI jsonl)")
    rows, reasons_extra = [], Counter()
    seen_ids: dict[str, int] = {}
    n_read = bad.reasons.get("encoding", 0) + bad.reasons.get("control_character", 0)
    for line_no, text in zip(numbers, lines):
        n_read += 1
        if len(text) > 8 * MAX_FIELD_CHARS:
            bad(line_no, "field_too_long", f"the line has {len(text):,} characters (a broken file?)")
            continue
        rec = json_object(text, line_no, bad)
        if rec is None:
            continue
        label = rec.get("gold_label")
        if label == "-":
            reasons_extra["no_gold_label"] += 1
            continue
        group = _nli_key(rec.get("captionID"))
        if group is None:
            group = _nli_key(rec.get("promptID"))
        if group is None:
            bad(line_no, "missing_group", "no 'captionID' (SNLI) or 'promptID' (MNLI) string or integer")
            continue
        (s1, r1, w1), (s2, r2, w2) = _nli_text(rec, "sentence1"), _nli_text(rec, "sentence2")
        if s1 is None or s2 is None:
            reason, what = (r1, w1) if s1 is None else (r2, w2)
            bad(line_no, reason, what)
            continue
        if not isinstance(label, str) or NLI_DATA.label(label) is None:
            bad(line_no, "bad_label", f"'gold_label' is {label!r}, expected one of {', '.join(NLI_DATA.labels)} or '-'")
            continue
        raw_id = rec.get("pairID")
        rid = f"{path.stem}-{line_no}" if raw_id is None else _nli_key(raw_id)
        if rid is None:
            bad(line_no, "missing_id", f"'pairID' is {raw_id!r}, expected a non-empty string or integer")
            continue
        if rid in seen_ids:
            bad(line_no, "duplicate_id", f"'pairID' {rid} already appears on line {seen_ids[rid]}")
            continue
        seen_ids[rid] = line_no
        rows.append((rid, group, s1, s2, label))
    frame = pd.DataFrame(rows, columns=list(NLI_DATA.columns))
    dropped = dict(bad.reasons) | dict(reasons_extra)
    return frame, FileReport(str(path), read=n_read, kept=len(frame), dropped=dropped)


def split_by_group(frame: pd.DataFrame, dev_fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split NLI rows into train/dev by premise group (no premise in both), seeded and stable."""
    groups = np.array(sorted(frame["group"].unique()))
    if len(groups) < 2:
        raise MinBertError(f"data.nli_file: the NLI data has {len(groups)} premise group(s) (captionID or "
                           f"promptID); need at least 2 to split off a dev set (or set data.nli_file: null)")
    rng = np.random.default_rng(seed)
    n_dev = min(len(groups) - 1, max(1, round(dev_fraction * len(groups))))
    dev_groups = set(rng.permutation(groups)[:n_dev])
    is_dev = frame["group"].isin(dev_groups)
    return frame[~is_dev].reset_index(drop=True), frame[is_dev].reset_index(drop=True)


def write_cs224n(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a raw file in the CS224N layout (leading unnamed index column), atomically."""
    with atomic_path(path) as tmp:
        frame.reset_index(drop=True).to_csv(tmp, sep="\t", index=True, encoding="utf-8", lineterminator="\n")
