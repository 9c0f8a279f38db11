"""Score an experiment's predictions: results/experiments/E/metrics.json (a DVC metric).

    python -m stages.evaluate --experiment E [--params params.yaml]
"""
from __future__ import annotations

from pathlib import Path

from minbert.evaluate import evaluate_folder, summary_line
from minbert.io import write_json
from minbert.params import load_params

from ._cli import parser, run

RESULTS = Path("results")


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--experiment", required=True, help="the experiment name in params.yaml")
    p.add_argument("--results", default=str(RESULTS), help="the results folder (default: results)")
    a = p.parse_args(argv)
    load_params(a.params).experiment(a.experiment)   # fails early on an unknown name
    folder = Path(a.results) / "experiments" / a.experiment
    metrics = evaluate_folder(folder / "predictions")
    write_json(folder / "metrics.json", metrics)
    print(summary_line(a.experiment, metrics))


if __name__ == "__main__":
    run(main)
