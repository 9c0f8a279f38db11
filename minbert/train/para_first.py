"""Paraphrase-first pretraining (002): the paraphrase task alone, on all its data, before
multi-task fine-tuning. It is multi-task fine-tuning of one task (minbert.train.experiment), whose
best encoder becomes the pretrained model; resumable as fine-tuning is. Masked-LM and NLI
pretraining are minbert.train.pretrain, which this job never runs."""
from __future__ import annotations

import tempfile
from pathlib import Path

from minbert.core.layout import MODEL_FILE
from minbert.core.settings import FinetuneSettings, PretrainSettings, Training, in_own_registry, network_keys
from minbert.model.checkpoint import load_checkpoint
from minbert.train.experiment import finetune_experiment
from minbert.train.pretrained import PretrainFiles, write_pretrained
from minbert.train.training import FitOptions


@in_own_registry
def pretrain(s: PretrainSettings, files: PretrainFiles, *, start_model: str, description: dict | None = None,
             name: str = "", fingerprint: str | None = None) -> dict:
    """The paraphrase task alone on all of Quora's training data (its settings' `finetune`: the
    planner's minbert.params.resolve.para_first_config), as resumable multi-task fine-tuning; its best
    encoder is the pretrained model. Writes the pretraining's outputs (minbert.train.pretrained) and
    returns its metrics."""
    ft = FinetuneSettings(model=start_model, pretrain=None, seed=s.seed, max_length=s.max_length, finetune=s.finetune,
                          modules=s.modules, tasks=s.tasks, **network_keys(s, Training))
    with tempfile.TemporaryDirectory(prefix="para_first.") as work:
        options = FitOptions(Path(work), state_dir=files.state_dir, description=description, fingerprint=fingerprint,
                             evaluate_first=True,
                             checkpoint_extra={"experiment": name or "para_first", "stage": "pretrain"})
        result = finetune_experiment(ft, files.data, options, cache_dir=files.cache)
        model, _, _ = load_checkpoint(Path(work) / MODEL_FILE, trust_remote_code=True)     # the run just made
    rows = result.history.to_dict("records")
    history = [{"epoch": r["epoch"], "update": r.get("update"), "lr_budget": r.get("lr_budget"),
                "train_loss": r.get("train_para_loss"), "dev_loss": r.get("dev_para_loss")}
               for r in rows]
    metrics = {"kind": "para_first", "dev_loss_before": (result.dev_before or {}).get("para_loss"),
               "dev_loss_first": history[0]["dev_loss"] if history else None,
               "dev_loss_last": history[-1]["dev_loss"] if history else None,
               "dev_para_acc_best": result.best_dev.get("para_acc"), "best_epoch": result.best_epoch,
               "epochs": len(history)}
    return write_pretrained(files, start_model, model.encoder, history, metrics)
