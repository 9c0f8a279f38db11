"""Head retraining: freeze the fine-tuned encoder, re-initialise and train only the heads.

    python -m stages.retrain_heads --experiment E [--params params.yaml]

Reads results/experiments/E/finetune/model.pt; writes results/experiments/E/retrain_heads/.
"""
from __future__ import annotations

from minbert.core.runtime import pick_device, resolve_precision, setup_logging
from minbert.params.settings import RetrainSettings
from minbert.pipeline.runinfo import running
from minbert.train.experiment import retrain_heads_experiment

from ._cli import experiment_parser, job, main_process, run


def main(argv=None):
    args = experiment_parser(__doc__.splitlines()[0]).parse_args(argv)
    name = args.experiment
    the_job, L = job(args, "retrain_heads", name)
    s = RetrainSettings(**the_job.settings)
    setup_logging()
    with running(the_job, pick_device(s.device), main_process=main_process()) as r:
        r.fields["precision"] = resolve_precision(s.precision, pick_device(s.device))   # what ran
        res = retrain_heads_experiment(s, L.model(name, "finetune"), L.data, L.training(name, "retrain_heads"),
                                       state_dir=L.state("retrain_heads", name), description=r.description,
                                       cache_dir=L.token_cache, name=name)
        r.fields.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1))


if __name__ == "__main__":
    run(main)
