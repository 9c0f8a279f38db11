"""The multi-task training loop: explicit, resumable, data-parallel under torchrun.

Reads like nanoGPT's train.py, in plain parts:
- `Plan`: every epoch's updates, computed up front (minbert.train.schedules), hence the lr schedule;
- `TrainState`: where the run is (stage, epoch, update, history, best so far), saved with the
  model, optimiser and RNG states as `last.pt` in the run's state folder after every epoch
  (minbert.train.resumable, which pretraining saves its state with too);
- `run_epoch`: one epoch's updates (each task's objective, PCGrad, all-reduce, clip, step); a task's
  objective (`TaskObjective`) gives its loss from the model's output and the labels, with
  distillation (`Distilled`) and SMART (`Smart`) as wrappers that change or add to that loss;
- `end_of_epoch`: dev evaluation, the best model (`best.pt`, beside `last.pt`), the state.
The declared outputs (`model.pt`, `history.csv` in `out_dir`) are written only when the run has
finished, from the best model; the state folder is then removed. The state folder is not a
declared output, so an engine that cleans up an interrupted job's outputs leaves it alone and the
next run resumes from the last finished epoch, if the job's fingerprint (minbert.pipeline.plan) is the one
the state was written for; otherwise it starts fresh and says what changed.

Multi-process data parallel: launched with torchrun, every rank takes its slice of each global
batch and gradients are averaged across ranks before the update (an explicit all-reduce, which
also works with PCGrad and SMART's extra gradients).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm import tqdm

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, clean_stale_temporaries, torch_save
from minbert.core.layout import BEST_STATE_FILE, HISTORY_FILE, MODEL_FILE, STATE_FILE
from minbert.core.metrics import metric_undefined, selection_score, summarise, task_metric
from minbert.core.provenance import fingerprint_of
from minbert.core.runtime import autocast
from minbert.core.tasks import TASKS
from minbert.model.tokenizer import Tokenizer
from minbert.params import FinetuneParams
from minbert.train.losses import distill_loss, task_loss
from minbert.train.multitask import (
    MultitaskModel,
    TaskData,
    checkpoint_dict,
    collate,
    encoder_parameters,
    head_parameters,
    predict_task,
    predictions,
    to_device,
)
from minbert.train.optim import build_adamw, set_lr
from minbert.train.resumable import load_training_state, save_training_state
from minbert.train.schedules import epoch_plan, sequential_stages

log = logging.getLogger("minbert.train.loop")
EVAL_BATCH_SIZE = 128          # dev evaluation during training (prediction speed lives in predict)


# ---------------------------------------------------------------- distributed helpers

@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_setting: str = "auto") -> tuple[DistInfo, torch.device | None]:
    """Under torchrun (WORLD_SIZE > 1) start the process group; gloo on CPU, nccl on CUDA. The
    rank's GPU is set first and named to the group (`device_id`), so NCCL binds each rank to its own
    device; `shutdown_distributed` ends the group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), None
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = torch.cuda.is_available() and device_setting != "cpu"
    device = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    return DistInfo(rank, world), device


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def refuse_batch_statistics_under_ddp(cfg: FinetuneParams, tasks: list[str], world: int) -> None:
    """The correlation loss is a statistic of the whole batch: under torchrun each process would
    compute it on its slice (one pair per rank at batch 8 on 8 GPUs: no gradient at all)."""
    if world > 1 and cfg.heads.sts_loss != "mse" and any(TASKS[t].kind == "regression" for t in tasks):
        raise MinBertError(f"finetune.heads.sts_loss '{cfg.heads.sts_loss}' is a correlation over the whole batch, "
                           f"which {world} processes would each compute on their slice; run this experiment in one "
                           f"process (python -m stages.finetune) or use sts_loss: mse")


def average_gradients(params: list[torch.nn.Parameter], world: int, flag: torch.Tensor | None = None) -> None:
    """Average the gradients over the ranks (one all-reduce); `flag` (a float tensor, e.g. this
    update's count of non-finite losses) rides along and comes back summed over the ranks."""
    if world <= 1:
        return
    # every rank runs the same tasks, so the same parameters have no gradient on all ranks; they
    # stay None (a zero gradient would let AdamW move them by momentum and weight decay, unlike one process)
    grads = [p.grad for p in params if p.grad is not None]
    extra = [flag.reshape(-1).to(grads[0].dtype)] if flag is not None else []
    flat = torch.cat([g.reshape(-1) for g in grads] + extra)
    dist.all_reduce(flat)
    if flag is not None:
        flag.copy_(flat[-flag.numel():].view_as(flag))
    flat /= world
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def barrier(dist_info: DistInfo) -> None:
    if dist_info.world > 1:
        dist.barrier()


# ---------------------------------------------------------------- batches

class TaskStream:
    """Endless length-bucketed batches of one task for one epoch; cycles (reshuffled) when the
    plan asks for more batches than the task has. Under data parallelism, each rank takes its
    slice of every global batch, so N processes see exactly the batches one process would.

    A task walked through (`walked`: the number of its batches earlier epochs drew) does not
    restart each epoch: it continues where the last epoch stopped, in passes over all its data."""

    def __init__(self, data: TaskData, tokenizer: Tokenizer, batch_size: int, seed: int, epoch: int,
                 dist_info: DistInfo, walked: int | None = None, features=None):
        from minbert.train.sampler import BucketBatchSampler

        self.data, self.tokenizer, self.dist = data, tokenizer, dist_info
        self.features = features     # a frozen encoder's stored embeddings (minbert.train.frozen): batches of those
        self.sampler = BucketBatchSampler(data.lengths(), batch_size, shuffle=True, seed=seed)
        self.epoch, self.cycle, self.walking = epoch, 0, walked is not None
        self.seed, self.batches = seed, 0
        skip = 0
        if self.walking:
            self.cycle, skip = divmod(walked, max(1, len(self.sampler)))
        self._it = self._start()
        for _ in range(skip):
            next(self._it)

    def _start(self):
        # a walked task's passes are numbered across epochs, an epoch's cycles within it
        self.sampler.set_epoch(10**6 + self.cycle if self.walking else self.epoch * 1000 + self.cycle)
        return iter(self.sampler)

    def next(self) -> dict:
        try:
            idx = next(self._it)
        except StopIteration:
            self.cycle += 1
            self._it = self._start()
            idx = next(self._it)
        swap = None
        if self.data.symmetric:   # drawn for the whole global batch, so every rank agrees
            rng = np.random.default_rng([self.seed, self.epoch, self.batches, 7])
            swap = (rng.random(len(idx)) < 0.5).tolist()
        self.batches += 1
        keep = list(range(len(idx)))[self.dist.rank::self.dist.world] or [0]
        rows, swaps = [idx[k] for k in keep], None if swap is None else [swap[k] for k in keep]
        if self.features is not None:
            return self.features.batch(rows, swaps)
        return collate(self.data, rows, self.tokenizer, swaps)


# ---------------------------------------------------------------- evaluation

def dev_metrics(model: MultitaskModel, dev: dict[str, TaskData], tokenizer: Tokenizer, batch_size: int,
                device, bf16: bool, features: dict | None = None) -> dict[str, float]:
    """Dev metrics and losses of every labelled task, plus overall/mean when they apply; a task
    with stored embeddings of a frozen encoder (`features`, minbert.train.frozen) runs its head only."""
    out: dict[str, float] = {}
    amp = lambda: autocast(device, bf16)  # noqa: E731
    for task, data in dev.items():
        if data.labels is None or len(data) == 0:
            continue
        if features and task in features:
            res = features[task].predict(model, amp)
        else:
            res = predict_task(model, data, tokenizer, batch_size, device, amp)
        out[TASKS[task].metric_key] = task_metric(task, res["prediction"], data.labels)
        if out[TASKS[task].metric_key] is None:   # undefined: this epoch cannot be selected (selection_score)
            log.warning("dev %s is undefined (%s); an epoch with it is not selected as the best",
                        TASKS[task].metric_key, metric_undefined(task, res["prediction"], data.labels))
        out[f"{task}_loss"] = res["loss"]
    return summarise(out)


# ---------------------------------------------------------------- the plan

@dataclass
class Plan:
    """Every epoch's updates, fixed before the first step (so the lr schedule knows its length).

    `stages` are the task groups trained one after another: one group of all tasks, or one task
    per group for sequential fine-tuning."""
    stages: list[list[str]]
    epochs: dict[tuple[int, int], list[tuple[str, ...]]]     # (stage, epoch) -> updates
    total_updates: int
    warmup: int

    @classmethod
    def build(cls, cfg: FinetuneParams, tasks: list[str], sizes: dict[str, int], seed: int) -> "Plan":
        sequential = cfg.schedule == "sequential"
        stages = sequential_stages(tasks) if sequential else [tasks]
        epochs = {}
        for si, stage_tasks in enumerate(stages):
            unit = cfg.epoch_unit if cfg.epoch_unit in ("smallest", "largest") or cfg.epoch_unit in stage_tasks \
                else "smallest"
            for epoch in range(cfg.epochs):
                epochs[(si, epoch)] = epoch_plan("task_by_task" if sequential else cfg.schedule, stage_tasks, sizes,
                                                 cfg.batch_size, unit, seed, epoch, cfg.temperature,
                                                 cfg.max_steps_per_epoch)
        total = sum(len(p) for p in epochs.values())
        return cls(stages, epochs, total, int(cfg.warmup_ratio * total))

    def walked(self, stage: int, epoch: int, task: str) -> int:
        """How many batches of `task` the stage's epochs before `epoch` drew."""
        return sum(task in update for e in range(epoch) for update in self.epochs[(stage, e)])


# ---------------------------------------------------------------- the state

@dataclass
class TrainState:
    """Where a run is; saved after every epoch (with the model, optimiser and RNGs) as last.pt."""
    stage: int = 0
    epoch: int = 0                    # within the stage
    update: int = 0                   # global, across epochs and stages
    history: list = field(default_factory=list)
    best_score: float = -math.inf
    best_epoch: int = -1
    best_dev: dict = field(default_factory=dict)
    stage_best: float = -math.inf     # sequential: each stage keeps its own best
    seconds: float = 0.0
    examples: int = 0
    dev_before: dict | None = None


@dataclass
class Run:
    """What one `fit` call works with (fixed for the run)."""
    model: MultitaskModel
    tokenizer: Tokenizer
    train: dict[str, TaskData]
    dev: dict[str, TaskData]
    cfg: FinetuneParams
    seed: int
    device: torch.device
    bf16: bool
    dist: DistInfo
    optimizer: torch.optim.Optimizer
    params: list
    momentum: object | None                     # SMART's momentum copy of the model (or None)
    generators: dict[str, torch.Generator]
    state_dir: Path
    fingerprint: str
    description: dict
    checkpoint_extra: dict
    progress: bool
    features: dict = field(default_factory=dict)       # task -> its training split's stored embeddings
    dev_features: dict = field(default_factory=dict)   # task -> its dev split's (minbert.train.frozen)
    objectives: dict = field(default_factory=dict)     # task -> its TaskObjective (Run.objective)

    @property
    def last_path(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def best_path(self) -> Path:
        return self.state_dir / BEST_STATE_FILE

    def amp(self):
        return autocast(self.device, self.bf16)

    def objective(self, task: str) -> TaskObjective:
        """The task's training objective (`build_objective`), built on first use."""
        if task not in self.objectives:
            self.objectives[task] = build_objective(self, task)
        return self.objectives[task]


def _saved_parts(run: Run) -> dict:
    return {"modules": {"model": run.model, "momentum": run.momentum.module if run.momentum is not None else None},
            "optimizer": run.optimizer, "device": run.device, "generators": run.generators}


def save_state(run: Run, state: TrainState) -> None:
    save_training_state(run.last_path, fingerprint=run.fingerprint, description=run.description,
                        position=asdict(state), **_saved_parts(run))


def resume_state(run: Run) -> TrainState | None:
    """The saved state when it belongs to this job (minbert.train.resumable); None otherwise."""
    position = load_training_state(run.last_path, fingerprint=run.fingerprint, description=run.description,
                                   log=log, **_saved_parts(run))
    if position is None:
        return None
    state = TrainState(**position)
    log.info("resuming from %s at stage %d epoch %d", run.last_path, state.stage, state.epoch)
    return state


# ---------------------------------------------------------------- one epoch

CHECK_EVERY = 50    # updates between the host's reads of the device's running totals (non-finite losses)


class EpochTotals:
    """An epoch's running totals, kept where they are computed: losses and outputs on the device,
    labels and counts on the host (which knew them first). The host reads the device's part once
    per CHECK_EVERY updates (the non-finite check) and at the end of the epoch (the history row),
    never per batch."""

    def __init__(self, tasks: list[str], device: torch.device):
        self.tasks = list(tasks)
        self.loss = {t: torch.zeros((), device=device) for t in tasks}       # Σ loss · n
        self.outputs: dict[str, list[torch.Tensor]] = {t: [] for t in tasks}
        self.labels: dict[str, list[np.ndarray]] = {t: [] for t in tasks}
        self.n = {t: 0 for t in tasks}
        # the first update whose loss of each task was not finite (-1: none yet)
        self.first_bad = torch.full((len(tasks),), -1, dtype=torch.long, device=device)
        self.flag = torch.zeros(1, device=device)      # non-finite losses this update (all ranks after the all-reduce)
        self.flagged = torch.zeros(1, device=device)   # summed over the epoch's updates so far

    def add(self, task: str, loss: torch.Tensor, output: torch.Tensor, labels: np.ndarray, update: int) -> None:
        n = len(labels)
        loss = loss.detach().float()
        self.loss[task] += loss * n
        self.outputs[task].append(output.detach().float())
        self.labels[task].append(labels)
        self.n[task] += n
        bad = ~torch.isfinite(loss)
        k = self.tasks.index(task)
        self.first_bad[k] = torch.where(bad & (self.first_bad[k] < 0), update, self.first_bad[k])
        self.flag += bad


def run_epoch(run: Run, state: TrainState, plan: Plan) -> dict:
    """Train the updates of the state's current epoch; returns the epoch's history row (train part)."""
    cfg, si = run.cfg, state.stage
    stage_tasks = plan.stages[si]
    streams = {t: TaskStream(run.train[t], run.tokenizer, cfg.batch_size, run.seed + 101 * (i + 1), state.epoch,
                             run.dist, plan.walked(si, state.epoch, t) if t in cfg.walk_through else None,
                             run.features.get(t))
               for i, t in enumerate(stage_tasks)}
    totals = EpochTotals(stage_tasks, run.device)
    run.model.train()
    if cfg.freeze_encoder and not cfg.frozen_encoder_dropout:
        run.model.encoder.eval()
    t0, n_examples, lr = time.perf_counter(), 0, 0.0
    desc = (f"{'+'.join(stage_tasks)} " if len(plan.stages) > 1 else "") + f"epoch {state.epoch + 1}/{cfg.epochs}"
    bar = tqdm(plan.epochs[(si, state.epoch)], desc=desc, unit="upd", leave=False, dynamic_ncols=True,
               disable=not (run.progress and run.dist.main), mininterval=1.0 if sys.stderr.isatty() else 15.0)
    for k, update_tasks in enumerate(bar):
        batches = [(task, streams[task].next()) for task in update_tasks]     # built on the host
        labels = [b["labels"].numpy() for _, b in batches]
        orders = None
        if cfg.pcgrad and len(batches) > 1:   # PCGrad's random order, drawn on the host before the step
            from minbert.train.regularisers import pcgrad_orders

            orders = pcgrad_orders(len(batches), run.generators["pcgrad"])
        lr = train_step(run, state, plan, batches, labels, totals, orders)
        n_examples += sum(len(y) for y in labels) * run.dist.world
        if (k + 1) % CHECK_EVERY == 0:
            check_finite(run, state, totals)
        bar.set_postfix(ex_s=f"{n_examples / max(time.perf_counter() - t0, 1e-9):.0f}", lr=f"{lr:.1e}", refresh=False)
    bar.close()
    check_finite(run, state, totals)
    seconds = time.perf_counter() - t0
    state.examples += n_examples
    row = {"epoch": len(state.history) + 1, "stage": "+".join(stage_tasks), "lr": lr,
           "seconds": round(seconds, 2), "examples_per_second": round(n_examples / max(seconds, 1e-9), 1)}
    for t in stage_tasks:
        if totals.n[t]:   # drop round-robin / sampling may skip a task in a short epoch
            short = TASKS[t].metric
            pred = predictions(t, run.model.heads_cfg, torch.cat(totals.outputs[t]))["prediction"]
            row[f"train_{t}_loss"] = float(totals.loss[t]) / totals.n[t]
            row[f"train_{t}_{short}"] = task_metric(t, pred, np.concatenate(totals.labels[t]))
    return row


def train_step(run: Run, state: TrainState, plan: Plan, batches: list[tuple[str, dict]], labels: list[np.ndarray],
               totals: EpochTotals, orders: list[list[int]] | None = None) -> float:
    """One update from host batches [(task, batch)] and their labels as the host has them: forward, backward (PCGrad when asked), the
    all-reduce under torchrun, clip, step. The host reads no value the device computed (no sync):
    labels stay on the host, losses and outputs go to `totals`. Returns the learning rate."""
    cfg = run.cfg
    lr = set_lr(run.optimizer, state.update, plan.total_updates, plan.warmup, cfg.lr_schedule)
    run.optimizer.zero_grad(set_to_none=True)
    totals.flag.zero_()
    pc_losses = []
    for (task, host_batch), y in zip(batches, labels):
        batch = to_device(host_batch, run.device)
        with run.amp():
            loss, out = run.objective(task)(batch)
        totals.add(task, loss, out, y, state.update)
        weighted = cfg.task_weights.get(task, 1.0) * loss
        if cfg.pcgrad and len(batches) > 1:
            pc_losses.append(weighted)
        else:
            weighted.backward()
    if pc_losses:
        from minbert.train.regularisers import pcgrad_backward

        pcgrad_backward(pc_losses, run.params, world=run.dist.world, with_stats=False, orders=orders)
    average_gradients(run.params, run.dist.world, totals.flag)
    totals.flagged += totals.flag
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip, foreach=True)
    run.optimizer.step()
    if run.momentum is not None:
        run.momentum.update(run.model)
    state.update += 1
    return lr


def check_finite(run: Run, state: TrainState, totals: EpochTotals) -> None:
    """Stop the run when a loss went non-finite since the last check (one read of the device's
    totals). Under torchrun the flag was summed over the ranks with the gradients, so every rank
    stops at the same update and none waits in an all-reduce for one that has stopped."""
    if float(totals.flagged) == 0:
        return
    first = totals.first_bad.tolist()
    bad = [(u, t) for u, t in zip(first, totals.tasks) if u >= 0]
    where = f"stage {state.stage} epoch {state.epoch + 1}"
    if bad:
        update, task = min(bad)
        diverged(run, f"non-finite {task} loss at {where} update {update}")
    diverged(run, f"non-finite loss in another process at {where} by update {state.update}")


# ---------------------------------------------------------------- a task's objective

def model_inputs(batch: dict) -> dict:
    """What the model reads of a batch (not the targets)."""
    return {k: v for k, v in batch.items() if k not in ("labels", "soft")}


class TaskObjective:
    """One task's training objective: the head's output for a device batch and the gold-label loss
    on it (minbert.train.losses.task_loss). `objective(batch)` returns (loss, output). Distillation
    and SMART are wrappers (`Distilled`, `Smart`) with the same three parts, each changing the loss
    its inner objective gives; `build_objective` stacks them as a task's settings ask."""

    def __init__(self, task: str, model: MultitaskModel):
        self.task, self.model = task, model

    def forward(self, inputs: dict, return_embeddings: bool = False):
        """The head's output (with the word embeddings, for SMART, when asked)."""
        if "emb" in inputs:   # a frozen encoder's stored embeddings: the heads only
            return self.model.head_forward(self.task, inputs["emb"])
        if return_embeddings:
            return self.model(self.task, inputs, return_embeddings=True)
        return self.model(self.task, inputs)

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return task_loss(self.task, self.model.heads_cfg, output, batch["labels"])

    def __call__(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.forward(model_inputs(batch))
        return self.loss(output, batch), output


class ObjectiveWrapper(TaskObjective):
    """An objective around another: the inner one's forward and loss unless it changes them."""

    def __init__(self, inner: TaskObjective):
        super().__init__(inner.task, inner.model)
        self.inner = inner

    def forward(self, inputs: dict, return_embeddings: bool = False):
        return self.inner.forward(inputs, return_embeddings)

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.inner.loss(output, batch)


class Distilled(ObjectiveWrapper):
    """Distillation: on a batch with the teacher's outputs (`soft`), (1 - weight) x the gold-label
    loss + weight x the loss against the teacher (minbert.train.losses.distill_loss, which computes
    the gold-label part as the task objective does); the inner loss on a batch without them."""

    def __init__(self, inner: TaskObjective, weight: float, temperature: float):
        super().__init__(inner)
        self.weight, self.temperature = weight, temperature

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        if batch.get("soft") is None:
            return self.inner.loss(output, batch)
        return distill_loss(self.task, self.model.heads_cfg, output, batch["labels"], batch["soft"], self.weight,
                            self.temperature)


class Smart(ObjectiveWrapper):
    """SMART (minbert.train.regularisers): the inner loss plus λ_s x the adversarial smoothness term
    on the word embeddings and, with the `momentum` copy of the model, μ x the Bregman term against its
    output.
    A head trained on a frozen encoder's stored embeddings has no word embeddings to perturb: the
    inner objective alone."""

    def __init__(self, inner: TaskObjective, smart, momentum, generator: torch.Generator):
        super().__init__(inner)
        self.smart, self.momentum, self.generator = smart, momentum, generator

    def __call__(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = model_inputs(batch)
        if "emb" in inputs:
            return self.inner(batch)
        from minbert.train.regularisers import bregman_term, smart_adversarial_loss

        model, task, sm = self.model, self.task, self.smart
        out, word = self.forward(inputs, return_embeddings=True)
        loss = self.loss(out, batch)
        kind = TASKS[task].kind
        if sm.lambda_s > 0:
            adv = smart_adversarial_loss(lambda e: model(task, inputs, inputs_embeds=e), word, out, kind,
                                         step_size=sm.step_size, epsilon=sm.epsilon, noise_var=sm.noise_var,
                                         steps=sm.steps, generator=self.generator)
            loss = loss + sm.lambda_s * adv
        if self.momentum is not None:
            with torch.no_grad():
                momentum_out = self.momentum.module(task, inputs)
            loss = loss + sm.mu * bregman_term(out, momentum_out, kind)
        return loss, out


def build_objective(run: Run, task: str) -> TaskObjective:
    """The task's objective as the run's settings ask: the task loss, distilled when its training
    data carries a teacher's outputs, with SMART's terms when SMART covers the task."""
    cfg = run.cfg
    objective = TaskObjective(task, run.model)
    if cfg.distill is not None and run.train[task].soft is not None:
        objective = Distilled(objective, cfg.distill.weight, cfg.distill.temperature)
    if cfg.smart.enabled and (cfg.smart.tasks is None or task in cfg.smart.tasks):
        objective = Smart(objective, cfg.smart, run.momentum, run.generators["smart"])
    return objective


def diverged(run: Run, what: str) -> None:
    """Stop a run whose numbers went non-finite. Its state goes too: resumed with the same settings
    it would diverge again, and with other settings it would not be resumed."""
    if run.dist.main:
        shutil.rmtree(run.state_dir, ignore_errors=True)
    advice = ["lower the learning rate"] + ([] if run.cfg.grad_clip else ["set grad_clip (e.g. 1.0)"]) + \
        (["set precision: fp32"] if run.bf16 else [])
    raise MinBertError(f"training diverged: {what}; {', '.join(advice[:-1]) + ' or ' if len(advice) > 1 else ''}"
                       f"{advice[-1]}, then run again (nothing was written)")


# ---------------------------------------------------------------- end of an epoch

def end_of_epoch(run: Run, state: TrainState, plan: Plan, row: dict, t_start: float) -> None:
    """Evaluate on dev, keep the best model, save the resumable state (main rank only)."""
    state.epoch += 1
    state.seconds = time.perf_counter() - t_start
    if not run.dist.main:
        return
    dev = dev_metrics(run.model, run.dev, run.tokenizer, EVAL_BATCH_SIZE, run.device, run.bf16, run.dev_features)
    finite = torch.stack([torch.isfinite(p).all() for p in run.model.parameters()]).all()   # one read
    bad = [f"dev {k}" for k, v in dev.items() if v is not None and not math.isfinite(v)] or ([] if bool(finite) else ["weights"])
    if bad:
        diverged(run, f"non-finite {', '.join(bad[:3])} after the last update of epoch {row['epoch']}")
    for t in run.dev:
        if f"{t}_loss" in dev:
            row[f"dev_{t}_loss"] = dev[f"{t}_loss"]
            row[f"dev_{t}_{TASKS[t].metric}"] = dev[TASKS[t].metric_key]
    if "overall" in dev:
        row["dev_overall"] = dev["overall"]
    stage_tasks = plan.stages[state.stage]
    score = selection_score(dev, stage_tasks if run.cfg.schedule == "sequential" else list(run.train))
    row["dev_score"] = score if score is not None else math.nan
    state.history.append(row)
    log.info("epoch %d (%s): %s", row["epoch"], row["stage"],
             ", ".join(f"{k}={'undefined' if v is None else format(v, '.4f')}" for k, v in row.items()
                       if k.startswith("dev_")))
    if score is not None and score > state.stage_best:
        state.stage_best = state.best_score = score
        state.best_epoch = row["epoch"]
        state.best_dev = {k: v for k, v in dev.items() if not k.endswith("_loss")}
        torch_save(checkpoint_dict(run.model, run.tokenizer, epoch=row["epoch"], dev_metrics=state.best_dev,
                                   **run.checkpoint_extra), run.best_path)
    elif state.stage_best == -math.inf and any(dev.get(TASKS[t].metric_key, 0) is None for t in run.dev):
        # No epoch of this stage has every dev metric defined yet: this epoch's model stands in, never
        # recorded as selected (best_epoch stays unset), so a run whose metric stays undefined (a tiny
        # model's constant similarity scores) still ends with a model, the last, and says so.
        torch_save(checkpoint_dict(run.model, run.tokenizer, epoch=row["epoch"], dev_metrics={}, **run.checkpoint_extra),
                   run.best_path)
        state.best_score, state.best_epoch, state.best_dev = -math.inf, -1, {}   # the model is no selected one
    # the resumable state every `checkpoint_every` epochs and at the end of each stage (a later
    # stage starts from it); the last epoch's is not needed: the run finishes right after it
    last_of_stage = state.epoch == run.cfg.epochs
    if last_of_stage and state.stage + 1 == len(plan.stages):
        return
    if state.epoch % run.cfg.checkpoint_every == 0 or last_of_stage:
        save_state(run, state)


def end_of_stage(run: Run, state: TrainState, plan: Plan) -> None:
    """Sequential fine-tuning: the next task starts from this stage's best weights."""
    if run.cfg.schedule == "sequential" and state.stage + 1 < len(plan.stages):
        barrier(run.dist)
        best = torch.load(run.best_path, map_location="cpu", weights_only=True)
        run.model.load_state_dict(best["state_dict"])
        if run.momentum is not None:    # SMART's momentum copy restarts from the weights this stage starts from
            run.momentum.module.load_state_dict(best["state_dict"])
        state.stage_best = -math.inf
    state.stage += 1
    state.epoch = 0


# ---------------------------------------------------------------- fit

@dataclass
class FitResult:
    best_score: float
    best_epoch: int
    best_dev: dict
    history: pd.DataFrame
    seconds: float
    examples_per_second: float
    dev_before: dict | None = None    # dev metrics of the starting model, when asked for


def fit(model: MultitaskModel, tokenizer: Tokenizer, train: dict[str, TaskData], dev: dict[str, TaskData],
        cfg: FinetuneParams, *, out_dir: str | Path, seed: int, device: torch.device, bf16: bool = False,
        state_dir: str | Path | None = None, description: dict | None = None, dist_info: DistInfo | None = None,
        resume: bool = True, stop_after_epochs: int | None = None, checkpoint_extra: dict | None = None,
        progress: bool = True, evaluate_first: bool = False) -> FitResult:
    """Train `model` per `cfg`; at the end writes out_dir/{model.pt,history.csv}. See the module docstring.

    `description` is the job's resolved description (minbert.pipeline.plan): the state is resumed only when
    it was saved under the same one. Without it, the settings, seed and data sizes describe the run.
    `state_dir` defaults to `<out_dir>.state`."""
    dist_info = dist_info or DistInfo()
    out_dir = Path(out_dir)
    state_dir = Path(state_dir) if state_dir is not None else out_dir.with_name(out_dir.name + ".state")
    tasks = [t for t in cfg.tasks if t in train]
    missing = [t for t in tasks if train[t].labels is None or len(train[t]) == 0]
    if missing:
        raise MinBertError(f"training split of task '{missing[0]}' is empty or unlabelled; check the prepared data")
    refuse_batch_statistics_under_ddp(cfg, tasks, dist_info.world)
    sizes = {t: len(train[t]) for t in tasks}
    if description is None:
        description = {"settings": {"finetune": cfg.model_dump(), "seed": seed, "bf16": bf16}, "sizes": sizes}
    # where and how it runs: a state saved on one device type or in one precision never resumes in another
    description = {**description, "world": dist_info.world, "device_type": device.type,
                   "precision": "bf16" if bf16 else "fp32"}
    model.to(device)
    if cfg.freeze_encoder:
        model.encoder.freeze(True)
    optimizer = build_adamw([(encoder_parameters(model), cfg.lr), (head_parameters(model), cfg.head_lr or cfg.lr)],
                            cfg.weight_decay)
    momentum = None
    if cfg.smart.enabled and cfg.smart.mu > 0:
        from minbert.train.regularisers import MomentumModel

        momentum = MomentumModel(model, cfg.smart.beta)
        momentum.module.eval()   # the Bregman term compares with the copy's deterministic output
    if cfg.compile:   # in place: parameter names, checkpoints and the momentum copy stay as they are
        model.encoder.compile(dynamic=True)
    generators = {"smart": torch.Generator(device="cpu").manual_seed(seed + 17),
                  "pcgrad": torch.Generator(device="cpu").manual_seed(seed + 29)}
    run = Run(model, tokenizer, {t: train[t] for t in tasks}, dev, cfg, seed, device, bf16, dist_info, optimizer,
              [p for p in model.parameters() if p.requires_grad], momentum, generators, state_dir,
              fingerprint_of(description), description, checkpoint_extra or {}, progress)
    plan = Plan.build(cfg, tasks, sizes, seed)

    if dist_info.main:
        state_dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(state_dir)
    state = (resume_state(run) if resume else None) or TrainState()
    store_frozen_features(run, plan)
    if evaluate_first and state.dev_before is None and dist_info.main:
        state.dev_before = dev_metrics(model, dev, tokenizer, EVAL_BATCH_SIZE, device, bf16)
    t_start = time.perf_counter() - state.seconds
    epochs_run = 0
    while state.stage < len(plan.stages):
        while state.epoch < cfg.epochs:
            if stop_after_epochs is not None and epochs_run >= stop_after_epochs:
                return _result(state, t_start)
            row = run_epoch(run, state, plan)
            end_of_epoch(run, state, plan, row, t_start)
            barrier(dist_info)
            epochs_run += 1
        end_of_stage(run, state, plan)
    if dist_info.main:
        finish(run, state, out_dir)
    return _result(state, t_start)


def store_frozen_features(run: Run, plan: Plan) -> None:
    """A frozen, deterministic encoder's embeddings, computed once (minbert.train.frozen): for the dev
    splits (evaluated every epoch) and for each training split the run will walk through at least
    once (a task of which it draws fewer rows is cheaper to embed batch by batch)."""
    from minbert.train.frozen import FrozenFeatures, cacheable

    cfg = run.cfg
    for si, stage_tasks in enumerate(plan.stages):
        for task in stage_tasks:
            drawn = sum(task in update for e in range(cfg.epochs) for update in plan.epochs[(si, e)])
            if cacheable(run.model, cfg, task) and drawn * cfg.batch_size >= len(run.train[task]) \
                    and task not in run.features:
                run.features[task] = FrozenFeatures(run.model, run.train[task], run.tokenizer, run.device, run.amp)
    if run.dist.main:
        for task, data in run.dev.items():
            if cacheable(run.model, cfg, task) and data.labels is not None and len(data) and task in run.model.heads:
                run.dev_features[task] = FrozenFeatures(run.model, data, run.tokenizer, run.device, run.amp)
    if run.features or run.dev_features:
        log.info("frozen encoder: embeddings computed once for %s", ", ".join(
            [f"{t} train" for t in run.features] + [f"{t} dev" for t in run.dev_features]))


def finish(run: Run, state: TrainState, out_dir: Path) -> None:
    """The declared outputs from the finished run's best model, then the state folder goes."""
    if not run.best_path.is_file():
        raise MinBertError(f"no epoch produced a dev score to select a model by; check that the prepared data "
                           f"has labelled dev splits for {', '.join(run.train)}")
    if state.best_epoch < 0:
        log.warning("no epoch had every dev metric defined, so none is selected as the best; the model of the "
                    "last epoch is kept (its undefined metrics stay undefined in metrics.json)")
    best = torch.load(run.best_path, map_location="cpu", weights_only=True)
    calibrate(run, best)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch_save(best, out_dir / MODEL_FILE)
    write_history(out_dir / HISTORY_FILE, state.history)
    shutil.rmtree(run.state_dir, ignore_errors=True)


def calibrate(run: Run, best: dict) -> None:
    """A regression head trained with the correlation loss alone predicts on a scale of its own:
    fit scale and shift of its predictions to the training labels (least squares), kept in the
    checkpoint, so predictions land on the label scale without clipping that would change their
    correlation (minbert.train.losses.regression_prediction)."""
    from minbert.train.losses import correlation_only

    tasks = [t for t in run.train if TASKS[t].kind == "regression" and correlation_only(run.model.heads_cfg)]
    if not tasks:
        return
    run.model.load_state_dict(best["state_dict"])
    calibration = dict(best.get("calibration") or {})
    for task in tasks:
        run.model.calibration.pop(task, None)
        res = predict_task(run.model, run.train[task], run.tokenizer, EVAL_BATCH_SIZE, run.device, run.amp)
        x, y = res["prediction"].astype(np.float64), run.train[task].labels.astype(np.float64)
        # outputs that hardly vary carry no ranking to calibrate: predict the mean label then
        flat = np.std(x) <= 1e-6 * max(1.0, float(np.abs(x).mean()))
        scale, shift = (0.0, float(np.mean(y))) if flat else np.polyfit(x, y, 1)
        calibration[task] = [float(scale), float(shift)]
        log.info("%s: predictions calibrated to the training labels (scale %.4g, shift %.4g)", task, scale, shift)
    best["calibration"] = calibration
    run.model.calibration = calibration


def write_history(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")


def _result(state: TrainState, t_start: float) -> FitResult:
    seconds = time.perf_counter() - t_start
    return FitResult(state.best_score, state.best_epoch, state.best_dev, pd.DataFrame(state.history),
                     seconds, state.examples / max(seconds, 1e-9), state.dev_before)
