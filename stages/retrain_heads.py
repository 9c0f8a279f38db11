"""Head retraining: freeze the fine-tuned encoder, re-initialise and train only the heads.

    python -m stages.retrain_heads --experiment E [--params params.yaml]

Reads results/experiments/E/finetune/model.pt; writes results/experiments/E/retrain_heads/.
"""
from __future__ import annotations

from pathlib import Path

from minbert.errors import MinBertError
from minbert.experiment import retrain_heads_experiment
from minbert.params import load_params
from minbert.runinfo import recorded_run
from minbert.runtime import pick_device, setup_logging
from stages._cli import experiment_parser, run


def main(argv=None):
    p = experiment_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    exp = load_params(args.params).experiment(args.experiment)
    if not exp.retrain_heads.enabled:
        raise MinBertError(f"params.yaml: experiment '{args.experiment}' has retrain_heads.enabled: false")
    base = Path(args.results) / "experiments" / args.experiment
    out = base / "retrain_heads"
    setup_logging(out / "train.log")
    with recorded_run(out / "run.json", "retrain_heads", args.experiment, device=pick_device(exp.device)) as info:
        res = retrain_heads_experiment(exp, base / "finetune" / "model.pt", args.data, out,
                                       cache_dir=Path(args.results) / "cache" / "tokens", experiment=args.experiment)
        info.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1))


if __name__ == "__main__":
    run(main)
