"""Reading, validating and downsampling the task data.

Raw input comes in two formats:

- the CS224N layout: tab-separated, a header row, a leading unnamed index column, then `id` and
  the task's columns (`ids-sst-*.csv`, `ids-cfimdb-*.csv`, `quora-*.csv`, `sts-*.csv`); the
  test-student files carry no label column (and the SST/CFIMDB ones an extra unnamed column);
- SNLI / MNLI jsonl: `sentence1`, `sentence2`, `gold_label`, and `captionID` (SNLI) or
  `promptID` (MNLI) naming the premise group. Rows labelled "-" (no annotator majority) are
  always dropped, and counted.

`read_cs224n` / `read_nli` validate every row: bad rows either raise a one-line MinBertError
naming file, line and column (`on_bad_rows="error"`), or are dropped and counted by reason
(`"drop"`). The prepare stage writes the clean splits as `results/data/<task>-<split>.tsv`;
every later stage reads them back with `read_split` / `load_splits`.
"""
from __future__ import annotations

import csv
import json
import math
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import MinBertError
from .io import atomic_path

# ---------------------------------------------------------------- the tasks' files and columns


@dataclass(frozen=True)
class TaskSpec:
    name: str               # task name in results/data (sst, cfimdb, para, sts)
    file_prefix: str        # raw CS224N file prefix: <prefix>-{train,dev,test-student}.csv
    text_columns: tuple     # raw text columns, renamed to sentence / sentence1, sentence2
    label_column: str       # raw label column (absent in test-student files)
    label_kind: str         # "int" (with `labels`) or "float" (with `label_range`)
    labels: tuple = ()
    label_range: tuple = ()


TASK_SPECS = {
    "sst": TaskSpec("sst", "ids-sst", ("sentence",), "sentiment", "int", labels=(0, 1, 2, 3, 4)),
    "cfimdb": TaskSpec("cfimdb", "ids-cfimdb", ("sentence",), "sentiment", "int", labels=(0, 1)),
    "para": TaskSpec("para", "quora", ("sentence1", "sentence2"), "is_duplicate", "int", labels=(0, 1)),
    "sts": TaskSpec("sts", "sts", ("sentence1", "sentence2"), "similarity", "float", label_range=(0.0, 5.0)),
}
NLI_LABELS = ("entailment", "neutral", "contradiction")
ALL_TASKS = ("sst", "para", "sts", "cfimdb", "nli")
RAW_SPLITS = {"train": "train", "dev": "dev", "test": "test-student"}   # our split -> file suffix


def raw_path(data_dir: str | Path, task: str, split: str) -> Path:
    """Where the raw CS224N file of `task`/`split` lives, e.g. data/demo/ids-sst-test-student.csv."""
    return Path(data_dir) / f"{TASK_SPECS[task].file_prefix}-{RAW_SPLITS[split]}.csv"


def output_columns(task: str) -> list[str]:
    if task == "nli":
        return ["id", "group", "sentence1", "sentence2", "label"]
    texts = ["sentence"] if len(TASK_SPECS[task].text_columns) == 1 else ["sentence1", "sentence2"]
    return ["id", *texts, "label"]


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


class _BadRows:
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


def _decoded_lines(path: Path, bad: _BadRows) -> tuple[list[str], list[int]]:
    """The file's lines as text, with their 1-based line numbers; lines that are not UTF-8 are
    bad rows (reason "encoding") and left out."""
    if not path.is_file():
        raise MinBertError(f"{path}: file not found")
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines, numbers = [], []
    for i, raw in enumerate(data.split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r"))
            numbers.append(i)
        except UnicodeDecodeError as e:
            if i == 1:
                raise MinBertError(f"{path} line 1: the header is not UTF-8 text ({e.reason}); "
                                   f"save the file as UTF-8") from None
            bad(i, "encoding", f"not UTF-8 text at byte {e.start} ({e.reason}); save the file as UTF-8")
    if lines and lines[-1] == "":
        lines.pop()
        numbers.pop()
    return lines, numbers


# ---------------------------------------------------------------- CS224N layout


def _parse_label(spec: TaskSpec, value: str):
    """The label as int/float, or None when it is not a valid label of the task."""
    try:
        x = float(value)
    except ValueError:
        return None
    if not math.isfinite(x):
        return None
    if spec.label_kind == "int":
        return int(x) if x.is_integer() and int(x) in spec.labels else None
    lo, hi = spec.label_range
    return x if lo <= x <= hi else None


def _label_rule(spec: TaskSpec) -> str:
    if spec.label_kind == "int":
        return "an integer in {" + ", ".join(map(str, spec.labels)) + "}"
    return f"a number from {spec.label_range[0]:g} to {spec.label_range[1]:g}"


def read_cs224n(path: str | Path, task: str, labelled: bool = True,
                on_bad_rows: str = "error") -> tuple[pd.DataFrame, FileReport]:
    """Read and validate one CS224N-layout file.

    Returns the clean rows with the columns of `output_columns(task)` (label None when not
    `labelled`) and the report of rows read, kept and dropped by reason.
    """
    if task not in TASK_SPECS:
        raise MinBertError(f"unknown task '{task}' (expected one of {', '.join(TASK_SPECS)})")
    spec, path = TASK_SPECS[task], Path(path)
    bad = _BadRows(path, on_bad_rows)
    lines, numbers = _decoded_lines(path, bad)
    if not lines:
        raise MinBertError(f"{path}: the file is empty; expected a header row and data rows")
    header = next(csv.reader([lines[0]], delimiter="\t"))
    required = ["id", *spec.text_columns] + ([spec.label_column] if labelled else [])
    missing = [c for c in required if c not in header]
    if missing:
        raise MinBertError(f"{path}: missing column '{missing[0]}' (header has: "
                           f"{', '.join(repr(h) for h in header)}); expected the CS224N layout "
                           f"with columns {', '.join(required)}")
    width = len(header)
    col = {c: header.index(c) for c in required}

    out = {"id": [], "text": [[] for _ in spec.text_columns], "label": []}
    seen_ids: dict[str, int] = {}
    n_read = 0
    # csv.reader with the csv module's default quoting, as the CS224N starter code reads these files
    reader = csv.reader(lines[1:], delimiter="\t")
    for fields in reader:
        n_read += 1
        line = numbers[reader.line_num]   # where the record ends (a quoted field may span lines)
        if len(fields) > width:
            bad(line, "field_count", f"{len(fields)} tab-separated fields, the header has {width}")
            continue
        fields = fields + [""] * (width - len(fields))
        rid = fields[col["id"]].strip()
        if not rid:
            bad(line, "missing_id", "column 'id' is empty")
            continue
        texts = [fields[col[c]].strip() for c in spec.text_columns]
        empty = [c for c, t in zip(spec.text_columns, texts) if not t]
        if empty:
            bad(line, "empty_text", f"column '{empty[0]}' is empty (id {rid})")
            continue
        label = None
        if labelled:
            raw_label = fields[col[spec.label_column]].strip()
            if not raw_label:
                bad(line, "missing_label", f"column '{spec.label_column}' is empty (id {rid})")
                continue
            label = _parse_label(spec, raw_label)
            if label is None:
                bad(line, "bad_label", f"column '{spec.label_column}' is {raw_label!r}, expected "
                                       f"{_label_rule(spec)} (id {rid})")
                continue
        if rid in seen_ids:
            bad(line, "duplicate_id", f"column 'id': {rid} already appears on line {seen_ids[rid]}")
            continue
        seen_ids[rid] = line
        out["id"].append(rid)
        for store, t in zip(out["text"], texts):
            store.append(t)
        out["label"].append(label)

    names = output_columns(task)
    frame = pd.DataFrame({names[0]: out["id"], **{n: t for n, t in zip(names[1:-1], out["text"])},
                          "label": out["label"]})
    if labelled:
        frame["label"] = frame["label"].astype(int if spec.label_kind == "int" else float)
    n_dropped = sum(bad.reasons.values())
    n_read += bad.reasons.get("encoding", 0)   # undecodable lines never reach the csv reader
    report = FileReport(str(path), read=n_read, kept=len(frame), dropped=dict(bad.reasons))
    assert report.kept + n_dropped == report.read
    return frame, report


# ---------------------------------------------------------------- SNLI / MNLI jsonl


def read_nli(path: str | Path, on_bad_rows: str = "error") -> tuple[pd.DataFrame, FileReport]:
    """Read SNLI/MNLI jsonl: columns id, group, sentence1, sentence2, label.

    `group` is the premise's captionID (SNLI) or promptID (MNLI); `id` the pairID when present.
    Rows with gold_label "-" are dropped as "no_gold_label" in both modes (that is how SNLI marks
    pairs without annotator agreement, not an error).
    """
    path = Path(path)
    bad = _BadRows(path, on_bad_rows)
    lines, numbers = _decoded_lines(path, bad)
    rows, reasons_extra = [], Counter()
    seen_ids: dict[str, int] = {}
    n_read = bad.reasons.get("encoding", 0)
    for line_no, text in zip(numbers, lines):
        if not text.strip():
            continue
        n_read += 1
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as e:
            bad(line_no, "invalid_json", f"not valid JSON ({e.msg})")
            continue
        if not isinstance(rec, dict):
            bad(line_no, "invalid_json", "expected a JSON object per line")
            continue
        label = rec.get("gold_label")
        if label == "-":
            reasons_extra["no_gold_label"] += 1
            continue
        group = rec.get("captionID") or rec.get("promptID")
        s1, s2 = (str(rec.get(k) or "").strip() for k in ("sentence1", "sentence2"))
        if group is None or str(group).strip() == "":
            bad(line_no, "missing_group", "no 'captionID' (SNLI) or 'promptID' (MNLI)")
            continue
        if not s1 or not s2:
            bad(line_no, "empty_text", f"'{'sentence1' if not s1 else 'sentence2'}' is missing or empty")
            continue
        if label not in NLI_LABELS:
            bad(line_no, "bad_label", f"'gold_label' is {label!r}, expected one of {', '.join(NLI_LABELS)} or '-'")
            continue
        rid = str(rec.get("pairID") or f"{path.stem}-{line_no}")
        if rid in seen_ids:
            bad(line_no, "duplicate_id", f"'pairID' {rid} already appears on line {seen_ids[rid]}")
            continue
        seen_ids[rid] = line_no
        rows.append((rid, str(group), s1, s2, label))
    frame = pd.DataFrame(rows, columns=output_columns("nli"))
    dropped = dict(bad.reasons) | dict(reasons_extra)
    return frame, FileReport(str(path), read=n_read, kept=len(frame), dropped=dropped)


def split_by_group(frame: pd.DataFrame, dev_fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split NLI rows into train/dev by premise group (no premise in both), seeded and stable."""
    groups = np.array(sorted(frame["group"].unique()))
    if len(groups) < 2:
        raise MinBertError(f"NLI data has {len(groups)} premise group(s); need at least 2 to split "
                           f"off a dev set")
    rng = np.random.default_rng(seed)
    n_dev = min(len(groups) - 1, max(1, round(dev_fraction * len(groups))))
    dev_groups = set(rng.permutation(groups)[:n_dev])
    is_dev = frame["group"].isin(dev_groups)
    return frame[~is_dev].reset_index(drop=True), frame[is_dev].reset_index(drop=True)


# ---------------------------------------------------------------- prepared splits (results/data)


def _task_of(path: Path) -> str:
    task = path.name.split("-", 1)[0]
    if task not in ALL_TASKS:
        raise MinBertError(f"{path}: cannot tell the task from the file name (expected "
                           f"<task>-<split>.tsv with task one of {', '.join(ALL_TASKS)})")
    return task


def write_cs224n(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a raw file in the CS224N layout (leading unnamed index column), atomically."""
    with atomic_path(path) as tmp:
        frame.reset_index(drop=True).to_csv(tmp, sep="\t", index=True, encoding="utf-8", lineterminator="\n")


def write_split(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a prepared split (tab-separated, header, no index) atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, encoding="utf-8", lineterminator="\n")


def read_split(path: str | Path) -> pd.DataFrame:
    """Read a prepared results/data/<task>-<split>.tsv.

    `id` (and text) as str; `label` int for sst/para/cfimdb, float for sts, str for nli; all
    NaN when the split has no labels (test).
    """
    path = Path(path)
    task = _task_of(path)
    if not path.is_file():
        raise MinBertError(f"{path}: prepared split not found; run the prepare stage first "
                           f"(python -m stages.prepare)")
    try:
        # keep_default_na=False: a sentence such as "NA" or "null" stays text
        frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, encoding="utf-8")
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise MinBertError(f"{path}: not a prepared split ({str(e).splitlines()[0]}); "
                           f"re-run the prepare stage") from None
    expected = output_columns(task)
    if list(frame.columns) != expected:
        raise MinBertError(f"{path}: columns {list(frame.columns)}, expected {expected}; "
                           f"re-run the prepare stage")
    labels = frame["label"].replace("", np.nan)
    if task == "nli":
        frame["label"] = labels
    elif labels.isna().all():
        frame["label"] = np.nan
    elif labels.isna().any():
        raise MinBertError(f"{path}: some rows have a label and some do not; re-run the prepare stage")
    else:
        frame["label"] = labels.astype(float) if task == "sts" else labels.astype(float).astype(int)
    return frame


def load_splits(data_dir: str | Path, task: str) -> dict[str, pd.DataFrame]:
    """{"train", "dev", "test"} of `task` that exist in the prepared folder (nli: train, dev)."""
    if task not in ALL_TASKS:
        raise MinBertError(f"unknown task '{task}' (expected one of {', '.join(ALL_TASKS)})")
    data_dir = Path(data_dir)
    found = {split: data_dir / f"{task}-{split}.tsv" for split in ("train", "dev", "test")}
    found = {s: p for s, p in found.items() if p.is_file()}
    if not found:
        raise MinBertError(f"{data_dir}: no prepared {task} data ({task}-train.tsv ...); run the "
                           f"prepare stage first (python -m stages.prepare)"
                           + (" with data.include_cfimdb: true" if task == "cfimdb" else ""))
    return {s: read_split(p) for s, p in found.items()}


# ---------------------------------------------------------------- downsampling


def target_sizes(sizes: dict[str, int], spec) -> dict[str, int]:
    """Rows to keep per task: `spec.mode` (none | smallest | fixed), then the per-task caps."""
    if spec.mode == "none":
        out = dict(sizes)
    elif spec.mode == "smallest":
        smallest = min(sizes.values()) if sizes else 0
        out = {t: smallest for t in sizes}
    elif spec.mode == "fixed":
        out = {t: min(n, spec.size) for t, n in sizes.items()}
    else:
        raise MinBertError(f"downsample.mode: unknown mode {spec.mode!r} (none, smallest or fixed)")
    for task, cap in (spec.caps or {}).items():
        if task in out:
            out[task] = min(out[task], cap)
    return out


def _task_seed(seed: int, task: str) -> list[int]:
    # per-task stream: the rows kept for one task do not depend on the other tasks or dict order
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(task.encode("utf-8"))]


def downsample(frames: dict[str, pd.DataFrame], spec, seed: int) -> dict[str, pd.DataFrame]:
    """Subsample each task's frame per `spec` (a minbert.params.Downsample), seeded and stable.

    The kept rows are the first n of a seeded permutation of the task's rows, returned in their
    original order: same seed, same rows; a smaller n keeps a subset of a larger n's rows.
    """
    sizes = {t: len(f) for t, f in frames.items()}
    targets = target_sizes(sizes, spec)
    out = {}
    for task, frame in frames.items():
        n = targets[task]
        if n >= len(frame):
            out[task] = frame
            continue
        order = np.random.default_rng(_task_seed(seed, task)).permutation(len(frame))
        keep = np.sort(order[:n])
        out[task] = frame.iloc[keep].reset_index(drop=True)
    return out
