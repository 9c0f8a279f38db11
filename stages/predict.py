"""Dev and test predictions of one experiment, as CSV with ids.

    python -m stages.predict --experiment E [--params params.yaml]

Uses the experiment's last model (retrain_heads/model.pt when head retraining is enabled, else
finetune/model.pt); writes results/experiments/E/predictions/<task>-<split>.csv.
"""
from __future__ import annotations

from minbert.core.runtime import setup_logging
from minbert.entry import run
from minbert.params.settings import PredictSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call
from minbert.scoring.predict import predict_experiment


def main(argv=None):
    call = stage_call("predict", __doc__, argv, named="experiment")
    s, L, name = PredictSettings(**call.job.settings), call.layout, call.name
    setup_logging()
    with running(call.job, s, force=call.args.force) as r:
        expect = {"experiment": name, "stage": s.model_stage, "record_path": L.run_record(s.model_stage, name)}
        r.fields["files"] = predict_experiment(s, L.model(name, s.model_stage), L.data, L.predictions(name),
                                               cache_dir=L.token_cache, expect=expect)


if __name__ == "__main__":
    run(main)
