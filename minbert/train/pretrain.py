"""Further pretraining before multi-task fine-tuning: masked-LM on task texts, or NLI sentence
embeddings. (Paraphrase-first is fine-tuning of one task: minbert.train.para_first.)

Masked-LM and NLI use one explicit training loop (`train`) that drives an objective object
knowing its data and its loss: minbert.train.mlm's `MlmObjective` (BERT masking, loss per chosen
token) or minbert.train.nli's `NliObjective` (regression, contrastive or triplet loss per
example). Each epoch records the mean train loss and the dev loss; the dev loss of the starting
model is measured before the first step, so a run shows whether it lowered its own objective. The
outputs (model folder, history.csv, metrics.json) are written by minbert.train.pretrained.

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
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from minbert.core.errors import MinBertError
from minbert.core.io import clean_stale_temporaries, torch_save
from minbert.core.layout import BEST_STATE_FILE, STATE_FILE
from minbert.core.nli_data import NLI_DATA
from minbert.core.plain import as_json
from minbert.core.progress import Progress, eta
from minbert.core.provenance import fingerprint_of, with_runtime
from minbert.core.runtime import Runtime, seed_everything, start_runtime
from minbert.core.settings import Pretraining, PretrainSettings, in_own_registry, pretrain_splits
from minbert.core.tasks import TASKS
from minbert.data.downsample import downsample
from minbert.data.encode import encode_cached
from minbert.data.read import load_splits
from minbert.data.sampler import BucketBatchSampler
from minbert.data.views import Encoded
from minbert.model.bert import BertModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.train.mlm import MlmObjective, build_mlm_head
from minbert.train.nli import NliObjective, nli_examples, subset_examples
from minbert.train.optim import AdamW, build_adamw, set_lr
from minbert.train.plateau import lr_budget
from minbert.train.points import eval_points
from minbert.train.pretrained import PretrainFiles, write_pretrained
from minbert.train.resumable import SavedParts, load_training_state, save_training_state

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- masked LM

def read_pretraining_data(data_dir, s: PretrainSettings) -> dict[str, dict[str, pd.DataFrame]]:
    """{split: {task: frame}} of exactly the prepared files the job reads (minbert.core.settings.pretrain_splits)."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for task, split in pretrain_splits(s):
        frames = load_splits(data_dir, task, (split,))
        if split not in frames:
            raise MinBertError(f"{data_dir}: no {task}-{split}.tsv; run the prepare stage first")
        out.setdefault(split, {})[task] = frames[split]
    return out


def mlm_frames(frames: dict[str, pd.DataFrame], pparams: Pretraining, seed: int) -> dict[str, pd.DataFrame]:
    """Each MLM task's frame, downsampled per `mlm.downsample` (smallest by default)."""
    return downsample(frames, pparams.mlm.downsample, seed)


def encode_texts(tok: Tokenizer, frames: dict[str, pd.DataFrame], cache_dir=None) -> Encoded:
    """Single-sentence tasks as `[CLS] s [SEP]`; pair tasks as `[CLS] a [SEP] b [SEP]`, the input
    a cross-encoder sees in fine-tuning."""
    encoded: Encoded = []
    for task, frame in frames.items():
        if NLI_DATA.names(task) or TASKS[task].pair:
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


# ---------------------------------------------------------------- the loop

@dataclass
class PretrainResult:
    encoder: BertModel
    mlm_head: object | None
    history: list[dict]
    metrics: dict = field(default_factory=dict)


@torch.no_grad()
def mean_dev_loss(objective, runtime: Runtime, batch_size: int) -> float:
    """Mean dev loss (per token for MLM, per example for NLI) over fixed, length-ordered batches."""
    for m in objective.modules():
        m.eval()
    sampler = BucketBatchSampler(objective.lengths("dev"), batch_size, shuffle=False)
    gen = objective.new_eval_generator()
    total, count = 0.0, 0
    for indices in sampler:
        with runtime.amp():
            loss, n = objective.loss_sum("dev", indices, runtime.device, generator=gen)
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
    best_epoch: float = 0             # where the lowest dev loss was (a fraction of an epoch within one)
    dev_before: float | None = None   # the starting model's dev loss


@dataclass(frozen=True)
class ResumeAt:
    """Where a pretraining's resumable state lives and what it is saved under: `state_dir` (None:
    nothing is saved, nothing resumed), the job's `description` (default: the settings and data
    sizes) and its `fingerprint` (the job's, computed once by minbert.pipeline.runinfo from it)."""
    state_dir: str | Path | None = None
    description: dict | None = None
    fingerprint: str | None = None


class Resumable:
    """One pretraining's resumable state: where it lives (`at`), the description whose fingerprint a
    saved state must carry to be resumed, and what it holds (`parts`)."""

    def __init__(self, at: ResumeAt, description: dict, parts: SavedParts):
        self.dir = Path(at.state_dir) if at.state_dir is not None else None
        self.description, self.fingerprint = description, at.fingerprint or fingerprint_of(description)
        self.parts = parts
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
                                       parts=self.parts, log=log)
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
                            position=asdict(state), parts=self.parts)

    def discard(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def train(objective, pparams: Pretraining, s: PretrainSettings, runtime: Runtime, desc: str,
          at: ResumeAt = ResumeAt()) -> tuple[list[dict], float]:
    """Train `objective` for `pparams.epochs` and keep the epoch with the lowest dev loss (the
    modules end with its weights); returns (history rows, dev loss before training).

    With a state folder (`at`), the resumable state is saved there after every epoch but the last,
    and a state saved under the same description (`at`: the job's, and its fingerprint) is resumed,
    exactly as fine-tuning does (minbert.train.loop); the caller removes the folder once the
    outputs are written."""
    u, sampler, steps_per_epoch = start_updates(objective, pparams, s, runtime, desc, at.state_dir)
    modules = u.objective.modules()
    description = at.description
    if description is None:
        description = {"settings": as_json(s), "sizes": {"train": len(objective.lengths("train")),
                                                             "dev": len(objective.lengths("dev"))}}
    # a state saved on one device type or in one precision never resumes in another
    description = with_runtime(description, runtime.device.type, runtime.precision, 1)
    parts = SavedParts({**{f"module{i}": m for i, m in enumerate(modules)}, "scaler": u.scaler}, u.optimizer,
                       runtime.device, objective.generators())
    saved = Resumable(at, description, parts)
    state, best = saved.resume(desc)
    if state is None:
        state = PretrainState(dev_before=mean_dev_loss(objective, runtime, pparams.batch_size))
        log.info("%s: dev loss before training %.4f", desc, state.dev_before)
    while state.epoch < pparams.epochs:
        epoch = state.epoch + 1
        sampler.set_epoch(epoch)
        batches = [b for _, b in zip(range(steps_per_epoch), sampler)]
        best, new_best = _evaluated_epoch(u, state, batches, best, saved, desc)
        state.epoch = epoch
        if state.epoch < pparams.epochs:    # the last epoch's state is not needed: the run ends right after it
            saved.save(state, best, new_best)
    for m, weights in zip(modules, best):
        m.load_state_dict(weights)
    return state.history, state.dev_before


def _evaluated_epoch(u: _Updates, state: PretrainState, batches: list, best, saved: Resumable,
                     desc: str) -> tuple[list | None, bool]:
    """The next epoch's updates over `batches`, the dev loss after each of its `evals_per_epoch` parts
    (a history row each, at its fraction of the epoch) and the best weights so far; returns them and
    whether this epoch found better ones."""
    epoch, pparams, new_best, start = state.epoch + 1, u.pparams, False, 0
    for end in eval_points(len(batches), pparams.evals_per_epoch):
        t0 = time.perf_counter()
        train_loss = train_epoch(u, state, batches[start:end], f"{desc} epoch {epoch}/{pparams.epochs}",
                                 (start, len(batches)))
        dev_loss = mean_dev_loss(u.objective, u.runtime, pparams.batch_size)
        _check_finite(saved, desc, epoch, train_loss, dev_loss, u.runtime)
        at = round(epoch - 1 + end / len(batches), 4)
        at = int(at) if float(at).is_integer() else at
        budget = float(lr_budget(state.step, *u.schedule, u.pparams.lr_schedule)) * u.pparams.lr
        state.history.append({"epoch": at, "update": state.step, "lr_budget": budget, "train_loss": train_loss,
                              "dev_loss": dev_loss})
        log.info("%s epoch %g: train loss %.4f, dev loss %.4f (%.1fs, %d steps)", desc, at, train_loss,
                 dev_loss, time.perf_counter() - t0, end - start)
        if dev_loss < state.best_loss:
            new_best = True
            state.best_loss, state.best_epoch = dev_loss, at
            best = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in u.objective.modules()]
        start = end
    return best, new_best


def start_updates(objective, pparams: Pretraining, s: PretrainSettings, runtime: Runtime, desc: str,
                  state_dir=None) -> tuple[_Updates, BucketBatchSampler, int]:
    """What a pretraining's updates work with (the modules on the device, the optimiser, the lr
    schedule, fp16's scaler, the progress file), the sampler of its batches and its updates per epoch."""
    modules = objective.modules()
    for m in modules:
        m.to(runtime.device)
    params = _named_parameters(modules)
    optimizer = build_adamw([(params, pparams.lr)], pparams.weight_decay)
    sampler = BucketBatchSampler(objective.lengths("train"), pparams.batch_size, shuffle=True, seed=s.seed)
    steps_per_epoch = len(sampler) if pparams.max_steps_per_epoch is None \
        else min(len(sampler), pparams.max_steps_per_epoch)
    if steps_per_epoch == 0:
        raise MinBertError(f"{desc}: no training examples")
    schedule = (pparams.epochs * steps_per_epoch, int(pparams.warmup_ratio * pparams.epochs * steps_per_epoch))
    # fp16: the loss scaled up for float16's range, a step skipped where the gradients overflowed
    scaler = torch.amp.GradScaler(runtime.device.type) if runtime.fp16 else None
    u = _Updates(objective, optimizer, params, pparams, runtime, schedule, scaler, _progress(state_dir))
    return u, sampler, steps_per_epoch


def _progress(state_dir):
    """Where the run is, for `minbert progress`, beside the resumable state (none without one)."""
    if state_dir is None:
        return None
    return Progress(state_dir, "pretrain")


def _check_finite(saved: Resumable, desc: str, epoch: int, train_loss: float, dev_loss: float, runtime) -> None:
    if not (math.isfinite(train_loss) and math.isfinite(dev_loss)):
        saved.discard()    # resumed with the same settings it would diverge again
        raise MinBertError(f"{desc}: the {'training' if not math.isfinite(train_loss) else 'dev'} loss became "
                           f"non-finite in epoch {epoch}; lower `lr`"
                           f"{' or set precision: fp32' if runtime.bf16 or runtime.fp16 else ''}")


@dataclass
class _Updates:
    """What each update of a pretraining uses; `schedule`: the run's (total updates, warm-up updates)."""
    objective: object
    optimizer: AdamW
    params: list
    pparams: Pretraining
    runtime: Runtime
    schedule: tuple[int, int]
    scaler: object | None = None      # torch.amp.GradScaler of an fp16 run
    progress: object | None = None    # minbert.core.progress.Progress: where the run is, for `minbert progress`

    def step(self, batch: dict, step: int) -> tuple[torch.Tensor, int]:
        """One update on a batch the objective built (`objective.batch`), the `step`-th of the run:
        forward, backward, clip, AdamW. Returns the summed loss (on the device) and its count."""
        set_lr(self.optimizer, step, *self.schedule, self.pparams.lr_schedule)
        with self.runtime.amp():
            loss_sum, n = self.objective.loss_of(batch)
        loss = loss_sum / max(n, 1)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.pparams.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for _, p in self.params], self.pparams.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)        # skipped when the scaled gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss_sum, n


def train_epoch(u: _Updates, state: PretrainState, batches: list[list[int]], desc: str,
                part: tuple[int, int] = (0, 0)) -> float:
    """An epoch's updates over `batches` (`part`: where they start in an epoch of how many updates, when
    they are a part of it between two dev evaluations); returns their mean train loss (read from the
    device once)."""
    for m in u.objective.modules():
        m.train()
    total, count = 0.0, 0
    start, t0 = state.step, time.perf_counter()
    bar = tqdm(total=sum(len(b) for b in batches), desc=desc, unit="ex", dynamic_ncols=True, mininterval=1.0)
    for i, indices in enumerate(batches):
        loss_sum, n = u.step(u.objective.batch("train", indices, u.runtime.device), state.step)
        state.step += 1
        total, count = total + loss_sum.detach().float(), count + n    # summed on the device, read once
        bar.update(len(indices))
        if u.progress is not None and u.progress.due():
            seconds = time.perf_counter() - t0
            u.progress.update(phase=u.pparams.kind, phases=1, epoch=state.epoch + 1, epochs=u.pparams.epochs,
                              epoch_update=part[0] + i + 1, epoch_updates=part[1] or len(batches), update=state.step,
                              updates=u.schedule[0], updates_per_second=(state.step - start) / max(seconds, 1e-9),
                              seconds_left=eta(state.step - start, u.schedule[0] - start, seconds))
    bar.close()
    return float(total) / max(count, 1)


def _setup(s: PretrainSettings, model_name: str):
    runtime = start_runtime(s)
    seed_everything(s.seed)
    encoder, mlm_tensors, folder = load_encoder(model_name)
    tok = Tokenizer(folder, s.max_length)
    return runtime, encoder, mlm_tensors, folder, tok


def pretrain_mlm(s: PretrainSettings, data: dict, model_name: str, cache_dir=None,
                 at: ResumeAt = ResumeAt()) -> PretrainResult:
    """Masked-LM further pretraining on the texts of the pretraining's `mlm.tasks` (resumable: see `train`)."""
    pparams = s.pretraining
    runtime, encoder, mlm_tensors, folder, tok = _setup(s, model_name)
    head, loaded = build_mlm_head(encoder, mlm_tensors, str(folder))
    log.info("MLM head %s", "loaded from the checkpoint" if loaded else "freshly initialised (the checkpoint has none)")
    train_frames = mlm_frames(data["train"], pparams, s.seed)
    dev_frames = mlm_frames(data["dev"], pparams, s.seed)
    train_set = encode_texts(tok, train_frames, cache_dir)
    dev_set = _cap(encode_texts(tok, dev_frames, cache_dir), pparams.dev_size, s.seed)
    objective = MlmObjective(encoder, head, tok, train_set, dev_set, pparams.mlm.mask_prob, s.seed)
    history, before = train(objective, pparams, s, runtime, "mlm", at)
    metrics = {"mlm_head_loaded": loaded, "tasks": list(pparams.mlm.tasks),
               "train_examples": {t: len(f) for t, f in train_frames.items()}, "dev_examples": len(dev_set)}
    return PretrainResult(encoder.cpu(), head.cpu(), history, _loss_summary(history, before) | metrics)


def pretrain_nli(s: PretrainSettings, data: dict, model_name: str, cache_dir=None, data_dir="results/data",
                 at: ResumeAt = ResumeAt()) -> PretrainResult:
    """NLI pretraining of sentence embeddings with the pretraining's `nli.objective` (resumable: see `train`)."""
    pparams = s.pretraining
    runtime, encoder, _, folder, tok = _setup(s, model_name)
    objective_name = pparams.nli.objective
    examples = {split: nli_examples(tok, data[split][NLI_DATA.name], objective_name,
                                    str(Path(data_dir) / NLI_DATA.file(split)), cache_dir)
                for split in NLI_DATA.splits}
    examples["dev"] = subset_examples(examples["dev"], pparams.dev_size, s.seed)
    objective = NliObjective(encoder, tok, pparams.nli, examples["train"], examples["dev"])
    history, before = train(objective, pparams, s, runtime, f"nli-{objective_name}", at)
    metrics = {"objective": objective_name, "pooling": pparams.nli.pooling,
               "train_examples": len(examples["train"]["parts"][0]), "dev_examples": len(examples["dev"]["parts"][0])}
    return PretrainResult(encoder.cpu(), None, history, _loss_summary(history, before) | metrics)


def _loss_summary(history: list[dict], before: float) -> dict:
    best = min(history, key=lambda r: r["dev_loss"])
    return {"dev_loss_before": before, "dev_loss_first": history[0]["dev_loss"],
            "dev_loss_last": history[-1]["dev_loss"], "train_loss_last": history[-1]["train_loss"],
            "dev_loss_best": best["dev_loss"], "best_epoch": best["epoch"], "epochs": len(history)}


# ---------------------------------------------------------------- a pretraining job

@in_own_registry
def pretrain(s: PretrainSettings, files: PretrainFiles, *, start_model: str, description: dict | None = None,
             name: str = "", fingerprint: str | None = None) -> dict:
    """Run a masked-LM or NLI pretraining from `start_model`; write the model folder, history.csv
    and metrics.json (minbert.train.pretrained); return the metrics.

    While it runs, its resumable state lives in `files.state_dir`: an interrupted pretraining run
    again under the same `description` (the job's, minbert.pipeline.plan; default: the settings and
    data sizes) resumes from its last finished epoch, bit for bit. The folder is removed once the
    outputs are written."""
    kind = s.pretraining.kind
    data = read_pretraining_data(files.data, s)
    at = ResumeAt(files.state_dir, description, fingerprint)
    result = (pretrain_mlm(s, data, start_model, files.cache, at) if kind == "mlm"
              else pretrain_nli(s, data, start_model, files.cache, files.data, at))
    head = result.mlm_head.checkpoint_tensors() if result.mlm_head is not None else None
    return write_pretrained(files, start_model, result.encoder, result.history, {"kind": kind, **result.metrics},
                            head)
