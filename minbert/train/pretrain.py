"""Further pretraining before multi-task fine-tuning: masked-LM on task texts, NLI sentence
embeddings, or paraphrase-first (the paraphrase task alone, on all its data).

`pretrain` runs a job of any kind and writes its three outputs: the model folder (Hugging Face
layout, tokenizer files included; for MLM also the MLM head), history.csv (epoch, train_loss,
dev_loss) and metrics.json. Masked-LM and NLI use one explicit training loop (`train`) that drives
an objective object knowing its data and its loss: `MlmObjective` (BERT masking, loss per chosen
token) or `NliObjective` (regression, contrastive or triplet loss per example); paraphrase-first
is multi-task fine-tuning of the one task (minbert.train.loop) whose encoder is then saved. Each epoch records the mean train loss and the dev
loss; the dev loss of the starting model is measured before the first step, so a run shows
whether it lowered its own objective.

Dev losses are comparable across epochs: the dev batches are fixed (length order) and MLM dev
masking is re-drawn from the same seed at every evaluation.

Resumable as fine-tuning is: after every epoch but the last, `train` saves the state (epoch, step,
history, best so far, the modules, the optimiser and every RNG; minbert.train.resumable) as last.pt
in the job's state folder, with the best epoch's weights beside it as best.pt; a run of the same job
(same fingerprint) continues from there and ends bit-identical to an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, clean_stale_temporaries, torch_save, write_json
from minbert.core.layout import BEST_STATE_FILE, MODEL_FILE, STATE_FILE
from minbert.core.provenance import fingerprint_of
from minbert.core.runtime import autocast, configure, pick_device, seed_everything, set_threads
from minbert.core.tasks import TASKS
from minbert.data.encode import encode_cached
from minbert.data.read import downsample, load_splits
from minbert.model.bert import BertModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder, resolve_model, save_hf_folder
from minbert.params import PretrainParams
from minbert.params.settings import PretrainSettings, pretrain_splits
from minbert.train import nli
from minbert.train.mlm import IGNORE, build_mlm_head, mask_tokens, mlm_loss_sum
from minbert.train.multitask import padding_layout, to_device
from minbert.train.optim import build_adamw, set_lr
from minbert.train.resumable import load_training_state, save_training_state
from minbert.train.sampler import BucketBatchSampler

log = logging.getLogger(__name__)

HISTORY_COLUMNS = ["epoch", "train_loss", "dev_loss"]

Encoded = list[tuple[list[int], list[int]]]


# ---------------------------------------------------------------- masked LM

def read_pretraining_data(data_dir, s: PretrainSettings) -> dict[str, dict[str, pd.DataFrame]]:
    """{split: {task: frame}} of exactly the prepared files the job reads (settings.pretrain_splits)."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for task, split in pretrain_splits(s):
        frames = load_splits(data_dir, task, (split,))
        if split not in frames:
            raise MinBertError(f"{data_dir}: no {task}-{split}.tsv; run the prepare stage first")
        out.setdefault(split, {})[task] = frames[split]
    return out


def mlm_frames(frames: dict[str, pd.DataFrame], pparams: PretrainParams, seed: int) -> dict[str, pd.DataFrame]:
    """Each MLM task's frame, downsampled per `mlm.downsample` (smallest by default)."""
    return downsample(frames, pparams.mlm.downsample, seed)


def encode_texts(tok: Tokenizer, frames: dict[str, pd.DataFrame], cache_dir=None) -> Encoded:
    """Single-sentence tasks as `[CLS] s [SEP]`; pair tasks as `[CLS] a [SEP] b [SEP]`, the input
    a cross-encoder sees in fine-tuning."""
    encoded: Encoded = []
    for task, frame in frames.items():
        if task == "nli" or TASKS[task].pair:
            encoded += encode_cached(tok, frame["sentence1"].tolist(), frame["sentence2"].tolist(),
                                     cache_dir=cache_dir)
        else:
            encoded += encode_cached(tok, frame["sentence"].tolist(), cache_dir=cache_dir)
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

    def generators(self) -> dict[str, torch.Generator]:
        """The RNGs it draws from besides torch's global one (saved with a resumable state)."""
        return {"mask": self.train_gen}

    def lengths(self, split: str) -> list[int]:
        return [len(ids) for ids, _ in self.data[split]]

    def new_eval_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + 1)

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        batch = self.tok.pad([self.data[split][i] for i in indices])
        ids, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.tok.special_ids,
                                  self.tok.mask_id, self.tok.vocab_size, self.mask_prob,
                                  generator=generator or self.train_gen)
        chosen = (labels != IGNORE).reshape(-1).nonzero().squeeze(1)    # on the host, where the labels were drawn
        layout = padding_layout(batch["attention_mask"])
        host = {"chosen": chosen.to(device, non_blocking=True), "n_chosen": len(chosen), "padded": layout["padded"]}
        if "token_index" in layout:
            host["token_index"] = layout["token_index"].to(device, non_blocking=True)
        return mlm_loss_sum(self.encoder, self.head, ids.to(device), batch["attention_mask"].to(device),
                            batch["token_type_ids"].to(device), labels.to(device), host)


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

    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def lengths(self, split: str) -> list[int]:
        parts = self.data[split]["parts"]
        return [max(len(p[i][0]) for p in parts) for i in range(len(parts[0]))]

    def new_eval_generator(self):
        return None

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        parts = self.data[split]["parts"]
        batch = self.tok.pad([p[i] for p in parts for i in indices])
        batch.update(padding_layout(batch["attention_mask"]))
        emb = nli.embed(self.encoder, to_device(batch, device), self.pooling)
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
def mean_dev_loss(objective, device, bf16: bool, batch_size: int) -> float:
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


@dataclass
class PretrainState:
    """Where a pretraining is; saved after every epoch but the last (with the modules, optimiser and
    RNGs, minbert.train.resumable) as last.pt in the state folder. The epoch also numbers the
    sampler's shuffle (`set_epoch(epoch + 1)`), so it says where the batches continue."""
    epoch: int = 0                    # epochs finished
    step: int = 0                     # updates made (the lr schedule's position)
    history: list = field(default_factory=list)
    best_loss: float = math.inf       # the lowest dev loss so far; its weights are best.pt beside last.pt
    best_epoch: int = 0
    dev_before: float | None = None   # the starting model's dev loss


class Resumable:
    """Where one pretraining's resumable state lives and what it is saved under: `state_dir`
    (None: nothing is saved, nothing resumed) and the job's description, whose fingerprint a
    saved state must carry to be resumed."""

    def __init__(self, state_dir, description: dict, modules: list, optimizer, device, generators: dict):
        self.dir = Path(state_dir) if state_dir is not None else None
        self.description, self.fingerprint = description, fingerprint_of(description)
        self.parts = {"modules": {f"module{i}": m for i, m in enumerate(modules)}, "optimizer": optimizer,
                      "device": device, "generators": generators}
        self.modules = modules
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            clean_stale_temporaries(self.dir)

    @property
    def last_path(self) -> Path:
        return self.dir / STATE_FILE

    @property
    def best_path(self) -> Path:
        return self.dir / BEST_STATE_FILE

    def resume(self, desc: str) -> tuple[PretrainState | None, list | None]:
        """The saved state and best weights when they belong to this job; (None, None) otherwise."""
        if self.dir is None or not self.last_path.is_file():
            return None, None
        try:   # every saved state has a best epoch (the first epoch's dev loss beats none): read it first
            best = torch.load(self.best_path, map_location="cpu", weights_only=True)
        except Exception as e:   # missing, truncated or corrupt: never resume without it
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
            log.warning("%s cannot be resumed (%s: %s); starting fresh", self.last_path, self.best_path.name, reason)
            return None, None
        position = load_training_state(self.last_path, fingerprint=self.fingerprint, description=self.description,
                                       log=log, **self.parts)
        if position is None:
            return None, None
        state = PretrainState(**position)
        log.info("%s: resuming from %s at epoch %d", desc, self.last_path, state.epoch)
        return state, best

    def save(self, state: PretrainState, best: list | None, new_best: bool) -> None:
        if self.dir is None:
            return
        if new_best:
            torch_save(best, self.best_path)
        save_training_state(self.last_path, fingerprint=self.fingerprint, description=self.description,
                            position=asdict(state), **self.parts)

    def discard(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def train(objective, pparams: PretrainParams, s: PretrainSettings, device, desc: str,
          bf16: bool = False, *, state_dir=None, description: dict | None = None) -> tuple[list[dict], float]:
    """Train `objective` for `pparams.epochs` and keep the epoch with the lowest dev loss (the
    modules end with its weights); returns (history rows, dev loss before training).

    With a `state_dir`, the resumable state is saved there after every epoch but the last, and a
    state saved under the same `description` (default: the settings and data sizes) is resumed,
    exactly as fine-tuning does (minbert.train.loop); the caller removes the folder once the
    outputs are written."""
    modules = objective.modules()
    for m in modules:
        m.to(device)
    params = _named_parameters(modules)
    optimizer = build_adamw([(params, pparams.lr)], pparams.weight_decay)
    sampler = BucketBatchSampler(objective.lengths("train"), pparams.batch_size, shuffle=True, seed=s.seed)
    steps_per_epoch = len(sampler) if pparams.max_steps_per_epoch is None \
        else min(len(sampler), pparams.max_steps_per_epoch)
    if steps_per_epoch == 0:
        raise MinBertError(f"{desc}: no training examples")
    total_steps = pparams.epochs * steps_per_epoch
    warmup = int(pparams.warmup_ratio * total_steps)
    if description is None:
        description = {"settings": s.model_dump(), "sizes": {"train": len(objective.lengths("train")),
                                                             "dev": len(objective.lengths("dev"))}}
    # a state saved on one device type or in one precision never resumes in another
    description = {**description, "world": 1, "device_type": device.type, "precision": "bf16" if bf16 else "fp32"}
    saved = Resumable(state_dir, description, modules, optimizer, device, objective.generators())

    state, best = saved.resume(desc)
    if state is None:
        state = PretrainState(dev_before=mean_dev_loss(objective, device, bf16, pparams.batch_size))
        log.info("%s: dev loss before training %.4f", desc, state.dev_before)
    while state.epoch < pparams.epochs:
        epoch = state.epoch + 1
        for m in modules:
            m.train()
        sampler.set_epoch(epoch)
        batches = [b for _, b in zip(range(steps_per_epoch), sampler)]
        t0, total, count = time.perf_counter(), 0.0, 0
        bar = tqdm(total=sum(len(b) for b in batches), desc=f"{desc} epoch {epoch}/{pparams.epochs}",
                   unit="ex", dynamic_ncols=True, mininterval=1.0)
        for indices in batches:
            lr = set_lr(optimizer, state.step, total_steps, warmup, pparams.lr_schedule)
            with autocast(device, bf16):
                loss_sum, n = objective.loss_sum("train", indices, device)
            loss = loss_sum / max(n, 1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if pparams.grad_clip:
                torch.nn.utils.clip_grad_norm_([p for _, p in params], pparams.grad_clip)
            optimizer.step()
            state.step += 1
            total, count = total + loss_sum.detach().float(), count + n    # summed on the device, read once
            bar.update(len(indices))
            bar.set_postfix(lr=f"{lr:.2e}", refresh=False)
        bar.close()
        train_loss = float(total) / max(count, 1)
        dev_loss = mean_dev_loss(objective, device, bf16, pparams.batch_size)
        if not (math.isfinite(train_loss) and math.isfinite(dev_loss)):
            saved.discard()    # resumed with the same settings it would diverge again
            raise MinBertError(f"{desc}: the {'training' if not math.isfinite(train_loss) else 'dev'} loss became "
                               f"non-finite in epoch {epoch}; lower `lr`"
                               f"{' or set precision: fp32' if bf16 else ''}")
        state.history.append({"epoch": epoch, "train_loss": train_loss, "dev_loss": dev_loss})
        state.epoch = epoch
        log.info("%s epoch %d: train loss %.4f, dev loss %.4f (%.1fs, %d steps)", desc, epoch, train_loss,
                 dev_loss, time.perf_counter() - t0, len(batches))
        new_best = dev_loss < state.best_loss
        if new_best:
            state.best_loss, state.best_epoch = dev_loss, epoch
            best = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
        if state.epoch < pparams.epochs:    # the last epoch's state is not needed: the run ends right after it
            saved.save(state, best, new_best)
    for m, weights in zip(modules, best):
        m.load_state_dict(weights)
    return state.history, state.dev_before


def _setup(s: PretrainSettings, model_name: str):
    set_threads(s.threads)
    seed_everything(s.seed)
    device = pick_device(s.device)
    bf16 = configure(device, s.precision, s.deterministic)
    encoder, mlm_tensors, folder = load_encoder(model_name)
    tok = Tokenizer(folder, s.max_length)
    return device, bf16, encoder, mlm_tensors, folder, tok


def pretrain_mlm(s: PretrainSettings, data: dict, model_name: str, cache_dir=None, *, state_dir=None,
                 description: dict | None = None) -> PretrainResult:
    """Masked-LM further pretraining on the texts of the pretraining's `mlm.tasks` (resumable: see `train`)."""
    pparams = s.pretraining
    device, bf16, encoder, mlm_tensors, folder, tok = _setup(s, model_name)
    head, loaded = build_mlm_head(encoder, mlm_tensors, str(folder))
    log.info("MLM head %s", "loaded from the checkpoint" if loaded else "freshly initialised (the checkpoint has none)")
    train_frames = mlm_frames(data["train"], pparams, s.seed)
    dev_frames = mlm_frames(data["dev"], pparams, s.seed)
    train_set = encode_texts(tok, train_frames, cache_dir)
    dev_set = _cap(encode_texts(tok, dev_frames, cache_dir), pparams.dev_size, s.seed)
    objective = MlmObjective(encoder, head, tok, train_set, dev_set, pparams.mlm.mask_prob, s.seed)
    history, before = train(objective, pparams, s, device, "mlm", bf16, state_dir=state_dir, description=description)
    metrics = {"mlm_head_loaded": loaded, "tasks": list(pparams.mlm.tasks),
               "train_examples": {t: len(f) for t, f in train_frames.items()}, "dev_examples": len(dev_set)}
    return PretrainResult(encoder.cpu(), head.cpu(), history, _loss_summary(history, before) | metrics)


def pretrain_nli(s: PretrainSettings, data: dict, model_name: str, cache_dir=None, data_dir="results/data", *,
                 state_dir=None, description: dict | None = None) -> PretrainResult:
    """NLI pretraining of sentence embeddings with the pretraining's `nli.objective` (resumable: see `train`)."""
    pparams = s.pretraining
    device, bf16, encoder, _, folder, tok = _setup(s, model_name)
    objective_name = pparams.nli.objective
    examples = {split: nli_examples(tok, data[split]["nli"], objective_name, str(Path(data_dir) / f"nli-{split}.tsv"),
                                    cache_dir)
                for split in ("train", "dev")}
    examples["dev"] = _subset(examples["dev"], pparams.dev_size, s.seed)
    objective = NliObjective(encoder, tok, objective_name, examples["train"], examples["dev"],
                             pparams.nli.temperature, pparams.nli.margin, pparams.nli.pooling)
    history, before = train(objective, pparams, s, device, f"nli-{objective_name}", bf16, state_dir=state_dir,
                            description=description)
    metrics = {"objective": objective_name, "pooling": pparams.nli.pooling,
               "train_examples": len(examples["train"]["parts"][0]), "dev_examples": len(examples["dev"]["parts"][0])}
    return PretrainResult(encoder.cpu(), None, history, _loss_summary(history, before) | metrics)


def _loss_summary(history: list[dict], before: float) -> dict:
    best = min(history, key=lambda r: r["dev_loss"])
    return {"dev_loss_before": before, "dev_loss_first": history[0]["dev_loss"],
            "dev_loss_last": history[-1]["dev_loss"], "train_loss_last": history[-1]["train_loss"],
            "dev_loss_best": best["dev_loss"], "best_epoch": best["epoch"], "epochs": len(history)}


# ---------------------------------------------------------------- a pretraining job

def refuse_torchrun() -> None:
    """Pretraining runs in one process: MLM and NLI have no data-parallel loop, and under torchrun
    every rank would train a duplicate and write the same model folder."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise MinBertError(f"pretraining runs in one process, not under torchrun ({world} processes); start it with "
                           f"python -m stages.pretrain (torchrun is for the finetune stage)")


def pretrain(s: PretrainSettings, data_dir, model_dir, history_path, metrics_path, *, start_model: str,
             cache_dir=None, state_dir=None, description: dict | None = None, name: str = "") -> dict:
    """Run a pretraining of any kind from `start_model`; write the model folder, history.csv and
    metrics.json (each atomically); return the metrics.

    While it runs, its resumable state lives in `state_dir` (default `<model_dir>.state`): an
    interrupted pretraining run again under the same `description` (the job's, minbert.pipeline.plan;
    default: the settings and data sizes) resumes from its last finished epoch, bit for bit. The
    folder is removed once the outputs are written."""
    kind = s.pretraining.kind
    if state_dir is None:
        state_dir = Path(model_dir).with_name(Path(model_dir).name + ".state")
    if kind == "para_first":
        history, metrics, encoder, head = _paraphrase_first(s, data_dir, start_model, cache_dir, state_dir,
                                                            description, name)
    else:
        data = read_pretraining_data(data_dir, s)
        resumable = {"state_dir": state_dir, "description": description}
        result = (pretrain_mlm(s, data, start_model, cache_dir, **resumable) if kind == "mlm"
                  else pretrain_nli(s, data, start_model, cache_dir, data_dir, **resumable))
        history, metrics, encoder = result.history, {"kind": kind, **result.metrics}, result.encoder
        head = result.mlm_head.checkpoint_tensors() if result.mlm_head is not None else None
    with atomic_path(model_dir) as tmp:
        save_hf_folder(tmp, encoder, tokenizer_folder=resolve_model(start_model), mlm_head=head)
    write_pretraining_history(history_path, history)
    write_json(metrics_path, metrics)
    shutil.rmtree(state_dir, ignore_errors=True)
    return metrics


def _paraphrase_first(s: PretrainSettings, data_dir, start_model: str, cache_dir, state_dir, description, name):
    """The paraphrase task alone on all of Quora's training data (minbert.params.settings.para_first_config),
    as resumable multi-task fine-tuning; its best encoder is the pretrained model."""
    import tempfile

    from minbert.params.settings import FinetuneSettings, para_first_config
    from minbert.train.experiment import finetune_experiment
    from minbert.train.multitask import load_checkpoint

    ft = FinetuneSettings(model=start_model, seed=s.seed, max_length=s.max_length, finetune=para_first_config(s),
                          device=s.device, precision=s.precision, deterministic=s.deterministic,
                          threads=s.threads)
    with tempfile.TemporaryDirectory(prefix="para_first.") as work:
        result = finetune_experiment(ft, data_dir, work, state_dir=state_dir, description=description,
                                     cache_dir=cache_dir, name=name or "para_first", evaluate_first=True,
                                     stage="pretrain")
        model, _, _ = load_checkpoint(Path(work) / MODEL_FILE)
    rows = result.history.to_dict("records")
    history = [{"epoch": int(r["epoch"]), "train_loss": r.get("train_para_loss"), "dev_loss": r.get("dev_para_loss")}
               for r in rows]
    metrics = {"kind": "para_first", "dev_loss_before": (result.dev_before or {}).get("para_loss"),
               "dev_loss_first": history[0]["dev_loss"] if history else None,
               "dev_loss_last": history[-1]["dev_loss"] if history else None,
               "dev_para_acc_best": result.best_dev.get("para_acc"), "best_epoch": result.best_epoch,
               "epochs": len(history)}
    return history, metrics, model.encoder, None


def write_pretraining_history(path, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    for col in HISTORY_COLUMNS:
        if col not in frame.columns:
            frame[col] = pd.Series(dtype=float)
    with atomic_path(path) as tmp:
        frame[HISTORY_COLUMNS].to_csv(tmp, index=False)
