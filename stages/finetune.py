"""Multi-task fine-tuning of one experiment.

    python -m stages.finetune --experiment E [--params params.yaml]
    torchrun --nproc_per_node N -m stages.finetune --experiment E     # data parallel

Writes results/experiments/E/finetune/{model.pt,history.csv} when training has finished. While it
runs, its resumable state lives in results/state/finetune/E/: an interrupted run resumes from its
last finished epoch when run again with the same settings, inputs and code.
"""
from __future__ import annotations

from pathlib import Path

from minbert.core.runtime import setup_logging
from minbert.entry import run
from minbert.model.weights import model_folder
from minbert.params.settings import FinetuneSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import main_process, stage_call
from minbert.train.experiment import finetune_experiment, model_for_pretraining
from minbert.train.training import FitOptions


def main(argv=None):
    call = stage_call("finetune", __doc__, argv, named="experiment", arguments=lambda p: p.add_argument(
        "--no-resume", action="store_true", help="start afresh even if a resumable state exists"))
    s, L, name = FinetuneSettings(**call.job.settings), call.layout, call.name
    start = model_for_pretraining(L.pretrain_model(s.pretrain)) if s.pretrain else s.model
    setup_logging()
    with running(call.job, s, [model_folder(start)], main_process(), call.args.force) as r:
        options = FitOptions(Path(L.training(name, "finetune")), state_dir=Path(L.state("finetune", name)),
                             description=r.description, resume=not call.args.no_resume,
                             checkpoint_extra={"experiment": name, "stage": "finetune",
                                               "fingerprint": r.fingerprint})
        res = finetune_experiment(s, L.data, options, start_model=start, cache_dir=L.token_cache,
                                  teacher_dir=L.teacher(s.finetune.distill.teacher) if s.finetune.distill else None)
        r.fields.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1),
                        examples_per_second=round(res.examples_per_second, 1), model=start)


if __name__ == "__main__":
    run(main)
