"""Further pretraining before multi-task fine-tuning: masked-LM on task texts, or NLI sentence embeddings.

One explicit training loop (`train`) drives an objective object that knows its data and its
loss: `MlmObjective` (BERT masking, loss per chosen token) or `NliObjective` (regression,
contrastive or triplet loss per example). Each epoch records the mean train loss and the dev
loss; the dev loss of the starting model is measured before the first step, so a run shows
whether it lowered its own objective.

Dev losses are comparable across epochs: the dev batches are fixed (length order) and MLM dev
masking is re-drawn from the same seed at every evaluation.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import nli
from .batching import BucketBatchSampler, encode_cached
from .data import downsample, load_splits
from .errors import MinBertError
from .mlm import build_mlm_head, mask_tokens, mlm_loss_sum
from .model import BertModel
from .optim import build_adamw, set_lr
from .params import ExperimentParams, PretrainParams
from .runtime import autocast, pick_device, seed_everything, set_threads
from .tokenizer import Tokenizer
from .weights import load_encoder

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0              # global gradient-norm clip, as in BERT's own pretraining
SINGLE_TEXT_TASKS = ("sst", "cfimdb")

Encoded = list[tuple[list[int], list[int]]]


# ---------------------------------------------------------------- masked LM

def mlm_frames(data_dir, pparams: PretrainParams, seed: int, split: str) -> dict[str, pd.DataFrame]:
    """The `split` of each MLM task, downsampled per `mlm.downsample` (smallest by default)."""
    frames = {}
    for task in pparams.mlm.tasks:
        splits = load_splits(data_dir, task)
        if split not in splits:
            raise MinBertError(f"{data_dir}: no {task}-{split}.tsv; run the prepare stage first")
        frames[task] = splits[split]
    return downsample(frames, pparams.mlm.downsample, seed)


def encode_texts(tok: Tokenizer, frames: dict[str, pd.DataFrame], cache_dir=None) -> Encoded:
    """Single-sentence tasks as `[CLS] s [SEP]`; pair tasks as `[CLS] a [SEP] b [SEP]`, the input
    a cross-encoder sees in fine-tuning."""
    encoded: Encoded = []
    for task, frame in frames.items():
        if task in SINGLE_TEXT_TASKS:
            encoded += encode_cached(tok, frame["sentence"].tolist(), cache_dir=cache_dir)
        else:
            encoded += encode_cached(tok, frame["sentence1"].tolist(), frame["sentence2"].tolist(),
                                     cache_dir=cache_dir)
    return encoded


def _cap(items: list, size: int | None, seed: int) -> list:
    """A seeded subset of at most `size` items, in their original order."""
    if size is None or len(items) <= size:
        return items
    keep = np.sort(np.random.default_rng(seed).permutation(len(items))[:size])
    return [items[i] for i in keep]


class MlmObjective:
    """Masked-LM loss over a list of encoded texts; losses are summed per chosen token."""

    unit = "token"

    def __init__(self, encoder: BertModel, head, tok: Tokenizer, train: Encoded, dev: Encoded,
                 mask_prob: float, seed: int):
        self.encoder, self.head, self.tok = encoder, head, tok
        self.data = {"train": train, "dev": dev}
        self.mask_prob, self.seed = mask_prob, seed
        self.train_gen = torch.Generator().manual_seed(seed)

    def modules(self):
        return [self.encoder, self.head]

    def lengths(self, split: str) -> list[int]:
        return [len(ids) for ids, _ in self.data[split]]

    def new_eval_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + 1)

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        batch = self.tok.pad([self.data[split][i] for i in indices])
        ids, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.tok.special_ids,
                                  self.tok.mask_id, self.tok.vocab_size, self.mask_prob,
                                  generator=generator or self.train_gen)
        return mlm_loss_sum(self.encoder, self.head, ids.to(device), batch["attention_mask"].to(device),
                            batch["token_type_ids"].to(device), labels.to(device))


# ---------------------------------------------------------------- NLI

class NliObjective:
    """One of the three NLI objectives over sentences embedded separately.

    regression: examples are (premise, hypothesis, target); contrastive and triplet: examples
    are (anchor, positive, negative). All parts of a batch go through the encoder in one pass.
    """

    unit = "example"

    def __init__(self, encoder: BertModel, tok: Tokenizer, objective: str, train: dict, dev: dict,
                 temperature: float, margin: float, pooling: str):
        self.encoder, self.tok, self.objective = encoder, tok, objective
        self.data = {"train": train, "dev": dev}
        self.temperature, self.margin, self.pooling = temperature, margin, pooling

    def modules(self):
        return [self.encoder]

    def lengths(self, split: str) -> list[int]:
        parts = self.data[split]["parts"]
        return [max(len(p[i][0]) for p in parts) for i in range(len(parts[0]))]

    def new_eval_generator(self):
        return None

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        parts = self.data[split]["parts"]
        batch = self.tok.pad([p[i] for p in parts for i in indices])
        emb = nli.embed(self.encoder, {k: v.to(device) for k, v in batch.items()}, self.pooling)
        chunks = emb.split(len(indices))
        if self.objective == "regression":
            target = self.data[split]["target"][indices].to(device)
            loss = nli.regression_loss(chunks[0], chunks[1], target)
        elif self.objective == "contrastive":
            loss = nli.contrastive_loss(*chunks, temperature=self.temperature)
        else:
            loss = nli.triplet_loss(*chunks, margin=self.margin)
        return loss * len(indices), len(indices)


def nli_examples(tok: Tokenizer, frame: pd.DataFrame, objective: str, source: str, cache_dir=None) -> dict:
    """Encode a prepared NLI split for `objective`: pairs with targets, or triplets."""
    if objective == "regression":
        frame = frame[frame["label"].notna()]
        return {"parts": [encode_cached(tok, frame["sentence1"].tolist(), cache_dir=cache_dir),
                          encode_cached(tok, frame["sentence2"].tolist(), cache_dir=cache_dir)],
                "target": nli.regression_targets(frame["label"], source)}
    triplets = nli.build_triplets(frame, source)
    if triplets.empty:
        raise MinBertError(f"{source}: no (premise, entailment, contradiction) triplet could be built; "
                           "the data needs premises with both an entailment and a contradiction")
    return {"parts": [encode_cached(tok, triplets[c].tolist(), cache_dir=cache_dir)
                      for c in ("anchor", "positive", "negative")]}


def _subset(examples: dict, size: int | None, seed: int) -> dict:
    n = len(examples["parts"][0])
    if size is None or n <= size:
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(n)[:size])
    out = {"parts": [[p[i] for i in keep] for p in examples["parts"]]}
    if "target" in examples:
        out["target"] = examples["target"][torch.from_numpy(keep)]
    return out


# ---------------------------------------------------------------- the loop

@dataclass
class PretrainResult:
    encoder: BertModel
    mlm_head: object | None
    history: list[dict]
    metrics: dict = field(default_factory=dict)


@torch.no_grad()
def evaluate(objective, device, bf16: bool, batch_size: int) -> float:
    """Mean dev loss (per token for MLM, per example for NLI) over fixed, length-ordered batches."""
    for m in objective.modules():
        m.eval()
    sampler = BucketBatchSampler(objective.lengths("dev"), batch_size, shuffle=False)
    gen = objective.new_eval_generator()
    total, count = 0.0, 0
    for indices in sampler:
        with autocast(device, bf16):
            loss, n = objective.loss_sum("dev", indices, device, generator=gen)
        total, count = total + loss.item(), count + n
    return total / max(count, 1)


def _named_parameters(modules) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters of all modules, each once (the MLM decoder shares the word embeddings)."""
    seen, named = set(), []
    for i, m in enumerate(modules):
        for n, p in m.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((f"{i}.{n}", p))
    return named


def train(objective, pparams: PretrainParams, exp: ExperimentParams, device, desc: str) -> tuple[list[dict], float]:
    """Train `objective` for `pparams.epochs`; returns (history rows, dev loss before training)."""
    modules = objective.modules()
    for m in modules:
        m.to(device)
    params = _named_parameters(modules)
    optimizer = build_adamw([(params, pparams.lr)], pparams.weight_decay)
    sampler = BucketBatchSampler(objective.lengths("train"), pparams.batch_size, shuffle=True, seed=exp.seed)
    steps_per_epoch = len(sampler) if pparams.max_steps_per_epoch is None \
        else min(len(sampler), pparams.max_steps_per_epoch)
    if steps_per_epoch == 0:
        raise MinBertError(f"{desc}: no training examples")
    total_steps = pparams.epochs * steps_per_epoch
    warmup = int(pparams.warmup_ratio * total_steps)

    dev_before = evaluate(objective, device, exp.bf16, pparams.batch_size)
    log.info("%s: dev loss before training %.4f", desc, dev_before)
    history, step = [], 0
    for epoch in range(1, pparams.epochs + 1):
        for m in modules:
            m.train()
        sampler.set_epoch(epoch)
        batches = [b for _, b in zip(range(steps_per_epoch), sampler)]
        t0, total, count = time.perf_counter(), 0.0, 0
        bar = tqdm(total=sum(len(b) for b in batches), desc=f"{desc} epoch {epoch}/{pparams.epochs}",
                   unit="ex", dynamic_ncols=True, mininterval=1.0)
        for indices in batches:
            lr = set_lr(optimizer, step, total_steps, warmup, "linear")
            with autocast(device, exp.bf16):
                loss_sum, n = objective.loss_sum("train", indices, device)
            loss = loss_sum / max(n, 1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in params], GRAD_CLIP)
            optimizer.step()
            step += 1
            total, count = total + loss_sum.item(), count + n
            bar.update(len(indices))
            bar.set_postfix(loss=f"{total / max(count, 1):.4f}", lr=f"{lr:.2e}", refresh=False)
        bar.close()
        train_loss = total / max(count, 1)
        if not math.isfinite(train_loss):
            raise MinBertError(f"{desc}: the training loss became {train_loss} in epoch {epoch}; "
                               "lower `lr` or switch off bf16")
        dev_loss = evaluate(objective, device, exp.bf16, pparams.batch_size)
        history.append({"epoch": epoch, "train_loss": train_loss, "dev_loss": dev_loss})
        log.info("%s epoch %d: train loss %.4f, dev loss %.4f (%.1fs, %d steps)", desc, epoch, train_loss,
                 dev_loss, time.perf_counter() - t0, len(batches))
    return history, dev_before


def _setup(pparams: PretrainParams, exp: ExperimentParams, model_name: str):
    set_threads(exp.threads)
    seed_everything(exp.seed)
    device = pick_device(exp.device)
    encoder, mlm_tensors, folder = load_encoder(model_name)
    tok = Tokenizer(folder, exp.max_length)
    return device, encoder, mlm_tensors, folder, tok


def pretrain_mlm(pparams: PretrainParams, exp: ExperimentParams, data_dir, model_name: str,
                 cache_dir=None) -> PretrainResult:
    """Masked-LM further pretraining on the texts of `pparams.mlm.tasks`."""
    device, encoder, mlm_tensors, folder, tok = _setup(pparams, exp, model_name)
    head, loaded = build_mlm_head(encoder, mlm_tensors, str(folder))
    log.info("MLM head %s", "loaded from the checkpoint" if loaded else "freshly initialised (the checkpoint has none)")
    train_frames = mlm_frames(data_dir, pparams, exp.seed, "train")
    dev_frames = mlm_frames(data_dir, pparams, exp.seed, "dev")
    train_set = encode_texts(tok, train_frames, cache_dir)
    dev_set = _cap(encode_texts(tok, dev_frames, cache_dir), pparams.dev_size, exp.seed)
    objective = MlmObjective(encoder, head, tok, train_set, dev_set, pparams.mlm.mask_prob, exp.seed)
    history, before = train(objective, pparams, exp, device, "mlm")
    metrics = {"mlm_head_loaded": loaded, "tasks": list(pparams.mlm.tasks),
               "train_examples": {t: len(f) for t, f in train_frames.items()}, "dev_examples": len(dev_set)}
    return PretrainResult(encoder.cpu(), head.cpu(), history, _loss_summary(history, before) | metrics)


def pretrain_nli(pparams: PretrainParams, exp: ExperimentParams, data_dir, model_name: str,
                 cache_dir=None) -> PretrainResult:
    """NLI pretraining of sentence embeddings with `pparams.nli.objective`."""
    device, encoder, _, folder, tok = _setup(pparams, exp, model_name)
    splits = load_splits(data_dir, "nli")
    if "dev" not in splits:
        raise MinBertError(f"{data_dir}: no nli-dev.tsv; run the prepare stage with data.nli_file set")
    objective_name = pparams.nli.objective
    data = {s: nli_examples(tok, splits[s], objective_name, str(Path(data_dir) / f"nli-{s}.tsv"), cache_dir)
            for s in ("train", "dev")}
    data["dev"] = _subset(data["dev"], pparams.dev_size, exp.seed)
    objective = NliObjective(encoder, tok, objective_name, data["train"], data["dev"],
                             pparams.nli.temperature, pparams.nli.margin, pparams.nli.pooling)
    history, before = train(objective, pparams, exp, device, f"nli-{objective_name}")
    metrics = {"objective": objective_name, "pooling": pparams.nli.pooling,
               "train_examples": len(data["train"]["parts"][0]), "dev_examples": len(data["dev"]["parts"][0])}
    return PretrainResult(encoder.cpu(), None, history, _loss_summary(history, before) | metrics)


def _loss_summary(history: list[dict], before: float) -> dict:
    return {"dev_loss_before": before, "dev_loss_first": history[0]["dev_loss"],
            "dev_loss_last": history[-1]["dev_loss"], "train_loss_last": history[-1]["train_loss"],
            "epochs": len(history)}
