"""Combine member experiments' predictions: results/ensembles/N/{predictions/, metrics.json}.

    python -m stages.ensemble --name N [--params params.yaml]
"""
from __future__ import annotations

from minbert.core.io import write_json
from minbert.params.settings import EnsembleSettings
from minbert.pipeline.runinfo import running
from minbert.scoring.ensemble import ensemble_folder
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line

from ._cli import job, parser, run


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="the ensemble name in params.yaml")
    args = p.parse_args(argv)
    the_job, L = job(args, "ensemble", args.name)
    s = EnsembleSettings(**the_job.settings)
    with running(the_job) as r:
        members = {m: L.predictions(m) for m in s.members}
        expected = expected_files(the_job.outs)
        r.fields["files"] = ensemble_folder(members, L.ensemble_predictions(args.name), s.classification, s.similarity,
                                            expected)
        metrics = evaluate_folder(L.ensemble_predictions(args.name), expected, L)
        write_json(L.ensemble_metrics(args.name), metrics)
    print(summary_line(args.name, metrics))


if __name__ == "__main__":
    run(main)
