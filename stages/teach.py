"""A teacher's outputs on the training data, for the experiments that distil from it.

    python -m stages.teach --name T [--params params.yaml]

T is an experiment, a repeated experiment or an ensemble that some experiment names in
`finetune.distill.teacher`. Writes results/teachers/T/<task>-train.csv: every training row's id and
the teacher's class probabilities (sst, para) or score (sts), averaged over its models.
"""
from __future__ import annotations

from minbert.core.runtime import setup_logging
from minbert.core.settings import TeachSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, stage_call
from minbert.train.distill import teach


def main(argv: list[str] | None = None) -> None:
    call = stage_call("teach", __doc__, argv, settings=TeachSettings)
    s, L, job = call.settings, call.layout, call.job
    models = dict(zip(sorted(s.members), job.reads["models"], strict=True))    # the registry lists them by name
    out = job.writes["outputs"][0]
    setup_logging()
    with running(job, s, force=call.args.force) as r:
        records = {m: L.run_record(stage, m) for m, stage in s.members.items()}
        r.fields["rows"] = teach(r.settings, models, folder_of(job.reads["splits"]), out, records)
    print(f"teacher '{call.name}' ({len(s.members)} model(s)) wrote {out}")


if __name__ == "__main__":
    run(main)
