"""Multi-task fine-tuning of one experiment.

    python -m stages.finetune --experiment E [--params params.yaml]
    torchrun --nproc_per_node N -m stages.finetune --experiment E     # data parallel

Writes results/experiments/E/finetune/{model.pt,history.csv} when training has finished. While it
runs, its resumable state lives in results/state/finetune/E/: an interrupted run resumes from its
last finished epoch when run again with the same settings, inputs and code.
"""
from __future__ import annotations

from minbert.core.runtime import pick_device, resolve_precision, setup_logging
from minbert.model.weights import resolve_model
from minbert.params.settings import FinetuneSettings
from minbert.pipeline.runinfo import running
from minbert.train.experiment import finetune_experiment, model_for_pretraining

from ._cli import experiment_parser, job, main_process, run


def main(argv=None):
    p = experiment_parser(__doc__.splitlines()[0])
    p.add_argument("--no-resume", action="store_true", help="start afresh even if a resumable state exists")
    args = p.parse_args(argv)
    name = args.experiment
    the_job, L = job(args, "finetune", name)
    s = FinetuneSettings(**the_job.settings)
    start = model_for_pretraining(L.pretrain_model(s.pretrain)) if s.pretrain else s.model
    setup_logging()
    with running(the_job, pick_device(s.device), [resolve_model(start)], main_process()) as r:
        r.fields["precision"] = resolve_precision(s.precision, pick_device(s.device))   # what ran
        res = finetune_experiment(s, L.data, L.training(name, "finetune"), start_model=start,
                                  state_dir=L.state("finetune", name), description=r.description,
                                  cache_dir=L.token_cache, resume=not args.no_resume, name=name,
                                  teacher_dir=L.teacher(s.finetune.distill.teacher) if s.finetune.distill else None)
        r.fields.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1),
                        examples_per_second=round(res.examples_per_second, 1), model=start)


if __name__ == "__main__":
    run(main)
