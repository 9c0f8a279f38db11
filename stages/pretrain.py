"""Pretraining stage: `python -m stages.pretrain --name P` (masked-LM, NLI or paraphrase-first).

Writes results/pretrain/P/: model/ (Hugging Face layout, tokenizer files included; for mlm also
the MLM head), history.csv (epoch, train_loss, dev_loss) and metrics.json. Experiments name a
pretraining, so all experiments with the same one share this single output.
"""
from __future__ import annotations

from minbert.core.runtime import pick_device, resolve_precision, setup_logging
from minbert.model.weights import resolve_model
from minbert.params.settings import PretrainSettings
from minbert.pipeline.runinfo import running
from minbert.train.pretrain import pretrain, refuse_torchrun

from ._cli import job, main_process, parser, run


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="pretraining name in params.yaml `pretrainings:`")
    args = p.parse_args(argv)
    refuse_torchrun()
    the_job, L = job(args, "pretrain", args.name)
    s = PretrainSettings(**the_job.settings)
    setup_logging()
    with running(the_job, pick_device(s.device), [resolve_model(s.model)], main_process()) as r:
        r.fields["precision"] = resolve_precision(s.precision, pick_device(s.device))   # what ran
        metrics = pretrain(s, L.data, L.pretrain_model(args.name), L.pretrain_history(args.name),
                           L.pretrain_metrics(args.name), start_model=s.model, cache_dir=L.token_cache,
                           state_dir=L.state("pretrain", args.name), description=r.description, name=args.name)
        r.fields.update(kind=s.pretraining.kind, dev_loss_last=metrics.get("dev_loss_last"))
    print(f"pretraining '{args.name}' ({s.pretraining.kind}) written to {L.pretrain(args.name)}")


if __name__ == "__main__":
    run(main)
