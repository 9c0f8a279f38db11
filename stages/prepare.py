"""prepare: read and validate the raw files, write clean per-task splits to results/data/.

    python -m stages.prepare [--params params.yaml] [--results results]

Reads `data.dir` (CS224N layout) and `data.nli_file` (SNLI/MNLI jsonl), validates every row
(`data.on_bad_rows`: error | drop), splits NLI into train/dev by premise group, and writes
`<task>-<split>.tsv` and `summary.json` (rows read/kept/dropped by reason per file), all at once.
Downsampling is not done here: each later stage applies its own.
"""
from __future__ import annotations

from minbert.core.runtime import setup_logging
from minbert.core.settings import PrepareSettings
from minbert.data.prepare import format_summary, prepare
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call


def main(argv=None) -> None:
    call = stage_call("prepare", __doc__, argv, settings=PrepareSettings)
    setup_logging()
    with running(call.job, force=call.args.force) as r:
        summary = prepare(call.settings, call.job.writes["data"][0])
        r.fields["rows_kept"] = sum(f["rows_kept"] for f in summary["files"].values())
    print(format_summary(summary))


if __name__ == "__main__":
    run(main)
