"""From resolved experiment params to trained models and prediction files.

The stage CLIs (stages/finetune.py, retrain_heads.py, predict.py) are thin wrappers around these.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .errors import MinBertError
from .io import atomic_path
from .model import BertModel
from .multitask import MultitaskModel, load_checkpoint, load_task_data, predict_task
from .params import Downsample, ExperimentParams, FinetuneParams, PretrainParams, SmartParams
from .runtime import autocast, pick_device, seed_everything, set_threads
from .tokenizer import Tokenizer
from .train import DistInfo, FitResult, fit, init_distributed
from .weights import load_encoder

log = logging.getLogger("minbert.experiment")


def with_dropout(encoder: BertModel, p: float | None) -> BertModel:
    """Override the checkpoint's hidden/attention dropout (the papers' "BERT dropout probability")."""
    if p is None:
        return encoder
    encoder.config.hidden_dropout_prob = p
    encoder.config.attention_probs_dropout_prob = p
    for m in encoder.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p
        if hasattr(m, "attn_dropout"):
            m.attn_dropout = p
    return encoder


def runtime_setup(exp: ExperimentParams) -> tuple[torch.device, DistInfo]:
    set_threads(exp.threads)
    dist_info, dist_device = init_distributed(exp.device)
    device = dist_device or pick_device(exp.device)
    return device, dist_info


def finetune_experiment(exp: ExperimentParams, data_dir, out_dir, *, model_name: str | None = None,
                        cache_dir=None, resume: bool = True, stop_after_epochs: int | None = None,
                        experiment: str = "", evaluate_first: bool = False) -> FitResult:
    """Multi-task fine-tuning of one experiment; writes out_dir/{model.pt,history.csv}."""
    device, dist_info = runtime_setup(exp)
    cfg = exp.finetune
    encoder, _, folder = load_encoder(model_name or exp.model)
    with_dropout(encoder, cfg.hidden_dropout)
    encoder.gradient_checkpointing = cfg.gradient_checkpointing
    tokenizer = Tokenizer(folder, exp.max_length)
    data = load_task_data(data_dir, cfg.tasks, cfg.heads, tokenizer, downsample=cfg.downsample, seed=exp.seed,
                          cache_dir=cache_dir)
    seed_everything(exp.seed)  # the heads' initialisation and dropout depend on it
    model = MultitaskModel(encoder, cfg.heads, cfg.tasks)
    if dist_info.main:
        log.info("fine-tuning %s on %s: %s", experiment or "experiment", device,
                 ", ".join(f"{t} {len(d)} train / {len(data['dev'].get(t, []))} dev" for t, d in data["train"].items()))
    return fit(model, tokenizer, data["train"], data.get("dev", {}), cfg, out_dir=out_dir, seed=exp.seed,
               device=device, bf16=exp.bf16, dist_info=dist_info, resume=resume, stop_after_epochs=stop_after_epochs,
               checkpoint_extra={"experiment": experiment, "stage": "finetune"}, eval_batch_size=exp.predict_batch_size,
               evaluate_first=evaluate_first)


def retrain_config(exp: ExperimentParams) -> FinetuneParams:
    """Head retraining: the fine-tuned encoder frozen, fresh heads, every task's full data."""
    rh = exp.retrain_heads
    return exp.finetune.model_copy(update={
        "schedule": "round_robin", "epoch_unit": "largest", "epochs": rh.epochs, "batch_size": rh.batch_size,
        "lr": rh.lr, "head_lr": rh.lr, "freeze_encoder": True, "downsample": rh.downsample, "smart": SmartParams(),
        "pcgrad": False, "max_steps_per_epoch": exp.finetune.max_steps_per_epoch,
    })


def retrain_heads_experiment(exp: ExperimentParams, finetuned: str | Path, data_dir, out_dir, *, cache_dir=None,
                             experiment: str = "") -> FitResult:
    device, dist_info = runtime_setup(exp)
    model, tokenizer, _ = load_checkpoint(finetuned)
    cfg = retrain_config(exp)
    data = load_task_data(data_dir, cfg.tasks, cfg.heads, tokenizer, downsample=cfg.downsample, seed=exp.seed,
                          cache_dir=cache_dir)
    seed_everything(exp.seed + 1)
    model.reset_heads()
    return fit(model, tokenizer, data["train"], data.get("dev", {}), cfg, out_dir=out_dir, seed=exp.seed + 1,
               device=device, bf16=exp.bf16, dist_info=dist_info,
               checkpoint_extra={"experiment": experiment, "stage": "retrain_heads"},
               eval_batch_size=exp.predict_batch_size)


# ---------------------------------------------------------------- predictions

TEXT_COLUMNS = {"sst": ["sentence"], "cfimdb": ["sentence"], "para": ["sentence1", "sentence2"],
                "sts": ["sentence1", "sentence2"]}


def prediction_frame(task: str, data, result: dict) -> pd.DataFrame:
    """The predictions CSV of one task and split (docs/pipeline.md)."""
    frame = data.frame
    out = pd.DataFrame({"id": frame["id"].astype(str).to_numpy()})
    for c in TEXT_COLUMNS[task]:
        out[c] = frame[c].to_numpy()
    out["label"] = frame["label"].to_numpy() if "label" in frame.columns else np.nan
    out["prediction"] = result["prediction"]
    if task == "sst":
        for k in range(result["probs"].shape[1]):
            out[f"prob_{k}"] = result["probs"][:, k]
    elif task == "para":
        out["prob_1"] = result["probs"]
    return out


def predict_experiment(exp: ExperimentParams, checkpoint: str | Path, data_dir, out_dir, *, cache_dir=None) -> dict:
    """Write <task>-<split>.csv for every trained task and each of its dev/test splits."""
    set_threads(exp.threads)
    device = pick_device(exp.device)
    model, tokenizer, ckpt = load_checkpoint(checkpoint)
    model.to(device)
    data = load_task_data(data_dir, model.tasks, model.heads_cfg, tokenizer, splits=("dev", "test"), cache_dir=cache_dir)
    out_dir = Path(out_dir)
    written = {}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        for split, tasks in data.items():
            for task, td in tasks.items():
                res = predict_task(model, td, tokenizer, exp.predict_batch_size, device, lambda: autocast(device, exp.bf16))
                frame = prediction_frame(task, td, res)
                frame.to_csv(tmp / f"{task}-{split}.csv", index=False, float_format="%.6g")
                written[f"{task}-{split}"] = len(frame)
    if not written:
        raise MinBertError(f"{data_dir}: no dev or test split for the tasks {model.tasks}; run the prepare stage")
    return written


def model_for_pretraining(pretrain_dir: str | Path) -> str:
    folder = Path(pretrain_dir) / "model"
    if not (folder / "config.json").is_file():
        raise MinBertError(f"{folder}: pretrained model not found; run `python -m stages.pretrain` first")
    return str(folder)


def pretrain_paraphrase_first(pparams: PretrainParams, exp_base: ExperimentParams, data_dir, model_name: str,
                              out_model_folder, cache_dir=None, work_dir=None) -> FitResult:
    """Paraphrase-first pretraining: train on the whole Quora training set (paraphrase task only),
    then save the encoder as a Hugging Face folder for the multi-task stage to start from."""
    from .weights import save_hf_folder

    exp = exp_base.model_copy(update={"finetune": exp_base.finetune.model_copy(update={
        "tasks": ["para"], "schedule": "round_robin", "epochs": pparams.epochs, "batch_size": pparams.batch_size,
        "lr": pparams.lr, "weight_decay": pparams.weight_decay, "warmup_ratio": pparams.warmup_ratio,
        "downsample": Downsample(mode="none"), "max_steps_per_epoch": pparams.max_steps_per_epoch,
        "smart": SmartParams(), "pcgrad": False, "freeze_encoder": False})})
    work_dir = Path(work_dir or Path(out_model_folder).parent / "para_first")
    result = finetune_experiment(exp, data_dir, work_dir, model_name=model_name, cache_dir=cache_dir,
                                 experiment="para_first", evaluate_first=True)
    model, _, _ = load_checkpoint(work_dir / "model.pt")
    _, _, source_folder = load_encoder(model_name)
    with atomic_path(out_model_folder) as tmp:
        save_hf_folder(tmp, model.encoder, tokenizer_folder=source_folder)
    return result
