"""The multi-task training loop: explicit, resumable, data-parallel under torchrun.

Reads like nanoGPT's train.py, in plain parts:
- `Plan`: every epoch's updates, computed up front (minbert.train.schedules), hence the lr schedule;
- `TrainState`: where the run is (phase, epoch, update, history, best so far), saved with the
  model, optimiser and RNG states as `last.pt` in the run's state folder after every epoch
  (minbert.train.resumable, which pretraining saves its state with too);
- `run_epoch`: one epoch's updates, each through `train_step` (each task's objective,
  minbert.train.objectives; PCGrad; the all-reduce under torchrun, minbert.train.distributed;
  clip; step) or, on a CUDA device, through the captured step (minbert.train.step);
- `end_of_epoch`: dev evaluation, the best model (`best.pt`, beside `last.pt`), the state.
The declared outputs (`model.pt`, `history.csv` in `out_dir`) are written only when the run has
finished, from the best model; the state folder is then removed. The state folder is not a
declared output, so an engine that cleans up an interrupted job's outputs leaves it alone and the
next run resumes from the last finished epoch, if the job's fingerprint (minbert.pipeline.plan) is
the one the state was written for; otherwise it starts fresh and says what changed.

Sequential fine-tuning trains in phases, one task after another, each phase for every epoch,
the next starting from the previous phase's best weights.
"""
from __future__ import annotations

import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from minbert.core.errors import MinBertError
from minbert.core.io import clean_stale_temporaries, torch_save
from minbert.core.layout import HISTORY_FILE, MODEL_FILE
from minbert.core.metrics import (
    task_metric,
)
from minbert.core.plain import as_json
from minbert.core.progress import Progress
from minbert.core.provenance import fingerprint_of, with_runtime
from minbert.core.settings import Finetune
from minbert.core.tasks import TASKS
from minbert.data.batches import Collator, TaskData, to_device
from minbert.data.stream import TaskStream
from minbert.model.multitask import (
    MultitaskModel,
    encoder_parameters,
    head_parameters,
)
from minbert.model.outputs import predictions
from minbert.model.tokenizer import Tokenizer
from minbert.train.distributed import (
    average_gradients,
    barrier,
    from_main,
    refuse_batch_statistics,
)
from minbert.train.evaluation import (
    dev_metrics,
    diverged,
    eval_points,
    evaluate,
    fit_calibration,
    write_best,
    write_history,
)
from minbert.train.frozen import FrozenFeatures, cacheable
from minbert.train.optim import build_adamw, set_lr
from minbert.train.regularisers import MomentumModel, pcgrad_backward, pcgrad_orders
from minbert.train.step import CapturedSteps, why_not_captured
from minbert.train.stopping import mark_cap, phase_stops, stops_early
from minbert.train.tracking import Trackers
from minbert.train.training import (
    EpochTotals,
    FitOptions,
    Plan,
    Training,
    TrainState,
    resume_state,
    save_state,
)

log = logging.getLogger("minbert.train.loop")
CHECK_EVERY = 50    # updates between the host's reads of the device's running totals (non-finite losses)


def train_mode(tr: Training) -> None:
    """The model in training mode, but a frozen encoder without its dropout runs deterministically."""
    tr.model.train()
    if tr.cfg.freeze_encoder and not tr.cfg.frozen_encoder_dropout:
        tr.model.encoder.eval()


def run_epoch(tr: Training, state: TrainState, plan: Plan) -> dict | None:
    """Train the updates of the state's current epoch, evaluating dev at its `evals_per_epoch` points
    before the last (each a history row, `evaluate`); returns the last part's history row (train
    part), which `end_of_epoch` evaluates, or None when early stopping ended the epoch at one of
    its evaluations. With gradient accumulation each task's batch comes as micro-batches."""
    cfg, pi = tr.cfg, state.phase
    phase_tasks = plan.phases[pi]
    streams = epoch_streams(tr, state, plan)
    updates = plan.epochs[(pi, state.epoch)]
    points = set(eval_points(len(updates), cfg.evals_per_epoch)[:-1])
    tr.totals.reset()
    train_mode(tr)
    t0, n_examples, lr, done, logged = time.perf_counter(), 0, 0.0, 0, None
    desc = (f"{'+'.join(phase_tasks)} " if len(plan.phases) > 1 else "") + f"epoch {state.epoch + 1}/{cfg.epochs}"
    bar = tqdm(updates, desc=desc, unit="upd", leave=False, dynamic_ncols=True,
               disable=not (tr.options.progress and tr.dist.main), mininterval=1.0 if sys.stderr.isatty() else 15.0)
    for k, update_tasks in enumerate(bar):
        batches, labels = draw_update(streams, update_tasks, cfg.gradient_accumulation_steps)
        lr = update(tr, state, plan, batches, labels)
        state.lr_budget += lr
        n_examples += sum(len(y) for y in labels) * tr.dist.world
        if tr.trackers is not None:
            logged = track_update(tr, state, batches, labels, lr, logged)
        if (k + 1) % CHECK_EVERY == 0:
            check_finite(tr, state)
        if k % 32 == 0:     # the bar redraws every few seconds at most: its figures need no update each step
            bar.set_postfix(ex_s=f"{n_examples / max(time.perf_counter() - t0, 1e-9):.0f}", lr=f"{lr:.1e}",
                            refresh=False)
        report_progress(tr, state, plan, k + 1, len(updates))
        if k + 1 in points:
            row = train_row(tr, state, plan, (k + 1) / len(updates), lr, time.perf_counter() - t0, n_examples - done)
            t0, done = time.perf_counter(), n_examples
            evaluate(tr, state, plan, row)
            if stops_early(tr.cfg) and from_main(tr.dist, state.stopped, tr.device):
                state.stopped = True               # on every rank, as the main one decided
                bar.close()
                return None
            tr.totals.reset()
            logged = None
            train_mode(tr)
    bar.close()
    return train_row(tr, state, plan, 1.0, lr, time.perf_counter() - t0, n_examples - done)


def epoch_streams(tr: Training, state: TrainState, plan: Plan) -> dict[str, TaskStream]:
    """The batches of the state's epoch, one stream per task of its phase (a frozen encoder's stored
    embeddings where it has them; fixed length buckets where the step is captured)."""
    cfg, pi = tr.cfg, state.phase
    collator = Collator(tr.tokenizer, fixed_shapes=tr.captured is not None)
    return {t: TaskStream(tr.train[t], collator, cfg.batch_size, tr.options.seed + 101 * (i + 1), state.epoch,
                          shard=(tr.dist.rank, tr.dist.world), features=tr.features.get(t),
                          walked=plan.walked(pi, state.epoch, t) if t in cfg.walk_through else None)
            for i, t in enumerate(plan.phases[pi])}


def draw_update(streams: dict[str, TaskStream], update_tasks, parts: int = 1) -> tuple[list, list[np.ndarray]]:
    """An update's host batches [(task, batch)] and their labels as the host has them; with gradient
    accumulation (`parts` > 1), each task's batch as its micro-batches."""
    batches = [(task, streams[task].next() if parts == 1 else streams[task].next_parts(parts))
               for task in update_tasks]
    return batches, [np.concatenate([p["labels"].numpy() for p in _parts(b)]) for _, b in batches]


def track_update(tr: Training, state: TrainState, batches, labels, lr: float, before: list | None) -> list:
    """Log an update's learning rate and each task's training loss to the trackers: the growth of
    the running totals since the last update (one read of the device's totals). Returns the totals
    as read, for the next update."""
    now = tr.totals.loss.tolist()
    before = before or [0.0] * len(now)
    rows = {task: len(y) for (task, _), y in zip(batches, labels)}
    values = {"lr": lr, **{f"train_{t}_loss": (now[k] - before[k]) / rows[t]
                           for k, t in enumerate(tr.totals.tasks) if rows.get(t)}}
    tr.trackers.log_update(state.update, values)
    return now


def report_progress(tr: Training, state: TrainState, plan: Plan, done: int, of: int, force: bool = False) -> None:
    """Where the run is, for `minbert progress` (a file in the state folder, every few seconds):
    the phase, the epoch and its updates, the run's updates, their rate in this process, and the
    time left at that rate (the dev evaluations still to come at their mean time so far)."""
    if tr.progress is None or not (force or tr.progress.due()):
        return
    ran = state.update - tr.progress_from[0]
    seconds = time.perf_counter() - tr.progress_from[1]
    rate = ran / seconds if ran > 0 and seconds > 0 else None
    evals_left = sum(len(eval_points(len(u), tr.cfg.evals_per_epoch)) for (p, e), u in plan.epochs.items()
                     if (p, e) > (state.phase, state.epoch)) + \
        len([x for x in eval_points(of, tr.cfg.evals_per_epoch) if x > done])
    left = None if rate is None else (plan.total_updates - state.update) / rate + \
        evals_left * (tr.eval_seconds[0] / tr.eval_seconds[1] if tr.eval_seconds[1] else 0.0)
    tr.progress.update(force=force, phase="+".join(plan.phases[state.phase]), phases=len(plan.phases),
                       epoch=state.epoch + 1, epochs=tr.cfg.epochs, epoch_update=done, epoch_updates=of,
                       update=state.update, updates=plan.total_updates, updates_per_second=rate,
                       seconds_left=left, best_score=None if state.best_score == -math.inf else state.best_score)


def _parts(batch: dict | list[dict]) -> list[dict]:
    """A task's batch of an update as its micro-batches (one, without gradient accumulation)."""
    return batch if isinstance(batch, list) else [batch]


def train_row(tr: Training, state: TrainState, plan: Plan, fraction: float, lr: float, seconds: float,
              n_examples: int) -> dict:
    """The history row of the updates since the last evaluation (their train losses and metrics);
    `fraction`: how much of the current epoch is done. `epoch` counts the run's epochs (all phases)
    up to here, a fraction where dev is evaluated within an epoch."""
    check_finite(tr, state)
    totals = tr.totals
    state.examples += n_examples
    epoch = round(state.phase * tr.cfg.epochs + state.epoch + fraction, 4)
    row = {"epoch": int(epoch) if epoch.is_integer() else epoch, "update": state.update,
           "phase": "+".join(plan.phases[state.phase]), "lr": lr, "lr_budget": state.lr_budget,
           "seconds": round(seconds, 2),
           "examples_per_second": round(n_examples / max(seconds, 1e-9), 1)}
    for k, t in enumerate(totals.tasks):
        if totals.n[t]:   # drop round-robin / sampling may skip a task in a short epoch
            pred = predictions(t, tr.model.heads_cfg, torch.cat(totals.outputs[t]))["prediction"]
            row[f"train_{t}_loss"] = float(totals.loss[k]) / totals.n[t]
            row[f"train_{t}_{TASKS[t].metric}"] = task_metric(t, pred, np.concatenate(totals.labels[t]))
    return row


def update(tr: Training, state: TrainState, plan: Plan, batches: list, labels: list[np.ndarray]) -> float:
    """One update through the path the run takes: the captured step on CUDA where it applies,
    `train_step` otherwise. Returns the learning rate."""
    if tr.captured is not None:
        return tr.captured.step(state, plan, batches, labels)
    return train_step(tr, state, plan, batches, labels, pcgrad_order(tr, batches))


def pcgrad_order(tr: Training, batches: list) -> list[list[int]] | None:
    """PCGrad's random order for this update, drawn on the host before the step (None without it)."""
    if not (tr.cfg.pcgrad and len(batches) > 1):
        return None
    return pcgrad_orders(len(batches), tr.generators["pcgrad"])


def train_step(tr: Training, state: TrainState, plan: Plan, batches: list[tuple[str, dict | list[dict]]],
               labels: list[np.ndarray], orders: list[list[int]] | None = None) -> float:
    """One update from host batches [(task, batch)] and their labels as the host has them: forward,
    backward (PCGrad when asked), the all-reduce under torchrun, clip, step. A task's batch may come
    as micro-batches (gradient accumulation): each adds its share of the batch's mean loss to the
    gradients before the one step. An fp16 run scales the loss (tr.scaler) and skips a step whose
    gradients overflowed. The host reads no value the device computed (no sync; fp16's overflow
    check apart): labels stay on the host, losses and outputs go to the run's totals. Returns the
    learning rate."""
    cfg, totals, scaler = tr.cfg, tr.totals, tr.scaler
    lr = set_lr(tr.optimizer, state.update - state.phase_start, *plan.schedule(state.phase), cfg.lr_schedule)
    tr.optimizer.zero_grad(set_to_none=True)
    totals.flag.zero_()
    pcgrad = cfg.pcgrad and len(batches) > 1
    if pcgrad and orders is None:
        orders = pcgrad_order(tr, batches)
    pc_losses = []
    for (task, host_batch), task_labels in zip(batches, labels):
        parts = _parts(host_batch)
        sizes = [len(p["labels"]) for p in parts]
        n = sum(sizes)
        for part, y in zip(parts, np.split(task_labels, np.cumsum(sizes)[:-1]) if len(parts) > 1 else [task_labels]):
            batch = to_device(part, tr.device)
            with tr.amp():
                loss, out = tr.objective(task)(batch)
            totals.add_loss(task, loss, len(y), state.update, totals.flag)
            totals.add_outputs(task, out.detach().float(), y)
            weighted = cfg.task_weights.get(task, 1.0) * loss
            if len(parts) > 1:                  # the part's share of the whole batch's mean
                weighted = weighted * (len(y) / n)
            if not weighted.requires_grad:      # a head with no parameter over a frozen encoder: nothing to learn
                continue
            if pcgrad:
                pc_losses.append(weighted)
            else:
                (scaler.scale(weighted) if scaler is not None else weighted).backward()
    if pc_losses:
        pc_losses = [scaler.scale(x) for x in pc_losses] if scaler is not None else pc_losses
        pcgrad_backward(pc_losses, tr.params, world=tr.dist.world, with_stats=False, orders=orders)
    average_gradients(tr.params, tr.dist.world, totals.flag)
    totals.flagged += totals.flag
    if scaler is not None:
        scaler.unscale_(tr.optimizer)
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(tr.params, cfg.grad_clip, foreach=True)
    if scaler is not None:
        scaler.step(tr.optimizer)       # skipped when the scaled gradients overflowed
        scaler.update()
    else:
        tr.optimizer.step()
    if tr.momentum is not None:
        tr.momentum.update(tr.model)
    state.update += 1
    return lr


def check_finite(tr: Training, state: TrainState) -> None:
    """Stop the run when a loss went non-finite since the last check (one read of the device's
    totals). Under torchrun the flag was summed over the ranks with the gradients, so every rank
    stops at the same update and none waits in an all-reduce for one that has stopped."""
    totals = tr.totals
    if float(totals.flagged) == 0:
        return
    first = totals.first_bad.tolist()
    bad = [(u, t) for u, t in zip(first, totals.tasks) if u >= 0]
    where = f"phase {state.phase} epoch {state.epoch + 1}"
    if bad:
        update, task = min(bad)
        diverged(tr, f"non-finite {task} loss at {where} update {update}")
    diverged(tr, f"non-finite loss in another process at {where} by update {state.update}")


# ---------------------------------------------------------------- end of an epoch

def end_of_epoch(tr: Training, state: TrainState, plan: Plan, row: dict | None, t_start: float) -> None:
    """Evaluate on dev (unless early stopping ended the epoch at an evaluation: `row` None), keep
    the best model, save the resumable state (main rank only). Every rank learns from the main one
    whether early stopping ends the phase."""
    if row is not None:
        evaluate(tr, state, plan, row)
    state.stopped = from_main(tr.dist, state.stopped, tr.device) if stops_early(tr.cfg) else state.stopped
    state.epoch += 1
    state.seconds = time.perf_counter() - t_start
    if not tr.dist.main:
        return
    write_best(tr)
    # the resumable state every `checkpoint_every` epochs and at the end of each phase (a later
    # phase starts from it); the last epoch's is not needed: the run finishes right after it
    last_of_phase = state.epoch == tr.cfg.epochs or state.stopped
    if last_of_phase and state.phase + 1 == len(plan.phases):
        return
    if state.epoch % tr.cfg.checkpoint_every == 0 or last_of_phase:
        save_state(tr, state)


def end_of_phase(tr: Training, state: TrainState, plan: Plan) -> None:
    """Sequential fine-tuning: the next task starts from this phase's best weights."""
    mark_cap(tr.cfg, state, "+".join(plan.phases[state.phase]))
    if tr.cfg.schedule == "sequential" and state.phase + 1 < len(plan.phases):
        barrier(tr.dist)
        best = torch.load(tr.best_path, map_location="cpu", weights_only=True)
        tr.model.load_state_dict(best["state_dict"])
        if tr.momentum is not None:    # SMART's momentum copy restarts from the weights this phase starts from
            tr.momentum.module.load_state_dict(best["state_dict"])
        state.phase_best = -math.inf
    state.phase += 1
    state.phase_start = state.update          # the next phase's schedule starts at its own step 0
    state.epoch = 0
    state.stale, state.stopped = 0, False


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
    stops: list = field(default_factory=list)   # how each phase ended, where it stops at its plateau


def fit(model: MultitaskModel, tokenizer: Tokenizer, train: dict[str, TaskData], dev: dict[str, TaskData],
        cfg: Finetune, options: FitOptions) -> FitResult:
    """Train `model` per `cfg`; at the end writes options.out_dir/{model.pt,history.csv}. See the
    module docstring."""
    tr, plan = start_run(model, tokenizer, train, dev, cfg, options)
    resumed = resume_state(tr) if options.resume else None
    state = resumed or TrainState()
    start_trackers(tr, resumed)
    if tr.dist.main and tr.options.progress:
        tr.progress = Progress(tr.state_dir, tr.options.checkpoint_extra.get("stage", "finetune"))
        tr.progress_from = (state.update, time.perf_counter())
    store_frozen_features(tr, plan)
    if options.evaluate_first and state.dev_before is None and tr.dist.main:
        state.dev_before = dev_metrics(model, dev, tokenizer, tr.device, tr.precision)
    t_start = time.perf_counter() - state.seconds
    epochs_run = 0
    while state.phase < len(plan.phases):
        while state.epoch < cfg.epochs and not state.stopped:
            if options.stop_after_epochs is not None and epochs_run >= options.stop_after_epochs:
                if tr.trackers is not None:
                    tr.trackers.close()
                return _result(state, t_start)
            row = run_epoch(tr, state, plan)
            end_of_epoch(tr, state, plan, row, t_start)
            barrier(tr.dist)
            epochs_run += 1
        end_of_phase(tr, state, plan)
    if tr.dist.main:
        finish(tr, state, Path(options.out_dir))
    return _result(state, t_start)


def start_run(model: MultitaskModel, tokenizer: Tokenizer, train: dict[str, TaskData], dev: dict[str, TaskData],
              cfg: Finetune, options: FitOptions) -> tuple[Training, Plan]:
    """Everything a run works with: the model on its device, the optimiser, SMART's momentum copy,
    the run's generators, its description and fingerprint, the plan, and the captured step where
    it applies."""
    tasks = [t for t in cfg.tasks if t in train]
    missing = [t for t in tasks if train[t].labels is None or len(train[t]) == 0]
    if missing:
        raise MinBertError(f"training split of task '{missing[0]}' is empty or unlabelled; check the prepared data")
    world, device = options.dist_info.world, options.device
    refuse_batch_statistics(cfg.heads, tasks, world)
    sizes = {t: len(train[t]) for t in tasks}
    precision = options.precision
    description = options.description or {"settings": {"finetune": as_json(cfg), "seed": options.seed,
                                                       "bf16": options.bf16}, "sizes": sizes}
    # where and how it runs: a state saved on one device type or in one precision never resumes in another
    description = with_runtime(description, device.type, precision, world)
    model.to(device)
    if cfg.freeze_encoder:
        model.encoder.freeze(True)
    optimizer = build_adamw([(encoder_parameters(model), cfg.lr), (head_parameters(model), cfg.head_lr or cfg.lr)],
                            cfg.weight_decay)
    momentum = None
    if cfg.smart.enabled and cfg.smart.mu > 0:
        momentum = MomentumModel(model, cfg.smart.beta)
        momentum.module.eval()   # the Bregman term compares with the copy's deterministic output
    if cfg.compile:   # in place: parameter names, checkpoints and the momentum copy stay as they are
        model.encoder.compile(dynamic=True)
    # SMART's noise is drawn where the model is, by a generator of the run's (checkpointed with it)
    generators = {"smart": torch.Generator(device=device).manual_seed(options.seed + 17),
                  "pcgrad": torch.Generator(device="cpu").manual_seed(options.seed + 29)}
    tr = Training(model, tokenizer, {t: train[t] for t in tasks}, dev, cfg, options, optimizer,
                  [p for p in model.parameters() if p.requires_grad], momentum, generators,
                  options.fingerprint or fingerprint_of(description), description, EpochTotals(tasks, device))
    if options.fp16:   # float16's range needs the loss scaled up, and the gradients checked for overflow
        tr.scaler = torch.amp.GradScaler(device.type)
    if device.type == "cuda" and options.cuda_graphs:
        reason = why_not_captured(cfg, world, precision)
        if reason is None:
            tr.captured = CapturedSteps(tr)
        else:
            log.info("training steps run uncaptured on %s: %s", device, reason)
    if options.dist_info.main:
        options.state_dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(options.state_dir)
    return tr, Plan.build(cfg, tasks, sizes, options.seed)


def start_trackers(tr: Training, resumed: TrainState | None) -> None:
    """The run's experiment trackers (finetune.tracking; main rank), their logs in the state folder:
    continued after a resume from the update its state was saved at, afresh otherwise."""
    if not tr.cfg.tracking or not tr.dist.main:
        return
    folder = tr.state_dir / "tracking"
    if resumed is None:
        shutil.rmtree(folder, ignore_errors=True)
    tr.trackers = Trackers(tr.cfg.tracking, folder, resumed_at=None if resumed is None else resumed.update,
                           name=tr.options.checkpoint_extra.get("experiment", "run"), params=as_json(tr.cfg))


def store_frozen_features(tr: Training, plan: Plan) -> None:
    """A frozen, deterministic encoder's embeddings, computed once (minbert.train.frozen): for the dev
    splits (evaluated every epoch) and for each training split the run will walk through at least
    once (a task of which it draws fewer rows is cheaper to embed batch by batch)."""
    cfg = tr.cfg
    for task in tr.train:
        if cacheable(tr.model, cfg, task) and plan.drawn(task) * cfg.batch_size >= len(tr.train[task]) \
                and task not in tr.features:
            tr.features[task] = FrozenFeatures(tr.model, tr.train[task], tr.tokenizer, tr.device, tr.amp)
    if tr.dist.main:
        for task, data in tr.dev.items():
            if cacheable(tr.model, cfg, task) and data.labels is not None and len(data) and task in tr.model.heads:
                tr.dev_features[task] = FrozenFeatures(tr.model, data, tr.tokenizer, tr.device, tr.amp)
    if tr.features or tr.dev_features:
        log.info("frozen encoder: embeddings computed once for %s", ", ".join(
            [f"{t} train" for t in tr.features] + [f"{t} dev" for t in tr.dev_features]))


def finish(tr: Training, state: TrainState, out_dir: Path) -> None:
    """The declared outputs from the finished run's best model, then the state folder goes."""
    if not tr.best_path.is_file():
        raise MinBertError(f"no epoch produced a dev score to select a model by; check that the prepared data "
                           f"has labelled dev splits for {', '.join(tr.train)}")
    if state.best_epoch < 0:
        log.warning("no epoch had every dev metric defined, so none is selected as the best; the model of the "
                    "last epoch is kept (its undefined metrics stay undefined in metrics.json)")
    best = torch.load(tr.best_path, map_location="cpu", weights_only=True)
    fit_calibration(tr, best)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch_save(best, out_dir / MODEL_FILE)
    write_history(out_dir / HISTORY_FILE, state.history)
    if tr.trackers is not None:
        tr.trackers.finish(out_dir)
    shutil.rmtree(tr.state_dir, ignore_errors=True)


def _result(state: TrainState, t_start: float) -> FitResult:
    seconds = time.perf_counter() - t_start
    return FitResult(state.best_score, state.best_epoch, state.best_dev, pd.DataFrame(state.history),
                     seconds, state.examples / max(seconds, 1e-9), state.dev_before, phase_stops(state.history))
