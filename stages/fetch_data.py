"""fetch_data: download the full data sets from the Hugging Face Hub into the CS224N layout.

    python -m stages.fetch_data --out DIR [--datasets sst,qqp,stsb,snli,mnli]

| name | Hub dataset | writes |
|---|---|---|
| sst  | SetFit/sst5 | ids-sst-{train,dev,test-student}.csv |
| qqp  | nyu-mll/glue (qqp) | quora-{train,dev,test-student}.csv |
| stsb | nyu-mll/glue (stsb) | sts-{train,dev,test-student}.csv |
| snli | stanfordnlp/snli | nli-snli.jsonl (train split) |
| mnli | nyu-mll/multi_nli | nli-mnli.jsonl (train split) |

Hub validation splits become `dev`; test splits become the unlabelled `test-student` files.
Then point `data.dir` at DIR (and `data.nli_file` at DIR/nli-snli.jsonl). Needs the network;
offline it fails with a message saying how to supply the files instead.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import write_text
from minbert.core.outputs import writable_folder
from minbert.core.tasks import TASKS
from minbert.data.raw import RAW_SPLITS, raw_path, write_cs224n
from minbert.entry import run


@dataclass(frozen=True)
class Source:
    repo_id: str
    patterns: tuple          # allow_patterns for snapshot_download
    task: str | None         # the task whose CS224N files it becomes (minbert.core.tasks); None: NLI jsonl
    columns: tuple           # its Hub columns: the task's texts in order, then the label

    def raw_columns(self) -> dict:
        """Hub column -> the raw file's column (the task's raw text columns, then its label column)."""
        spec = TASKS[self.task]
        return dict(zip(self.columns, (*spec.raw_text_columns, spec.raw_label_column)))


SOURCES = {
    "sst": Source("SetFit/sst5", ("*.jsonl", "*.parquet", "*.csv"), "sst", ("text", "label")),
    "qqp": Source("nyu-mll/glue", ("qqp/*",), "para", ("question1", "question2", "label")),
    "stsb": Source("nyu-mll/glue", ("stsb/*",), "sts", ("sentence1", "sentence2", "label")),
    "snli": Source("stanfordnlp/snli", ("*train*",), None, ("premise", "hypothesis", "label")),
    "mnli": Source("nyu-mll/multi_nli", ("*train*",), None, ("premise", "hypothesis", "label")),
}
SPLIT_NAMES = {"train": "train", "validation": "dev", "dev": "dev", "test": "test"}   # Hub split -> ours
NLI_LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}   # the Hub's ClassLabel order; -1: "-"


def download(repo_id: str, patterns: tuple, cache_dir: str | None = None) -> Path:
    """Fetch the dataset files matching `patterns` from the Hub; return the local snapshot folder."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id, repo_type="dataset", allow_patterns=list(patterns),
                                      cache_dir=cache_dir))
    except Exception as e:   # offline, DNS, HTTP, missing repo: all mean "cannot fetch"
        raise MinBertError(
            f"cannot download {repo_id} from the Hugging Face Hub ({type(e).__name__}); fetch_data "
            f"needs network access. Without a network, put files in the CS224N layout "
            f"(ids-sst-*.csv, quora-*.csv, sts-*.csv) in a folder and set data.dir to it") from None


def read_table(path: Path) -> pd.DataFrame:
    if path.suffix not in (".parquet", ".jsonl", ".json", ".csv", ".tsv"):
        raise MinBertError(f"{path}: unsupported file type (expected parquet, jsonl or csv)")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=True)
        return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",", keep_default_na=False)
    except Exception as e:   # truncated download, HTML error page, wrong format: the same advice
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise MinBertError(f"{path}: the downloaded file cannot be read ({type(e).__name__}: {reason}); delete it "
                           f"from the Hugging Face cache and run fetch_data again") from None


_LINE_BREAKS = re.compile(r"[\t\r\n]+")


def clean_text(value) -> str:
    """A Hub text as one CS224N field: tabs and line breaks become spaces (a BERT tokenizer reads them
    as spaces anyway; in the file they would split the row), a missing text becomes empty (the
    prepare stage then reports the row as empty_text)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return _LINE_BREAKS.sub(" ", str(value))


def split_files(folder: Path, patterns: tuple = ("*",)) -> dict[str, list[Path]]:
    """The downloaded data files matching `patterns` grouped by our split name (train, dev, test). A
    snapshot folder holds every config fetched so far (glue: qqp and stsb), so the patterns must
    filter again."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in (".parquet", ".jsonl", ".json", ".csv", ".tsv"):
            continue
        if not any(fnmatch.fnmatch(path.relative_to(folder).as_posix(), p) for p in patterns):
            continue
        stem = path.name.split(".")[0].split("-")[0].lower()
        split = SPLIT_NAMES.get(stem)
        if split is not None:
            found.setdefault(split, []).append(path)
    return found


def _stable_id(*parts) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()[:25]


def convert(name: str, folder: Path, out: Path) -> list[Path]:
    """Turn one downloaded dataset into CS224N-layout files (or NLI jsonl) under `out`."""
    src = SOURCES[name]
    files = split_files(folder, src.patterns)
    needed = ("train",) if src.task is None else tuple(RAW_SPLITS)
    missing = [s for s in needed if s not in files]
    if missing:
        raise MinBertError(f"{src.repo_id}: no {missing[0]} split among the downloaded files in {folder}")
    written = []
    for split in needed:
        frame = pd.concat([read_table(p) for p in files[split]], ignore_index=True)
        absent = [c for c in src.columns if c not in frame.columns]
        if absent:
            raise MinBertError(f"{src.repo_id} {split}: no column '{absent[0]}' (has {list(frame.columns)})")
        if src.task is None:
            written.append(_write_nli(name, frame, out / f"nli-{name}.jsonl"))
            continue
        table = frame[list(src.columns)].rename(columns=src.raw_columns())
        label = TASKS[src.task].raw_label_column
        for column in table.columns:
            if column != label:
                table[column] = table[column].map(clean_text)
        ids = frame["idx"] if "idx" in frame.columns else pd.Series(range(len(frame)))
        table.insert(0, "id", [_stable_id(name, split, i) for i in ids])
        if split == "test":
            table = table.drop(columns=[label])
        elif name == "qqp":
            table[label] = table[label].astype(float)
        path = raw_path(out, src.task, split)
        write_cs224n(table, path)
        written.append(path)
    return written


def _write_nli(name: str, frame: pd.DataFrame, path: Path) -> Path:
    # SNLI on the Hub has no captionID: the premise text identifies the premise group
    group = frame["promptID"].astype(str) if "promptID" in frame.columns else \
        frame["premise"].map(lambda s: "p" + hashlib.sha1(clean_text(s).encode()).hexdigest()[:12])
    pair = frame["pairID"].astype(str) if "pairID" in frame.columns else \
        pd.Series([f"{name}-{i}" for i in range(len(frame))])
    key = "promptID" if name == "mnli" else "captionID"
    lines = []
    for g, p, s1, s2, lab in zip(group, pair, frame["premise"], frame["hypothesis"], frame["label"]):
        lab = NLI_LABELS.get(int(lab), "-") if isinstance(lab, (int, float)) and lab == lab else "-"
        lines.append(json.dumps({key: g, "pairID": p, "sentence1": clean_text(s1), "sentence2": clean_text(s2),
                                 "gold_label": lab}))
    write_text(path, "\n".join(lines) + "\n")
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Download SST-5, QQP, STS-B, SNLI, MNLI into the CS224N layout.")
    p.add_argument("--out", required=True, help="output folder (then set data.dir to it)")
    p.add_argument("--datasets", default="sst,qqp,stsb,snli,mnli",
                   help="comma-separated subset of: " + ", ".join(SOURCES))
    p.add_argument("--cache-dir", default=None, help="Hugging Face cache folder (default: the hub's)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        raise MinBertError(f"--datasets: unknown dataset '{unknown[0] if unknown else ''}' "
                           f"(choose from {', '.join(SOURCES)})")
    out = Path(args.out)
    writable_folder(out, "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (PermissionError, NotADirectoryError, FileExistsError) as e:
        raise MinBertError(f"--out: cannot create the folder {out} ({e.strerror}); choose another --out") from None
    if not os.access(out, os.W_OK):
        raise MinBertError(f"--out: the folder {out} is not writable; choose another --out")
    for name in names:
        src = SOURCES[name]
        folder = download(src.repo_id, src.patterns, args.cache_dir)
        for path in convert(name, folder, out):
            print(path)


if __name__ == "__main__":
    run(main)
