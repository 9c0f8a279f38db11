"""Combine member experiments' predictions: results/ensembles/N/{predictions/, metrics.json}.

    python -m stages.ensemble --name N [--params params.yaml]
"""
from __future__ import annotations

from minbert.core.io import write_json
from minbert.core.settings import EnsembleSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, folders_of, stage_call
from minbert.scoring.ensemble import ensemble_folder
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line


def main(argv: list[str] | None = None) -> None:
    call = stage_call("ensemble", __doc__, argv, settings=EnsembleSettings)
    s, job = call.settings, call.job
    members = folders_of(job.reads["predictions"])              # each member's folder, in the members' order
    out = folder_of(job.writes["predictions"])
    with running(job, force=call.args.force) as r:
        expected = expected_files(job.writes["predictions"])
        r.fields["files"] = ensemble_folder(dict(zip(s.members, members, strict=True)), out, s.classification,
                                            s.similarity, expected)
        metrics = evaluate_folder(out, expected, call.layout)
        write_json(job.writes["metrics"][0], metrics)
    print(summary_line(call.name, metrics))


if __name__ == "__main__":
    run(main)
