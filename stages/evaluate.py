"""Score an experiment's predictions: results/experiments/E/metrics.json (a DVC metric).

    python -m stages.evaluate --experiment E [--params params.yaml]
"""
from __future__ import annotations

from minbert.core.io import write_json
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, stage_call
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line


def main(argv: list[str] | None = None) -> None:
    call = stage_call("evaluate", __doc__, argv)
    predictions = call.job.reads["predictions"]
    with running(call.job, force=call.args.force):
        # every file the job declares is scored, each checked against the split it claims
        metrics = evaluate_folder(folder_of(predictions), expected_files(predictions), call.layout)
        write_json(call.job.writes["metrics"][0], metrics)
    print(summary_line(call.name, metrics))


if __name__ == "__main__":
    run(main)
