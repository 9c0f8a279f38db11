"""Dev and test predictions of one experiment, as CSV with ids.

    python -m stages.predict --experiment E [--params params.yaml]

Uses the experiment's last model (retrain_heads/model.pt when head retraining is enabled, else
finetune/model.pt); writes results/experiments/E/predictions/<task>-<split>.csv.
"""
from __future__ import annotations

from minbert.core.runtime import pick_device, resolve_precision, setup_logging
from minbert.params.settings import PredictSettings
from minbert.pipeline.runinfo import running
from minbert.scoring.predict import predict_experiment

from ._cli import experiment_parser, job, run


def main(argv=None):
    args = experiment_parser(__doc__.splitlines()[0]).parse_args(argv)
    name = args.experiment
    the_job, L = job(args, "predict", name)
    s = PredictSettings(**the_job.settings)
    setup_logging()
    with running(the_job, pick_device(s.device)) as r:
        r.fields["precision"] = resolve_precision(s.precision, pick_device(s.device))   # what ran
        r.fields["files"] = predict_experiment(s, L.model(name, s.model_stage), L.data, L.predictions(name),
                                               cache_dir=L.token_cache)


if __name__ == "__main__":
    run(main)
