"""Pretraining stage: `python -m stages.pretrain --name P` (masked-LM, NLI or paraphrase-first).

Writes results/pretrain/P/: model/ (Hugging Face layout, tokenizer files included; for mlm also
the MLM head), history.csv (epoch, train_loss, dev_loss) and metrics.json. Experiments name a
pretraining, so all experiments with the same one share this single output.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.runtime import setup_logging
from minbert.core.settings import PretrainSettings
from minbert.entry import run
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, main_process, stage_call
from minbert.train import PRETRAINING_MODULES
from minbert.train.pretrained import PretrainFiles


def main(argv: list[str] | None = None) -> None:
    refuse_torchrun()
    call = stage_call("pretrain", __doc__, argv, settings=PretrainSettings)
    s, L, name, job = call.settings, call.layout, call.name, call.job
    setup_logging()
    with running(job, s, main_process(), call.args.force) as r:
        w = {k: Path(v[0]) for k, v in job.writes.items()}
        files = PretrainFiles(Path(folder_of(job.reads["splits"])), w["model"], w["history"], w["metrics"],
                              Path(L.state("pretrain", name)), Path(L.token_cache))
        kind = importlib.import_module(PRETRAINING_MODULES[s.pretraining.kind])
        metrics = kind.pretrain(r.settings, files, start_model=s.model, description=r.description, name=name,
                                fingerprint=r.fingerprint)
        r.fields.update(kind=s.pretraining.kind, dev_loss_last=metrics.get("dev_loss_last"))
    print(f"pretraining '{name}' ({s.pretraining.kind}) written to {w['model'].parent}")


def refuse_torchrun() -> None:
    """Pretraining runs in one process: MLM and NLI have no data-parallel loop, and under torchrun
    every rank would train a duplicate and write the same model folder."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise MinBertError(f"pretraining runs in one process, not under torchrun ({world} processes); start it with "
                           f"python -m stages.pretrain (torchrun is for the finetune stage)")


if __name__ == "__main__":
    run(main)
