"""Multi-task fine-tuning of one experiment.

    python -m stages.finetune --experiment E [--params params.yaml]
    torchrun --nproc_per_node N -m stages.finetune --experiment E     # data parallel

Writes results/experiments/E/finetune/{model.pt,history.csv,run.json,train.log}; resumes from
last.pt after an interruption.
"""
from __future__ import annotations

from pathlib import Path

from minbert.experiment import finetune_experiment, model_for_pretraining
from minbert.params import load_params
from minbert.runinfo import recorded_run
from minbert.runtime import pick_device, setup_logging
from stages._cli import experiment_parser, run


def main(argv=None):
    p = experiment_parser(__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="default: <results>/experiments/E/finetune")
    p.add_argument("--no-resume", action="store_true", help="start afresh even if last.pt exists")
    args = p.parse_args(argv)
    loaded = load_params(args.params)
    exp = loaded.experiment(args.experiment)
    results = Path(args.results)
    out = Path(args.out or results / "experiments" / args.experiment / "finetune")
    setup_logging(out / "train.log")
    model_name = model_for_pretraining(results / "pretrain" / exp.pretrain) if exp.pretrain else exp.model
    with recorded_run(out / "run.json", "finetune", args.experiment, device=pick_device(exp.device)) as info:
        res = finetune_experiment(exp, args.data, out, model_name=model_name, cache_dir=results / "cache" / "tokens",
                                  resume=not args.no_resume, experiment=args.experiment)
        info.update(best_epoch=res.best_epoch, best_dev=res.best_dev, train_seconds=round(res.seconds, 1),
                    examples_per_second=round(res.examples_per_second, 1), model=model_name)


if __name__ == "__main__":
    run(main)
