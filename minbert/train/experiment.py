"""From a job's settings (minbert.params.settings) to a trained model: fine-tuning and head
retraining, each from its data, its starting model and its run options.

The stage CLIs stages/finetune.py and stages/retrain_heads.py are thin wrappers around these (the
predictions are minbert.scoring.predict's).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from minbert.core.errors import MinBertError
from minbert.core.runtime import Runtime, seed_everything, start_runtime
from minbert.core.settings import FinetuneSettings, RetrainSettings, Training, batch_statistic_tasks, in_own_registry
from minbert.data.batches import collate, load_training_data, to_device
from minbert.model.bert import BertModel
from minbert.model.checkpoint import load_checkpoint
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.train.distill import attach_teacher, distilled_tasks
from minbert.train.distributed import DistInfo, init_distributed, shutdown_distributed
from minbert.train.loop import FitResult, fit
from minbert.train.training import FitOptions

log = logging.getLogger("minbert.train.experiment")


def with_dropout(encoder: BertModel, hidden: float | None, attention: float | None = None) -> BertModel:
    """Override the checkpoint's hidden dropout (the papers' "BERT dropout probability": embeddings
    and every layer's outputs) and, separately, its attention dropout; None keeps the checkpoint's."""
    if hidden is not None:
        encoder.config.hidden_dropout_prob = hidden
        for m in encoder.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = hidden
    if attention is not None:
        encoder.config.attention_probs_dropout_prob = attention
        for m in encoder.modules():
            if hasattr(m, "attn_dropout"):
                m.attn_dropout = attention
    return encoder


def prepare_heads(model: MultitaskModel, train: dict, tokenizer: Tokenizer, runtime: Runtime, seed: int) -> None:
    """A head that starts from its task's training examples (one with a `prepare` method: the
    prototypes head) gets them, embedded by the frozen encoder, once, before it trains."""
    for task, head in model.heads.items():
        if task in train and hasattr(head, "prepare"):
            model.to(runtime.device).eval()
            head.prepare(task, train[task].labels, partial(_embedded, model, train[task], tokenizer, runtime), seed)


@torch.no_grad()
def _embedded(model: MultitaskModel, data, tokenizer: Tokenizer, runtime: Runtime, rows: list[int]) -> torch.Tensor:
    """The sentence embeddings of `rows` of a task's training data, (N, H) in float32."""
    with runtime.amp():
        return torch.cat([model.embed(to_device(collate(data, rows[i:i + 64], tokenizer), runtime.device),
                                      task=data.task).float() for i in range(0, len(rows), 64)])


def start_training(s: Training) -> tuple[Runtime, DistInfo]:
    """The runtime (minbert.core.runtime.start_runtime: threads, device, precision) and, under
    torchrun, the process group, whose rank's device it runs on."""
    dist_info, dist_device = init_distributed(s.device)
    return start_runtime(s, dist_device), dist_info


def run_options(options: FitOptions, s: Training, seed: int, runtime: Runtime, dist_info: DistInfo,
                **more) -> FitOptions:
    """`options` with where and how the training runs: its seed, its runtime's device and precision,
    its process group and whether it may capture CUDA graphs (its settings')."""
    return replace(options, seed=seed, device=runtime.device, bf16=runtime.bf16, fp16=runtime.fp16,
                   dist_info=dist_info, cuda_graphs=s.cuda_graphs, **more)


@in_own_registry
def finetune_experiment(s: FinetuneSettings, data_dir, options: FitOptions, *, start_model: str | None = None,
                        cache_dir=None, teacher_dir=None) -> FitResult:
    """Multi-task fine-tuning from `start_model` (default: the settings' model), with a teacher's
    outputs on the training data (`teacher_dir`) when it distils; writes options.out_dir/{model.pt,
    history.csv} when finished (minbert.train.loop.fit; `options` says where, and the job's
    description, resume and name: the seed, device, precision and process group come from `s`)."""
    runtime, dist_info = start_training(s)
    cfg = s.finetune
    name = options.checkpoint_extra.get("experiment") or "an experiment"
    encoder, _, folder = load_encoder(start_model or s.model)
    with_dropout(encoder, cfg.hidden_dropout, cfg.attention_dropout)
    encoder.gradient_checkpointing = cfg.gradient_checkpointing
    tokenizer = Tokenizer(folder, s.max_length)
    data = load_training_data(cfg, data_dir, tokenizer, s.seed, cache_dir)
    if cfg.distill is not None:
        if teacher_dir is None:
            raise MinBertError(f"{name} distils from '{cfg.distill.teacher}': its teacher's outputs are needed (run "
                               f"the teach stage first)")
        attach_teacher(data["train"], teacher_dir, cfg.distill, distilled_tasks(cfg.distill, cfg.tasks, teacher_dir))
    refuse_one_row_batches(cfg, data["train"], name)
    seed_everything(s.seed)  # the heads' initialisation and dropout depend on it
    model = MultitaskModel(encoder, cfg.heads, cfg.tasks)
    if cfg.freeze_encoder:
        prepare_heads(model, data["train"], tokenizer, runtime, s.seed)
    if dist_info.main:
        log.info("%s of %s on %s: %s", options.checkpoint_extra.get("stage", "finetune"), name, runtime.device,
                 ", ".join(f"{t} {len(d)} train / {len(data['dev'].get(t, []))} dev" for t, d in data["train"].items()))
    options = run_options(options, s, s.seed, runtime, dist_info)
    try:
        return fit(model, tokenizer, data["train"], data.get("dev", {}), cfg, options)
    finally:
        shutdown_distributed(dist_info)


@in_own_registry
def retrain_heads_experiment(s: RetrainSettings, finetuned: str | Path, data_dir, options: FitOptions, *,
                             cache_dir=None, expect: dict | None = None) -> FitResult:
    """Head retraining: the fine-tuned encoder frozen, the heads of the retrained tasks
    re-initialised (added when the fine-tuned model lacks them) and trained; the other heads kept
    as they are, frozen. `options` as for `finetune_experiment`."""
    runtime, dist_info = start_training(s)
    # `expect`: the fine-tuning it must come from, made from the params that name its modules (trusted)
    model, tokenizer, _ = load_checkpoint(finetuned, expect=expect, trust_remote_code=True)
    cfg = s.train
    data = load_training_data(cfg, data_dir, tokenizer, s.seed, cache_dir)
    refuse_one_row_batches(cfg, data["train"], options.checkpoint_extra.get("experiment") or "an experiment")
    seed_everything(s.seed + 1)
    model.add_tasks(cfg.tasks)
    model.reset_heads(cfg.tasks)
    kept = [t for t in model.tasks if t not in cfg.tasks]
    for task in kept:
        for p in list(model.heads[task].parameters()) + (list(model.branches[task].parameters())
                                                          if task in model.branches else []):
            p.requires_grad_(False)
    if model.shared is not None and set(model.heads_cfg.shared.tasks) & set(kept):
        for p in model.shared.parameters():
            p.requires_grad_(False)
    prepare_heads(model, data["train"], tokenizer, runtime, s.seed)
    options = run_options(options, s, s.seed + 1, runtime, dist_info,
                          checkpoint_extra={"stage": "retrain_heads", **options.checkpoint_extra})
    try:
        return fit(model, tokenizer, data["train"], data.get("dev", {}), cfg, options)
    finally:
        shutdown_distributed(dist_info)


def refuse_one_row_batches(cfg, train: dict, name: str) -> None:
    """A loss that is a statistic of the whole batch (its declaration says so: minbert.core.losses)
    over a task's training data of a single row (what is left after downsampling) is a constant: the
    task would not train (the params checks catch the settings; this, the data)."""
    for task, loss in batch_statistic_tasks(cfg.heads, train):
        if len(train[task]) < 2:
            raise MinBertError(f"{name}: {task}'s loss '{loss}' is a statistic of the whole batch, and the {task} "
                               f"training data has {len(train[task])} row after downsampling (it would not train); give it at "
                               f"least 2 rows or another loss")


def model_for_pretraining(folder: str | Path) -> str:
    """The pretrained model folder an experiment starts from, checked."""
    if not (Path(folder) / "config.json").is_file():
        raise MinBertError(f"{folder}: pretrained model not found; run `python -m stages.pretrain` first")
    return str(folder)
