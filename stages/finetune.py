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
from minbert.core.settings import FinetuneSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, main_process, stage_call
from minbert.train.experiment import finetune_experiment, model_for_pretraining
from minbert.train.training import FitOptions


def main(argv=None):
    call = stage_call("finetune", __doc__, argv, settings=FinetuneSettings, arguments=lambda p: p.add_argument(
        "--no-resume", action="store_true", help="start afresh even if a resumable state exists"))
    s, L, name, job = call.settings, call.layout, call.name, call.job
    start = model_for_pretraining(job.reads["start"][0]) if s.pretrain else s.model
    setup_logging()
    with running(job, s, main_process(), call.args.force) as r:
        options = FitOptions(Path(job.writes["model"][0]).parent, state_dir=Path(L.state("finetune", name)),
                             description=r.description, fingerprint=r.fingerprint, resume=not call.args.no_resume,
                             checkpoint_extra={"experiment": name, "stage": "finetune",
                                               "fingerprint": r.fingerprint})
        res = finetune_experiment(r.settings, folder_of(job.reads["splits"]), options, start_model=start,
                                  cache_dir=L.token_cache, teacher_dir=(job.reads["teacher"] or [None])[0])
        r.fields.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1),
                        examples_per_second=round(res.examples_per_second, 1), model=start,
                        **({"stops": res.stops} if res.stops else {}))


if __name__ == "__main__":
    run(main)
