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
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, clean_stale_temporaries, torch_save
from minbert.core.layout import HISTORY_FILE, MODEL_FILE
from minbert.core.metrics import (
    metric_undefined,
    selection_score,
    summarise,
    task_metric,
)
from minbert.core.provenance import fingerprint_of
from minbert.core.runtime import autocast
from minbert.core.tasks import TASKS
from minbert.data.batches import Collator, TaskData, to_device
from minbert.data.stream import TaskStream
from minbert.model.checkpoint import checkpoint_dict
from minbert.model.multitask import (
    MultitaskModel,
    encoder_parameters,
    head_parameters,
    predict_task,
)
from minbert.model.outputs import calibrated, predictions
from minbert.model.tokenizer import Tokenizer
from minbert.params.finetune import FinetuneParams
from minbert.train.distributed import (
    average_gradients,
    barrier,
    refuse_batch_statistics,
)
from minbert.train.losses import task_loss
from minbert.train.optim import build_adamw, set_lr
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
EVAL_BATCH_SIZE = 128          # dev evaluation during training (prediction speed lives in predict)
CHECK_EVERY = 50    # updates between the host's reads of the device's running totals (non-finite losses)


# ---------------------------------------------------------------- evaluation

def dev_metrics(model: MultitaskModel, dev: dict[str, TaskData], tokenizer: Tokenizer, device, bf16: bool,
                features: dict | None = None) -> dict[str, float]:
    """Dev metrics and losses of every labelled task, plus overall/mean when they apply; a task
    with stored embeddings of a frozen encoder (`features`, minbert.train.frozen) runs its head only."""
    out: dict[str, float] = {}
    amp = lambda: autocast(device, bf16)  # noqa: E731
    for task, data in dev.items():
        if data.labels is None or len(data) == 0:
            continue
        loss = partial(task_loss, task, model.heads_cfg)
        if features and task in features:
            res = features[task].predict(model, amp, EVAL_BATCH_SIZE, loss, data.labels)
        else:
            res = predict_task(model, data, tokenizer, EVAL_BATCH_SIZE, device, amp, loss=loss)
        out[TASKS[task].metric_key] = task_metric(task, res["prediction"], data.labels)
        if out[TASKS[task].metric_key] is None:   # undefined: this epoch cannot be selected (selection_score)
            log.warning("dev %s is undefined (%s); an epoch with it is not selected as the best",
                        TASKS[task].metric_key, metric_undefined(task, res["prediction"], data.labels))
        out[f"{task}_loss"] = res["loss"]
    return summarise(out)


def run_epoch(tr: Training, state: TrainState, plan: Plan) -> dict:
    """Train the updates of the state's current epoch; returns the epoch's history row (train part)."""
    cfg, pi = tr.cfg, state.phase
    phase_tasks = plan.phases[pi]
    collator = Collator(tr.tokenizer, fixed_shapes=tr.captured is not None)
    streams = {t: TaskStream(tr.train[t], collator, cfg.batch_size, tr.options.seed + 101 * (i + 1), state.epoch,
                             shard=(tr.dist.rank, tr.dist.world), features=tr.features.get(t),
                             walked=plan.walked(pi, state.epoch, t) if t in cfg.walk_through else None)
               for i, t in enumerate(phase_tasks)}
    totals = tr.totals
    totals.reset()
    tr.model.train()
    if cfg.freeze_encoder and not cfg.frozen_encoder_dropout:
        tr.model.encoder.eval()
    t0, n_examples, lr = time.perf_counter(), 0, 0.0
    desc = (f"{'+'.join(phase_tasks)} " if len(plan.phases) > 1 else "") + f"epoch {state.epoch + 1}/{cfg.epochs}"
    bar = tqdm(plan.epochs[(pi, state.epoch)], desc=desc, unit="upd", leave=False, dynamic_ncols=True,
               disable=not (tr.options.progress and tr.dist.main), mininterval=1.0 if sys.stderr.isatty() else 15.0)
    for k, update_tasks in enumerate(bar):
        batches = [(task, streams[task].next()) for task in update_tasks]     # built on the host
        labels = [b["labels"].numpy() for _, b in batches]
        if tr.captured is not None:
            lr = tr.captured.step(state, plan, batches, labels)
        else:
            lr = train_step(tr, state, plan, batches, labels, pcgrad_order(tr, batches))
        n_examples += sum(len(y) for y in labels) * tr.dist.world
        if (k + 1) % CHECK_EVERY == 0:
            check_finite(tr, state)
        bar.set_postfix(ex_s=f"{n_examples / max(time.perf_counter() - t0, 1e-9):.0f}", lr=f"{lr:.1e}", refresh=False)
    bar.close()
    check_finite(tr, state)
    seconds = time.perf_counter() - t0
    state.examples += n_examples
    row = {"epoch": len(state.history) + 1, "phase": "+".join(phase_tasks), "lr": lr,
           "seconds": round(seconds, 2), "examples_per_second": round(n_examples / max(seconds, 1e-9), 1)}
    for k, t in enumerate(totals.tasks):
        if totals.n[t]:   # drop round-robin / sampling may skip a task in a short epoch
            pred = predictions(t, tr.model.heads_cfg, torch.cat(totals.outputs[t]))["prediction"]
            row[f"train_{t}_loss"] = float(totals.loss[k]) / totals.n[t]
            row[f"train_{t}_{TASKS[t].metric}"] = task_metric(t, pred, np.concatenate(totals.labels[t]))
    return row


def pcgrad_order(tr: Training, batches: list) -> list[list[int]] | None:
    """PCGrad's random order for this update, drawn on the host before the step (None without it)."""
    if not (tr.cfg.pcgrad and len(batches) > 1):
        return None
    from minbert.train.regularisers import pcgrad_orders

    return pcgrad_orders(len(batches), tr.generators["pcgrad"])


def train_step(tr: Training, state: TrainState, plan: Plan, batches: list[tuple[str, dict]],
               labels: list[np.ndarray], orders: list[list[int]] | None = None) -> float:
    """One update from host batches [(task, batch)] and their labels as the host has them: forward,
    backward (PCGrad when asked), the all-reduce under torchrun, clip, step. The host reads no value
    the device computed (no sync): labels stay on the host, losses and outputs go to the run's
    totals. Returns the learning rate."""
    cfg, totals = tr.cfg, tr.totals
    lr = set_lr(tr.optimizer, state.update, plan.total_updates, plan.warmup, cfg.lr_schedule)
    tr.optimizer.zero_grad(set_to_none=True)
    totals.flag.zero_()
    pcgrad = cfg.pcgrad and len(batches) > 1
    if pcgrad and orders is None:
        orders = pcgrad_order(tr, batches)
    pc_losses = []
    for (task, host_batch), y in zip(batches, labels):
        batch = to_device(host_batch, tr.device)
        with tr.amp():
            loss, out = tr.objective(task)(batch)
        totals.add_loss(task, loss, len(y), state.update, totals.flag)
        totals.add_outputs(task, out.detach().float(), y)
        weighted = cfg.task_weights.get(task, 1.0) * loss
        if pcgrad:
            pc_losses.append(weighted)
        else:
            weighted.backward()
    if pc_losses:
        from minbert.train.regularisers import pcgrad_backward

        pcgrad_backward(pc_losses, tr.params, world=tr.dist.world, with_stats=False, orders=orders)
    average_gradients(tr.params, tr.dist.world, totals.flag)
    totals.flagged += totals.flag
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(tr.params, cfg.grad_clip, foreach=True)
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


def diverged(tr: Training, what: str) -> None:
    """Stop a run whose numbers went non-finite. Its state goes too: resumed with the same settings
    it would diverge again, and with other settings it would not be resumed."""
    if tr.dist.main:
        shutil.rmtree(tr.state_dir, ignore_errors=True)
    advice = ["lower the learning rate"] + ([] if tr.cfg.grad_clip else ["set grad_clip (e.g. 1.0)"]) + \
        (["set precision: fp32"] if tr.options.bf16 else [])
    raise MinBertError(f"training diverged: {what}; {', '.join(advice[:-1]) + ' or ' if len(advice) > 1 else ''}"
                       f"{advice[-1]}, then run again (nothing was written)")


# ---------------------------------------------------------------- end of an epoch

def end_of_epoch(tr: Training, state: TrainState, plan: Plan, row: dict, t_start: float) -> None:
    """Evaluate on dev, keep the best model, save the resumable state (main rank only)."""
    state.epoch += 1
    state.seconds = time.perf_counter() - t_start
    if not tr.dist.main:
        return
    dev = dev_metrics(tr.model, tr.dev, tr.tokenizer, tr.device, tr.options.bf16, tr.dev_features)
    finite = torch.stack([torch.isfinite(p).all() for p in tr.model.parameters()]).all()   # one read
    bad = [f"dev {k}" for k, v in dev.items() if v is not None and not math.isfinite(v)] or ([] if bool(finite) else ["weights"])
    if bad:
        diverged(tr, f"non-finite {', '.join(bad[:3])} after the last update of epoch {row['epoch']}")
    for t in tr.dev:
        if f"{t}_loss" in dev:
            row[f"dev_{t}_loss"] = dev[f"{t}_loss"]
            row[f"dev_{t}_{TASKS[t].metric}"] = dev[TASKS[t].metric_key]
    if "overall" in dev:
        row["dev_overall"] = dev["overall"]
    score = selection_score(dev, plan.phases[state.phase] if tr.cfg.schedule == "sequential" else list(tr.train))
    row["dev_score"] = score if score is not None else math.nan
    state.history.append(row)
    log.info("epoch %d (%s): %s", row["epoch"], row["phase"],
             ", ".join(f"{k}={'undefined' if v is None else format(v, '.4f')}" for k, v in row.items()
                       if k.startswith("dev_")))
    keep_best(tr, state, row, dev, score)
    # the resumable state every `checkpoint_every` epochs and at the end of each phase (a later
    # phase starts from it); the last epoch's is not needed: the run finishes right after it
    last_of_phase = state.epoch == tr.cfg.epochs
    if last_of_phase and state.phase + 1 == len(plan.phases):
        return
    if state.epoch % tr.cfg.checkpoint_every == 0 or last_of_phase:
        save_state(tr, state)


def keep_best(tr: Training, state: TrainState, row: dict, dev: dict, score: float | None) -> None:
    """best.pt: this epoch's model when its selection score is the phase's best so far."""
    extra = tr.options.checkpoint_extra
    if score is not None and score > state.phase_best:
        state.phase_best = state.best_score = score
        state.best_epoch = row["epoch"]
        state.best_dev = {k: v for k, v in dev.items() if not k.endswith("_loss")}
        torch_save(checkpoint_dict(tr.model, tr.tokenizer, epoch=row["epoch"], dev_metrics=state.best_dev, **extra),
                   tr.best_path)
    elif state.phase_best == -math.inf and any(dev.get(TASKS[t].metric_key, 0) is None for t in tr.dev):
        # No epoch of this phase has every dev metric defined yet: this epoch's model stands in, never
        # recorded as selected (best_epoch stays unset), so a run whose metric stays undefined (a tiny
        # model's constant similarity scores) still ends with a model, the last, and says so.
        torch_save(checkpoint_dict(tr.model, tr.tokenizer, epoch=row["epoch"], dev_metrics={}, **extra),
                   tr.best_path)
        state.best_score, state.best_epoch, state.best_dev = -math.inf, -1, {}   # the model is no selected one


def end_of_phase(tr: Training, state: TrainState, plan: Plan) -> None:
    """Sequential fine-tuning: the next task starts from this phase's best weights."""
    if tr.cfg.schedule == "sequential" and state.phase + 1 < len(plan.phases):
        barrier(tr.dist)
        best = torch.load(tr.best_path, map_location="cpu", weights_only=True)
        tr.model.load_state_dict(best["state_dict"])
        if tr.momentum is not None:    # SMART's momentum copy restarts from the weights this phase starts from
            tr.momentum.module.load_state_dict(best["state_dict"])
        state.phase_best = -math.inf
    state.phase += 1
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
        cfg: FinetuneParams, options: FitOptions) -> FitResult:
    """Train `model` per `cfg`; at the end writes options.out_dir/{model.pt,history.csv}. See the
    module docstring."""
    tr, plan = start_run(model, tokenizer, train, dev, cfg, options)
    state = (resume_state(tr) if options.resume else None) or TrainState()
    store_frozen_features(tr, plan)
    if options.evaluate_first and state.dev_before is None and tr.dist.main:
        state.dev_before = dev_metrics(model, dev, tokenizer, tr.device, options.bf16)
    t_start = time.perf_counter() - state.seconds
    epochs_run = 0
    while state.phase < len(plan.phases):
        while state.epoch < cfg.epochs:
            if options.stop_after_epochs is not None and epochs_run >= options.stop_after_epochs:
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
              cfg: FinetuneParams, options: FitOptions) -> tuple[Training, Plan]:
    """Everything a run works with: the model on its device, the optimiser, SMART's momentum copy,
    the run's generators, its description and fingerprint, the plan, and the captured step where
    it applies."""
    out_dir = Path(options.out_dir)
    options.state_dir = Path(options.state_dir) if options.state_dir is not None else \
        out_dir.with_name(out_dir.name + ".state")
    tasks = [t for t in cfg.tasks if t in train]
    missing = [t for t in tasks if train[t].labels is None or len(train[t]) == 0]
    if missing:
        raise MinBertError(f"training split of task '{missing[0]}' is empty or unlabelled; check the prepared data")
    world, device = options.dist_info.world, options.device
    refuse_batch_statistics(cfg.heads, tasks, world)
    sizes = {t: len(train[t]) for t in tasks}
    description = options.description or {"settings": {"finetune": cfg.model_dump(), "seed": options.seed,
                                                       "bf16": options.bf16}, "sizes": sizes}
    # where and how it runs: a state saved on one device type or in one precision never resumes in another
    description = {**description, "world": world, "device_type": device.type,
                   "precision": "bf16" if options.bf16 else "fp32"}
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
    # SMART's noise is drawn where the model is, by a generator of the run's (checkpointed with it)
    generators = {"smart": torch.Generator(device=device).manual_seed(options.seed + 17),
                  "pcgrad": torch.Generator(device="cpu").manual_seed(options.seed + 29)}
    tr = Training(model, tokenizer, {t: train[t] for t in tasks}, dev, cfg, options, optimizer,
                  [p for p in model.parameters() if p.requires_grad], momentum, generators,
                  fingerprint_of(description), description, EpochTotals(tasks, device))
    if device.type == "cuda" and options.cuda_graphs:
        from minbert.train.step import CapturedSteps, why_not_captured

        reason = why_not_captured(cfg, world)
        if reason is None:
            tr.captured = CapturedSteps(tr)
        else:
            log.info("training steps run uncaptured on %s: %s", device, reason)
    if options.dist_info.main:
        options.state_dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(options.state_dir)
    return tr, Plan.build(cfg, tasks, sizes, options.seed)


def store_frozen_features(tr: Training, plan: Plan) -> None:
    """A frozen, deterministic encoder's embeddings, computed once (minbert.train.frozen): for the dev
    splits (evaluated every epoch) and for each training split the run will walk through at least
    once (a task of which it draws fewer rows is cheaper to embed batch by batch)."""
    from minbert.train.frozen import FrozenFeatures, cacheable

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
    shutil.rmtree(tr.state_dir, ignore_errors=True)


def fit_calibration(tr: Training, best: dict) -> None:
    """A head trained with a loss that fixes no scale (its declaration says so: minbert.core.losses;
    the correlation loss, the ranking loss) predicts on a scale of its own: fit a scale and shift of
    its outputs to the training labels, kept in the checkpoint (minbert.model.outputs), so that a
    regression's predictions land on the label scale without clipping that would change their
    correlation (least squares), and a binary task's logit gives probabilities (a logistic fit:
    Platt scaling). The outputs fitted are the model's own: in the run's precision, as the predict
    stage makes them on this device."""
    tasks = [t for t in tr.train if calibrated(tr.model.heads_cfg, t) and TASKS[t].kind != "classification"]
    if not tasks:
        return
    tr.model.load_state_dict(best["state_dict"])
    calibration = dict(best.get("calibration") or {})
    for task in tasks:
        tr.model.calibration.pop(task, None)
        res = predict_task(tr.model, tr.train[task], tr.tokenizer, EVAL_BATCH_SIZE, tr.device, tr.amp)
        regression = TASKS[task].kind == "regression"
        x = (res["prediction"] if regression else res["output"].numpy()).astype(np.float64)
        y = tr.train[task].labels.astype(np.float64)
        scale, shift = affine_fit(x, y) if regression else logistic_fit(x, y)
        calibration[task] = [float(scale), float(shift)]
        log.info("%s: predictions calibrated to the training labels (scale %.4g, shift %.4g)", task, scale, shift)
    best["calibration"] = calibration
    tr.model.calibration = calibration


def affine_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y ~ scale x + shift; outputs that hardly vary carry no ranking to calibrate:
    the mean label then."""
    if np.std(x) <= 1e-6 * max(1.0, float(np.abs(x).mean())):
        return 0.0, float(np.mean(y))
    scale, shift = np.polyfit(x, y, 1)
    return float(scale), float(shift)


def logistic_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """P(y = 1) = sigmoid(scale x + shift) fitted by maximum likelihood (scikit-learn, almost no
    regularisation); labels of one class only: the logit of the class's smoothed share, scale 0."""
    if len(np.unique(y)) < 2:
        share = (y.sum() + 0.5) / (len(y) + 1.0)
        return 0.0, float(np.log(share / (1 - share)))
    from sklearn.linear_model import LogisticRegression

    fit = LogisticRegression(C=1e6, max_iter=1000).fit(x[:, None], y.astype(int))
    return float(fit.coef_[0, 0]), float(fit.intercept_[0])


def write_history(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")


def _result(state: TrainState, t_start: float) -> FitResult:
    seconds = time.perf_counter() - t_start
    return FitResult(state.best_score, state.best_epoch, state.best_dev, pd.DataFrame(state.history),
                     seconds, state.examples / max(seconds, 1e-9), state.dev_before)
