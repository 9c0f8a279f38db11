"""A teacher's outputs on the training data, for the experiments that distil from it.

    python -m stages.teach --name T [--params params.yaml]

T is an experiment, a repeated experiment or an ensemble that some experiment names in
`finetune.distill.teacher`. Writes results/teachers/T/<task>-train.csv: every training row's id and
the teacher's class probabilities (sst, para) or score (sts), averaged over its models.
"""
from __future__ import annotations

from minbert.core.runtime import pick_device, resolve_precision, setup_logging
from minbert.params.settings import TeachSettings
from minbert.pipeline.runinfo import running
from minbert.train.distill import teach

from ._cli import job, parser, run


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="the teacher: an experiment or ensemble a student distils from")
    args = p.parse_args(argv)
    the_job, L = job(args, "teach", args.name)
    s = TeachSettings(**the_job.settings)
    models = {m: L.model(m, stage) for m, stage in s.members.items()}
    setup_logging()
    with running(the_job, pick_device(s.device)) as r:
        r.fields["precision"] = resolve_precision(s.precision, pick_device(s.device))   # what ran
        r.fields["rows"] = teach(s, models, L.data, L.teacher(args.name))
    print(f"teacher '{args.name}' ({len(s.members)} model(s)) wrote {L.teacher(args.name)}")


if __name__ == "__main__":
    run(main)
