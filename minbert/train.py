"""The multi-task training loop: explicit, resumable, data-parallel under torchrun.

One call of `fit` trains a MultitaskModel on a schedule (minbert.schedules), evaluates on dev
after every epoch, writes history.csv, keeps the best checkpoint by dev score (model.pt) and a
resumable state (last.pt) after every epoch. Multi-process data parallel: launched with torchrun,
every rank takes its slice of each global batch and gradients are averaged across ranks before
the update (an explicit all-reduce, which also works with PCGrad and SMART's extra gradients).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm import tqdm

from .errors import MinBertError
from .io import atomic_path, torch_save
from .metrics import METRIC_OF_TASK, overall_score, task_metric
from .multitask import (OUTPUT_KIND, MultitaskModel, TaskData, collate, encoder_parameters, head_parameters,
                        predict_task, predictions, save_checkpoint, task_loss, to_device)
from .optim import build_adamw, set_lr
from .params import FinetuneParams
from .runtime import autocast
from .schedules import epoch_plan
from .tokenizer import Tokenizer

log = logging.getLogger("minbert.train")
SHORT_METRIC = {"sst": "acc", "para": "acc", "sts": "pearson", "cfimdb": "acc"}


# ---------------------------------------------------------------- distributed helpers

@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_setting: str = "auto") -> tuple[DistInfo, torch.device | None]:
    """Under torchrun (WORLD_SIZE > 1) start the process group; gloo on CPU, nccl on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), None
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = torch.cuda.is_available() and device_setting != "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return DistInfo(rank, world), device


def average_gradients(params: list[torch.nn.Parameter], world: int) -> None:
    if world <= 1:
        return
    # every rank runs the same tasks, so the same parameters have no gradient on all ranks; they
    # stay None (a zero gradient would let AdamW move them by momentum and weight decay, unlike one process)
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


# ---------------------------------------------------------------- batches

class TaskStream:
    """Endless length-bucketed batches of one task for one epoch; cycles (reshuffled) when the
    plan asks for more batches than the task has. Under data parallelism, each rank takes its
    slice of every global batch, so N processes see exactly the batches one process would."""

    def __init__(self, data: TaskData, tokenizer: Tokenizer, batch_size: int, seed: int, epoch: int,
                 dist_info: DistInfo):
        from .batching import BucketBatchSampler

        self.data, self.tokenizer, self.dist = data, tokenizer, dist_info
        self.sampler = BucketBatchSampler(data.lengths(), batch_size, shuffle=True, seed=seed)
        self.epoch, self.cycle = epoch, 0
        self.seed, self.batches = seed, 0
        self._it = self._start()

    def _start(self):
        self.sampler.set_epoch(self.epoch * 1000 + self.cycle)
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
        return collate(self.data, [idx[k] for k in keep], self.tokenizer,
                       None if swap is None else [swap[k] for k in keep])


# ---------------------------------------------------------------- evaluation

def selection_score(metrics: dict[str, float], tasks: list[str]) -> float:
    """Model-selection score: the leaderboard formula generalised to any subset of tasks
    (accuracies as they are, Pearson r as (r + 1) / 2, averaged)."""
    vals = []
    for t in tasks:
        m = metrics.get(METRIC_OF_TASK[t])
        if m is None:
            continue
        vals.append((m + 1.0) / 2.0 if t == "sts" else m)
    return float(np.mean(vals)) if vals else float("nan")


def evaluate(model: MultitaskModel, dev: dict[str, TaskData], tokenizer: Tokenizer, batch_size: int,
             device, bf16: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for task, data in dev.items():
        if data.labels is None or len(data) == 0:
            continue
        res = predict_task(model, data, tokenizer, batch_size, device, lambda: autocast(device, bf16))
        out[METRIC_OF_TASK[task]] = task_metric(task, res["prediction"], data.labels)
        out[f"{task}_loss"] = res["loss"]
    if all(k in out for k in ("sst_acc", "para_acc", "sts_pearson")):
        out["overall"] = overall_score(out["sst_acc"], out["para_acc"], out["sts_pearson"])
    return out


# ---------------------------------------------------------------- the loop

@dataclass
class FitResult:
    best_score: float
    best_epoch: int
    best_dev: dict
    history: pd.DataFrame
    seconds: float
    examples_per_second: float
    dev_before: dict | None = None    # dev metrics of the starting model, when asked for


def config_fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fit(model: MultitaskModel, tokenizer: Tokenizer, train: dict[str, TaskData], dev: dict[str, TaskData],
        cfg: FinetuneParams, *, out_dir: str | Path, seed: int, device: torch.device, bf16: bool = False,
        dist_info: DistInfo | None = None, resume: bool = True, stop_after_epochs: int | None = None,
        checkpoint_extra: dict | None = None, eval_batch_size: int = 128, progress: bool = True,
        evaluate_first: bool = False) -> FitResult:
    """Train `model` per `cfg`; writes out_dir/{model.pt,last.pt,history.csv}. See module docstring."""
    dist_info = dist_info or DistInfo()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in cfg.tasks if t in train]
    missing = [t for t in tasks if train[t].labels is None or len(train[t]) == 0]
    if missing:
        raise MinBertError(f"training split of task '{missing[0]}' is empty or unlabelled; check the prepared data")
    sizes = {t: len(train[t]) for t in tasks}
    model.to(device)

    if cfg.freeze_encoder:
        model.encoder.freeze(True)
    params = [p for p in model.parameters() if p.requires_grad]
    head_lr = cfg.head_lr or cfg.lr
    optimizer = build_adamw([(encoder_parameters(model), cfg.lr), (head_parameters(model), head_lr)],
                            cfg.weight_decay)

    stages = [[t] for t in tasks] if cfg.schedule == "sequential" else [tasks]
    plans_per_epoch = {}
    total_updates = 0
    for si, stage_tasks in enumerate(stages):
        for epoch in range(cfg.epochs):
            plan = epoch_plan("task_by_task" if cfg.schedule == "sequential" else cfg.schedule, stage_tasks,
                              sizes, cfg.batch_size, _epoch_unit(cfg, stage_tasks), seed, epoch,
                              cfg.temperature, cfg.max_steps_per_epoch)
            plans_per_epoch[(si, epoch)] = plan
            total_updates += len(plan)
    warmup = int(cfg.warmup_ratio * total_updates)

    teacher = None
    if cfg.smart.enabled and cfg.smart.mu > 0:
        from .regularisers import MomentumTeacher

        teacher = MomentumTeacher(model, cfg.smart.beta)
    smart_gen = torch.Generator(device="cpu")
    smart_gen.manual_seed(seed + 17)
    pc_gen = torch.Generator(device="cpu")
    pc_gen.manual_seed(seed + 29)

    fingerprint = config_fingerprint({"cfg": cfg.model_dump(), "seed": seed, "sizes": sizes,
                                      "world": dist_info.world, "tasks": tasks})
    state = {"stage": 0, "epoch": 0, "update": 0, "history": [], "best_score": -math.inf, "best_epoch": -1,
             "best_dev": {}, "stage_best": -math.inf, "seconds": 0.0, "examples": 0}
    last_path, best_path = out_dir / "last.pt", out_dir / "model.pt"
    if resume and last_path.is_file():
        ck = torch.load(last_path, map_location="cpu", weights_only=True)
        if ck.get("fingerprint") == fingerprint:
            model.load_state_dict(ck["model"])
            optimizer.load_state_dict(ck["optimizer"])
            if teacher is not None and ck.get("teacher") is not None:
                teacher.module.load_state_dict(ck["teacher"])
            torch.set_rng_state(ck["torch_rng"])
            smart_gen.set_state(ck["smart_rng"])
            pc_gen.set_state(ck["pc_rng"])
            state = ck["state"]
            if dist_info.main:
                log.info("resuming from %s at stage %d epoch %d", last_path, state["stage"], state["epoch"])
        elif dist_info.main:
            log.info("%s belongs to another configuration; starting afresh", last_path)

    if evaluate_first and "dev_before" not in state and dist_info.main:
        state["dev_before"] = evaluate(model, dev, tokenizer, eval_batch_size, device, bf16)
    amp = lambda: autocast(device, bf16)  # noqa: E731
    epochs_run = 0
    t_start = time.perf_counter() - state["seconds"]
    while state["stage"] < len(stages):
        si = state["stage"]
        stage_tasks = stages[si]
        while state["epoch"] < cfg.epochs:
            epoch = state["epoch"]
            if stop_after_epochs is not None and epochs_run >= stop_after_epochs:
                return _result(state, t_start)
            plan = plans_per_epoch[(si, epoch)]
            streams = {t: TaskStream(train[t], tokenizer, cfg.batch_size, seed + 101 * (i + 1), epoch, dist_info)
                       for i, t in enumerate(stage_tasks)}
            t0 = time.perf_counter()
            n_examples = 0
            sums = {t: {"loss": 0.0, "n": 0, "pred": [], "true": []} for t in stage_tasks}
            model.train()
            if cfg.freeze_encoder:
                model.encoder.eval()
            bar = tqdm(plan, desc=_desc(stages, si, epoch, cfg.epochs), unit="upd", disable=not (progress and dist_info.main),
                       mininterval=1.0 if sys.stderr.isatty() else 15.0, dynamic_ncols=True, leave=False)
            for update_tasks in bar:
                lr = set_lr(optimizer, state["update"], total_updates, warmup, cfg.lr_schedule)
                optimizer.zero_grad(set_to_none=True)
                losses = []
                for task in update_tasks:
                    batch = to_device(streams[task].next(), device)
                    loss, out = _task_objective(model, task, batch, cfg, amp, teacher, smart_gen)
                    if not torch.isfinite(loss):
                        raise MinBertError(
                            f"non-finite {task} loss at stage {si} epoch {epoch} update {state['update']}; "
                            f"the last good checkpoint is {last_path if last_path.exists() else 'none (first epoch)'}; "
                            "lower the learning rate, enable grad_clip or disable bf16")
                    weight = cfg.task_weights.get(task, 1.0)
                    if cfg.pcgrad and len(update_tasks) > 1:
                        losses.append(weight * loss)
                    else:
                        (weight * loss).backward()
                    n = len(batch["labels"])
                    n_examples += n * dist_info.world
                    s = sums[task]
                    s["loss"] += float(loss.detach()) * n
                    s["n"] += n
                    s["pred"].append(predictions(task, model.heads_cfg, out)["prediction"])
                    s["true"].append(batch["labels"].cpu().numpy())
                if losses:
                    from .regularisers import pcgrad_backward

                    pcgrad_backward(losses, params, generator=pc_gen)
                average_gradients(params, dist_info.world)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                if teacher is not None:
                    teacher.update(model)
                state["update"] += 1
                elapsed = time.perf_counter() - t0
                bar.set_postfix(ex_s=f"{n_examples / max(elapsed, 1e-9):.0f}", lr=f"{lr:.1e}", refresh=False)
            bar.close()
            epoch_seconds = time.perf_counter() - t0
            state["examples"] += n_examples

            row = {"epoch": len(state["history"]) + 1, "stage": "+".join(stage_tasks), "lr": lr,
                   "seconds": round(epoch_seconds, 2), "examples_per_second": round(n_examples / epoch_seconds, 1)}
            for t, s in sums.items():
                if s["n"] == 0:  # drop round-robin / sampling may skip a task in a short epoch
                    continue
                row[f"train_{t}_loss"] = s["loss"] / max(1, s["n"])
                row[f"train_{t}_{SHORT_METRIC[t]}"] = task_metric(t, np.concatenate(s["pred"]), np.concatenate(s["true"]))
            state["epoch"] += 1
            state["seconds"] = time.perf_counter() - t_start
            if dist_info.main:
                dev_metrics = evaluate(model, dev, tokenizer, eval_batch_size, device, bf16)
                for t in dev:
                    if f"{t}_loss" in dev_metrics:
                        row[f"dev_{t}_loss"] = dev_metrics[f"{t}_loss"]
                        row[f"dev_{t}_{SHORT_METRIC[t]}"] = dev_metrics[METRIC_OF_TASK[t]]
                if "overall" in dev_metrics:
                    row["dev_overall"] = dev_metrics["overall"]
                score = selection_score(dev_metrics, stage_tasks if cfg.schedule == "sequential" else tasks)
                row["dev_score"] = score
                state["history"].append(row)
                log.info("epoch %d (%s): %s", row["epoch"], row["stage"],
                         ", ".join(f"{k}={v:.4f}" for k, v in row.items() if k.startswith("dev_")))
                if score > state["stage_best"]:
                    state["stage_best"] = score
                    state["best_score"], state["best_epoch"] = score, row["epoch"]
                    state["best_dev"] = {k: v for k, v in dev_metrics.items() if not k.endswith("_loss")}
                    save_checkpoint(best_path, model, tokenizer, epoch=row["epoch"], dev_metrics=state["best_dev"],
                                    **(checkpoint_extra or {}))
                _write_history(out_dir / "history.csv", state["history"])
                torch_save({"fingerprint": fingerprint, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "teacher": teacher.module.state_dict() if teacher is not None else None,
                            "torch_rng": torch.get_rng_state(), "smart_rng": smart_gen.get_state(),
                            "pc_rng": pc_gen.get_state(), "state": state}, last_path)
            if dist_info.world > 1:
                dist.barrier()
            epochs_run += 1
        # sequential fine-tuning: the next task starts from this stage's best weights
        if cfg.schedule == "sequential" and state["stage"] + 1 < len(stages):
            if dist_info.world > 1:
                dist.barrier()
            best = torch.load(best_path, map_location="cpu", weights_only=True)
            model.load_state_dict(best["state_dict"])
            state["stage_best"] = -math.inf
        state["stage"] += 1
        state["epoch"] = 0
    if dist_info.main and last_path.exists():
        last_path.unlink()  # finished: the resumable state is no longer needed
    return _result(state, t_start)


def _epoch_unit(cfg: FinetuneParams, stage_tasks: list[str]) -> str:
    return cfg.epoch_unit if cfg.epoch_unit in ("smallest", "largest") or cfg.epoch_unit in stage_tasks else "smallest"


def _desc(stages, si, epoch, epochs) -> str:
    prefix = f"{'+'.join(stages[si])} " if len(stages) > 1 else ""
    return f"{prefix}epoch {epoch + 1}/{epochs}"


def _task_objective(model, task, batch, cfg: FinetuneParams, amp, teacher, smart_gen):
    """Task loss, plus SMART's adversarial and Bregman terms when enabled. Returns (loss, output)."""
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with amp():
        if not cfg.smart.enabled or (cfg.smart.tasks is not None and task not in cfg.smart.tasks):
            out = model(task, inputs)
            return task_loss(task, model.heads_cfg, out, labels), out
        from .regularisers import bregman_term, smart_adversarial_loss

        out, word = model(task, inputs, return_embeddings=True)
        loss = task_loss(task, model.heads_cfg, out, labels)
        kind = OUTPUT_KIND[task]
        sm = cfg.smart
        if sm.lambda_s > 0:
            adv = smart_adversarial_loss(lambda e: model(task, inputs, inputs_embeds=e), word, out, kind,
                                         step_size=sm.step_size, epsilon=sm.epsilon, noise_var=sm.noise_var,
                                         steps=sm.steps, generator=smart_gen)
            loss = loss + sm.lambda_s * adv
        if teacher is not None:
            with torch.no_grad():
                teacher_out = teacher.module(task, inputs)
            loss = loss + sm.mu * bregman_term(out, teacher_out, kind)
    return loss, out


def _write_history(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")


def _result(state, t_start) -> FitResult:
    seconds = time.perf_counter() - t_start
    return FitResult(state["best_score"], state["best_epoch"], state["best_dev"], pd.DataFrame(state["history"]),
                     seconds, state["examples"] / max(seconds, 1e-9), state.get("dev_before"))

