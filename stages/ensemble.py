"""Combine member experiments' predictions: results/ensembles/N/{predictions/, metrics.json, run.json}.

    python -m stages.ensemble --name N [--params params.yaml]
"""
from __future__ import annotations

from pathlib import Path

from minbert.ensemble import ensemble_folder
from minbert.evaluate import evaluate_folder, summary_line
from minbert.io import write_json
from minbert.params import load_params
from minbert.runinfo import recorded_run

from ._cli import parser, run

RESULTS = Path("results")


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="the ensemble name in params.yaml")
    p.add_argument("--results", default=str(RESULTS), help="the results folder (default: results)")
    a = p.parse_args(argv)
    ens = load_params(a.params).ensemble(a.name)
    results = Path(a.results)
    out = results / "ensembles" / a.name
    members = {m: results / "experiments" / m / "predictions" for m in ens.members}
    with recorded_run(out / "run.json", "ensemble", a.name, members=ens.members,
                      classification=ens.classification, similarity=ens.similarity) as info:
        info["files"] = ensemble_folder(members, out / "predictions", ens.classification, ens.similarity)
        metrics = evaluate_folder(out / "predictions")
        write_json(out / "metrics.json", metrics)
    print(summary_line(a.name, metrics))


if __name__ == "__main__":
    run(main)
