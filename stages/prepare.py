"""prepare: read and validate the raw files, write clean per-task splits to results/data/.

    python -m stages.prepare [--params params.yaml] [--out results/data]

Reads `data.dir` (CS224N layout) and `data.nli_file` (SNLI/MNLI jsonl), validates every row
(`data.on_bad_rows`: error | drop), splits NLI into train/dev by premise group, and writes
`<task>-<split>.tsv`, `summary.json` (rows read/kept/dropped by reason per file) and `run.json`.
Downsampling is not done here: each later stage applies its own.
"""
from __future__ import annotations

from pathlib import Path

from minbert.data import RAW_SPLITS, raw_path, read_cs224n, read_nli, split_by_group, write_split
from minbert.errors import MinBertError
from minbert.io import write_json
from minbert.params import DataParams, load_params
from minbert.runinfo import recorded_run

from ._cli import parser, run

MAIN_TASKS = ("sst", "para", "sts")


def prepare(data: DataParams, out: str | Path) -> dict:
    """Read, validate and write every split; return the summary (also written to summary.json)."""
    out = Path(out)
    data_dir = Path(data.dir)
    if not data_dir.is_dir():
        raise MinBertError(f"data.dir: folder '{data_dir}' not found; point it at a folder in the "
                           f"CS224N layout (e.g. data/demo, or one written by python -m stages.fetch_data)")
    tasks = MAIN_TASKS + (("cfimdb",) if data.include_cfimdb else ())
    files: dict[str, dict] = {}
    for task in tasks:
        for split in RAW_SPLITS:
            src = raw_path(data_dir, task, split)
            if not src.is_file():
                raise MinBertError(f"{src}: file not found; data.dir must hold {src.name}"
                                   + (" (or set data.include_cfimdb: false)" if task == "cfimdb" else ""))
            frame, report = read_cs224n(src, task, labelled=split != "test", on_bad_rows=data.on_bad_rows)
            if len(frame) == 0:
                raise MinBertError(f"{src}: no valid rows left after validation")
            write_split(frame, out / f"{task}-{split}.tsv")
            files[f"{task}-{split}.tsv"] = report.as_dict()
    if data.nli_file is not None:
        src = Path(data.nli_file)
        frame, report = read_nli(src, on_bad_rows=data.on_bad_rows)
        if len(frame) == 0:
            raise MinBertError(f"{src}: no valid NLI rows left after validation")
        train, dev = split_by_group(frame, data.nli_dev_fraction, data.seed)
        for split, part in (("train", train), ("dev", dev)):
            write_split(part, out / f"nli-{split}.tsv")
            files[f"nli-{split}.tsv"] = {**report.as_dict(), "rows_kept": len(part),
                                         "note": f"{split} part of the split by premise group"}
    summary = {"data_dir": str(data_dir), "nli_file": data.nli_file, "on_bad_rows": data.on_bad_rows,
               "files": files}
    write_json(out / "summary.json", summary)
    return summary


def format_summary(summary: dict) -> str:
    rows = [("file", "read", "kept", "dropped", "reasons")]
    for name, f in summary["files"].items():
        reasons = ", ".join(f"{k}={v}" for k, v in f["dropped_by_reason"].items()) or "-"
        rows.append((name, str(f["rows_read"]), str(f["rows_kept"]), str(f["rows_dropped"]), reasons))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join([r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in (1, 2, 3)), r[4]])
                     for r in rows)


def main(argv=None) -> None:
    p = parser("Read, validate and write the task splits.")
    p.add_argument("--out", default="results/data", help="output folder (default: results/data)")
    args = p.parse_args(argv)
    data = load_params(args.params).params.data
    out = Path(args.out)
    with recorded_run(out / "run.json", "prepare") as info:
        summary = prepare(data, out)
        info["rows_kept"] = sum(f["rows_kept"] for f in summary["files"].values())
    print(format_summary(summary))


if __name__ == "__main__":
    run(main)
