"""Head retraining: freeze the fine-tuned encoder, re-initialise and train only the heads.

    python -m stages.retrain_heads --experiment E [--params params.yaml]

Reads results/experiments/E/finetune/model.pt; writes results/experiments/E/retrain_heads/.
"""
from __future__ import annotations

from pathlib import Path

from minbert.core.runtime import setup_logging
from minbert.core.settings import RetrainSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, main_process, stage_call
from minbert.train.experiment import retrain_heads_experiment
from minbert.train.training import FitOptions


def main(argv=None):
    call = stage_call("retrain_heads", __doc__, argv, settings=RetrainSettings)
    s, L, name, job = call.settings, call.layout, call.name, call.job
    setup_logging()
    with running(job, s, main_process=main_process(), force=call.args.force) as r:
        options = FitOptions(Path(job.writes["model"][0]).parent, state_dir=Path(L.state("retrain_heads", name)),
                             description=r.description, fingerprint=r.fingerprint,
                             checkpoint_extra={"experiment": name, "fingerprint": r.fingerprint})
        expect = {"experiment": name, "stage": "finetune", "record_path": L.run_record("finetune", name)}
        res = retrain_heads_experiment(r.settings, job.reads["model"][0], folder_of(job.reads["splits"]), options,
                                       cache_dir=L.token_cache, expect=expect)
        r.fields.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1))


if __name__ == "__main__":
    run(main)
