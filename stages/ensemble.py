"""Combine member experiments' predictions: results/ensembles/N/{predictions/, metrics.json}.

    python -m stages.ensemble --name N [--params params.yaml]
"""
from __future__ import annotations

from minbert.core.io import write_json
from minbert.entry import run
from minbert.params.settings import EnsembleSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call
from minbert.scoring.ensemble import ensemble_folder
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line


def main(argv: list[str] | None = None) -> None:
    call = stage_call("ensemble", __doc__, argv, named="name", name_help="the ensemble name in params.yaml")
    s, L, name = EnsembleSettings(**call.job.settings), call.layout, call.name
    with running(call.job, force=call.args.force) as r:
        expected = expected_files(call.job.outs)
        r.fields["files"] = ensemble_folder({m: L.predictions(m) for m in s.members}, L.ensemble_predictions(name),
                                            s.classification, s.similarity, expected)
        metrics = evaluate_folder(L.ensemble_predictions(name), expected, L)
        write_json(L.ensemble_metrics(name), metrics)
    print(summary_line(name, metrics))


if __name__ == "__main__":
    run(main)
