"""Dev and test predictions of one experiment, as CSV with ids.

    python -m stages.predict --experiment E [--params params.yaml]

Uses the experiment's last model (retrain_heads/model.pt when head retraining is enabled, else
finetune/model.pt); writes results/experiments/E/predictions/<task>-<split>.csv and run.json.
"""
from __future__ import annotations

from pathlib import Path

from minbert.experiment import predict_experiment
from minbert.params import load_params
from minbert.runinfo import recorded_run
from minbert.runtime import pick_device, setup_logging
from stages._cli import experiment_parser, run


def main(argv=None):
    p = experiment_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    exp = load_params(args.params).experiment(args.experiment)
    base = Path(args.results) / "experiments" / args.experiment
    checkpoint = base / ("retrain_heads" if exp.retrain_heads.enabled else "finetune") / "model.pt"
    setup_logging()
    with recorded_run(base / "predictions" / "run.json", "predict", args.experiment, device=pick_device(exp.device)) as info:
        info["files"] = predict_experiment(exp, checkpoint, args.data, base / "predictions",
                                           cache_dir=Path(args.results) / "cache" / "tokens")


if __name__ == "__main__":
    run(main)
