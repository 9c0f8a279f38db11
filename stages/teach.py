"""A teacher's outputs on the training data, for the experiments that distil from it.

    python -m stages.teach --name T [--params params.yaml]

T is an experiment, a repeated experiment or an ensemble that some experiment names in
`finetune.distill.teacher`. Writes results/teachers/T/<task>-train.csv: every training row's id and
the teacher's class probabilities (sst, para) or score (sts), averaged over its models.
"""
from __future__ import annotations

from minbert.core.runtime import setup_logging
from minbert.entry import run
from minbert.params.settings import TeachSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call
from minbert.train.distill import teach


def main(argv: list[str] | None = None) -> None:
    call = stage_call("teach", __doc__, argv, named="name",
                      name_help="the teacher: an experiment or ensemble a student distils from")
    s, L = TeachSettings(**call.job.settings), call.layout
    models = {m: L.model(m, stage) for m, stage in s.members.items()}
    setup_logging()
    with running(call.job, s, force=call.args.force) as r:
        records = {m: L.run_record(stage, m) for m, stage in s.members.items()}
        r.fields["rows"] = teach(s, models, L.data, L.teacher(call.name), records)
    print(f"teacher '{call.name}' ({len(s.members)} model(s)) wrote {L.teacher(call.name)}")


if __name__ == "__main__":
    run(main)
