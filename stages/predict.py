"""Dev and test predictions of one experiment, as CSV with ids.

    python -m stages.predict --experiment E [--params params.yaml]

Uses the experiment's last model (retrain_heads/model.pt when head retraining is enabled, else
finetune/model.pt); writes results/experiments/E/predictions/<task>-<split>.csv.
"""
from __future__ import annotations

from minbert.core.runtime import setup_logging
from minbert.core.settings import PredictSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, stage_call
from minbert.scoring.predict import predict_experiment


def main(argv=None):
    call = stage_call("predict", __doc__, argv, settings=PredictSettings)
    s, L, name, job = call.settings, call.layout, call.name, call.job
    setup_logging()
    with running(job, s, force=call.args.force) as r:
        expect = {"experiment": name, "stage": s.model_stage, "record_path": L.run_record(s.model_stage, name)}
        seconds = r.fields["seconds"] = {}
        r.fields["files"] = predict_experiment(r.settings, job.reads["model"][0], folder_of(job.reads["splits"]),
                                               folder_of(job.writes["predictions"]), cache_dir=L.token_cache,
                                               expect=expect, seconds=seconds)


if __name__ == "__main__":
    run(main)
