"""The prepare stage's library: read and validate the raw files, write the clean per-task splits.

`raw_inputs` lists the files `prepare` reads (the job's inputs come from it too); `prepare` writes
`<task>-<split>.tsv` for every task and split (the built-in tasks' from the CS224N files in
`data.dir`, a declared task's from its own files: minbert.data.declared), `nli-{train,dev}.tsv` and
`summary.json` into a temporary sibling of the output folder and renames it into place when all of
it is written, so a failure never leaves new files beside stale ones.
"""
from __future__ import annotations

import logging
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, write_json
from minbert.core.nli_data import NLI_DATA
from minbert.core.settings import PrepareSettings, in_own_registry
from minbert.core.tasks import LEADERBOARD_TASKS
from minbert.data.declared import held_out, read_declared
from minbert.data.overlap import OVERLAP_WARNING, overlap_warnings, overlap_with_train
from minbert.data.raw import RAW_SPLITS, raw_path, read_cs224n, read_nli, split_by_group
from minbert.data.read import write_split

log = logging.getLogger(__name__)


def prepared_tasks(data: PrepareSettings) -> tuple[str, ...]:
    return LEADERBOARD_TASKS + (("cfimdb",) if data.include_cfimdb else ()) + tuple(data.tasks)


def raw_inputs(data: PrepareSettings) -> list[str]:
    """Every raw file prepare reads, as given in the params (relative paths stay relative)."""
    files = [raw_path(data.dir, task, split).as_posix() for task in prepared_tasks(data) for split in RAW_SPLITS
             if data.registry.tasks[task].format == "cs224n"]
    files += [Path(f).as_posix() for task in data.tasks for f in data.registry.tasks[task].files.values()]
    return files + ([Path(data.nli_file).as_posix()] if data.nli_file else [])


def prepared_files(data: PrepareSettings) -> list[str]:
    """The files `prepare` writes into its folder, by name."""
    names = [f"{task}-{split}.tsv" for task in prepared_tasks(data) for split in data.registry.tasks[task].splits]
    return names + (list(NLI_DATA.files) if data.nli_file else []) + ["summary.json"]


def _declared_splits(task: str, data: PrepareSettings) -> dict:
    """A declared task's splits: {split: (frame, what reading did, source)}; a dev split held out of
    the training rows when it names no dev file, and no test split when it names no test file."""
    spec, out = data.registry.tasks[task], {}
    train, report, groups = read_declared(spec, "train", data.on_bad_rows)
    if "dev" in spec.files:
        out["dev"] = read_declared(spec, "dev", data.on_bad_rows)[:2] + (spec.files["dev"],)
    else:
        try:
            train, dev = held_out(train, groups, spec.dev_fraction, data.seed)
        except MinBertError as e:
            raise MinBertError(f"{spec.files['train']}: task {task}'s dev split: {e}") from None
        out["dev"] = (dev, {**report.as_dict(), "rows_kept": len(dev), "note": "dev_fraction of the training file"},
                      spec.files["train"])
        report = {**report.as_dict(), "rows_kept": len(train), "note": "the training file less its dev_fraction"}
    out["train"] = (train, report, spec.files["train"])
    if "test" in spec.files:
        out["test"] = read_declared(spec, "test", data.on_bad_rows, labelled=False)[:2] + (spec.files["test"],)
    return {s: out[s] for s in spec.splits}


def _splits(task: str, data: PrepareSettings, data_dir: Path) -> dict:
    """{split: (frame, what reading did, source)} of one task."""
    if data.registry.tasks[task].format != "cs224n":
        return _declared_splits(task, data)
    out = {}
    for split in RAW_SPLITS:
        src = raw_path(data_dir, task, split)
        if not (src.exists() or src.is_symlink()):   # anything else: the reader says why
            raise MinBertError(f"{src}: file not found; data.dir must hold {src.name}"
                               + (" (or set data.include_cfimdb: false)" if task == "cfimdb" else ""))
        frame, report = read_cs224n(src, task, labelled=split != "test", on_bad_rows=data.on_bad_rows)
        out[split] = (frame, report, src)
    return out


@in_own_registry
def prepare(data: PrepareSettings, out: str | Path) -> dict:
    """Read, validate and write every split; return the summary (also written to summary.json)."""
    data_dir = Path(data.dir)
    if not data_dir.is_dir():
        raise MinBertError(f"data.dir: folder '{data_dir}' not found; point it at a folder in the "
                           f"CS224N layout (e.g. data/demo, or one written by python -m stages.fetch_data)")
    files: dict[str, dict] = {}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        for task in prepared_tasks(data):
            train = None
            for split, (frame, report, src) in _splits(task, data, data_dir).items():
                if len(frame) == 0:
                    raise MinBertError(f"{src}: no valid rows left after validation")
                write_split(frame, tmp / f"{task}-{split}.tsv")
                files[f"{task}-{split}.tsv"] = report if isinstance(report, dict) else report.as_dict()
                if split == "train":
                    train = (frame, src)
                elif train is not None:
                    shared = overlap_with_train(task, train[0], frame)
                    files[f"{task}-{split}.tsv"]["overlap_with_train"] = {
                        "rows": shared, "of": len(frame), "share": round(shared / len(frame), 4),
                        "warn": shared / len(frame) > OVERLAP_WARNING, "source": str(src), "train": str(train[1])}
        if data.nli_file is not None:
            src = Path(data.nli_file)
            frame, report = read_nli(src, on_bad_rows=data.on_bad_rows)
            if len(frame) == 0:
                raise MinBertError(f"{src}: no valid NLI rows left after validation")
            train, dev = split_by_group(frame, data.nli_dev_fraction, data.seed)
            for split, part in (("train", train), ("dev", dev)):
                write_split(part, tmp / NLI_DATA.file(split))
                files[NLI_DATA.file(split)] = {**report.as_dict(), "rows_kept": len(part),
                                                      "note": f"{split} part of the split by premise group"}
        summary = {"data_dir": str(data_dir), "nli_file": data.nli_file, "on_bad_rows": data.on_bad_rows,
                   "files": files}
        write_json(tmp / "summary.json", summary)
    for warning in overlap_warnings(summary):
        log.warning(warning)
    return summary


def format_summary(summary: dict) -> str:
    rows = [("file", "read", "kept", "dropped", "reasons")]
    for name, f in summary["files"].items():
        reasons = ", ".join(f"{k}={v}" for k, v in f["dropped_by_reason"].items()) or "-"
        rows.append((name, str(f["rows_read"]), str(f["rows_kept"]), str(f["rows_dropped"]), reasons))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join([r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in (1, 2, 3)), r[4]])
                     for r in rows)
