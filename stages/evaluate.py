"""Score an experiment's predictions: results/experiments/E/metrics.json (a DVC metric).

    python -m stages.evaluate --experiment E [--params params.yaml]
"""
from __future__ import annotations

from minbert.core.io import write_json
from minbert.pipeline.runinfo import running
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line

from ._cli import experiment_parser, job, run


def main(argv: list[str] | None = None) -> None:
    args = experiment_parser(__doc__.splitlines()[0]).parse_args(argv)
    the_job, L = job(args, "evaluate", args.experiment)
    with running(the_job):
        # every file the job declares is scored, each checked against the split it claims
        metrics = evaluate_folder(L.predictions(args.experiment), expected_files(the_job.reads), L)
        write_json(L.metrics(args.experiment), metrics)
    print(summary_line(args.experiment, metrics))


if __name__ == "__main__":
    run(main)
