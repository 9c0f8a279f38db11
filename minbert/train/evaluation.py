"""Dev evaluation within a training run (minbert.train.loop): the dev metrics and losses, the points
of an epoch where they are taken, the history row they fill, early stopping on the selection score,
the best model kept, a run that diverged stopped, and after the run the calibration of a head whose
loss fixes no scale."""
from __future__ import annotations

import logging
import math
import shutil
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, torch_save
from minbert.core.metrics import metric_undefined, selection_score, summarise, task_metric
from minbert.core.runtime import autocast
from minbert.data.batches import TaskData
from minbert.model.checkpoint import checkpoint_dict
from minbert.model.multitask import MultitaskModel, predict_task
from minbert.model.tokenizer import Tokenizer
from minbert.train.losses import task_loss
from minbert.train.points import EVAL_BATCH_SIZE, eval_points  # noqa: F401  (the loop reads it from here)
from minbert.train.stopping import plateau_stop
from minbert.train.training import Plan, Training, TrainState

log = logging.getLogger("minbert.train.loop")


def dev_metrics(model: MultitaskModel, dev: dict[str, TaskData], tokenizer: Tokenizer, device, precision: bool | str,
                features: dict | None = None) -> dict[str, float]:
    """Dev metrics and losses of every labelled task, plus overall/mean when they apply; a task
    with stored embeddings of a frozen encoder (`features`, minbert.train.frozen) runs its head only.
    `precision`: the run's autocast ('bf16', 'fp16', 'fp32'; True stands for bf16)."""
    out: dict[str, float] = {}
    amp = lambda: autocast(device, precision)  # noqa: E731
    for task, data in dev.items():
        if data.labels is None or len(data) == 0:
            continue
        loss = partial(task_loss, task, model.heads_cfg)
        if features and task in features:
            res = features[task].predict(model, amp, EVAL_BATCH_SIZE, loss, data.labels)
        else:
            res = predict_task(model, data, tokenizer, EVAL_BATCH_SIZE, device, amp, loss=loss)
        key = model.registry.tasks[task].metric_key
        out[key] = task_metric(task, res["prediction"], data.labels)
        if out[key] is None:   # undefined: this epoch cannot be selected (selection_score)
            log.warning("dev %s is undefined (%s); an epoch with it is not selected as the best",
                        key, metric_undefined(task, res["prediction"], data.labels))
        out[f"{task}_loss"] = res["loss"]
    return summarise(out)


def diverged(tr: Training, what: str) -> None:
    """Stop a run whose numbers went non-finite. Its state goes too: resumed with the same settings
    it would diverge again, and with other settings it would not be resumed."""
    if tr.dist.main:
        shutil.rmtree(tr.state_dir, ignore_errors=True)
    advice = ["lower the learning rate"] + ([] if tr.cfg.grad_clip else ["set grad_clip (e.g. 1.0)"]) + \
        (["set precision: fp32"] if tr.options.bf16 or tr.options.fp16 else [])
    raise MinBertError(f"training diverged: {what}; {', '.join(advice[:-1]) + ' or ' if len(advice) > 1 else ''}"
                       f"{advice[-1]}, then run again (nothing was written)")


def evaluate(tr: Training, state: TrainState, plan: Plan, row: dict) -> None:
    """Dev metrics into the history row, and the model as the best so far when it is (main rank
    only; the others train on)."""
    if not tr.dist.main:
        return
    t0 = time.perf_counter()
    dev = dev_metrics(tr.model, tr.dev, tr.tokenizer, tr.device, tr.precision, tr.dev_features)
    tr.eval_seconds = (tr.eval_seconds[0] + time.perf_counter() - t0, tr.eval_seconds[1] + 1)
    finite = torch.stack([torch.isfinite(p).all() for p in tr.model.parameters()]).all()   # one read
    bad = [f"dev {k}" for k, v in dev.items() if v is not None and not math.isfinite(v)] or ([] if bool(finite) else ["weights"])
    if bad:
        where = f"the last update of epoch {row['epoch']}" if isinstance(row["epoch"], int) else \
            f"update {row['update']} (epoch {row['epoch']:g})"
        diverged(tr, f"non-finite {', '.join(bad[:3])} after {where}")
    for t in tr.dev:
        if f"{t}_loss" in dev:
            row[f"dev_{t}_loss"] = dev[f"{t}_loss"]
            spec = tr.model.registry.tasks[t]
            row[f"dev_{t}_{spec.metric}"] = dev[spec.metric_key]
    if "overall" in dev:
        row["dev_overall"] = dev["overall"]
    tasks = plan.phases[state.phase] if tr.cfg.schedule == "sequential" else list(tr.train)
    score = selection_score(dev, tasks)
    row["dev_score"] = score if score is not None else math.nan
    state.history.append(row)
    if tr.trackers is not None:
        tr.trackers.log_row(row)
    log.info("epoch %g (%s): %s", row["epoch"], row["phase"],
             ", ".join(f"{k}={'undefined' if v is None else format(v, '.4f')}" for k, v in row.items()
                       if k.startswith("dev_")))
    early_stop(tr, state, score)
    plateau_stop(tr, state, tasks, row)
    keep_best(tr, state, row, dev, score)


def early_stop(tr: Training, state: TrainState, score: float | None) -> None:
    """Count the evaluations since the selection score last rose by more than `min_delta` (against
    the phase's best before this one); at `patience` of them the phase stops (`state.stopped`)."""
    rule = tr.cfg.early_stopping
    if rule is None:
        return
    if score is not None and score > state.phase_best + rule.min_delta:
        state.stale = 0
        return
    state.stale += 1
    if state.stale >= rule.patience:
        state.stopped = True
        log.info("early stopping: dev_score has not improved by more than %g for %d evaluations (best %.4f at "
                 "epoch %g); %s", rule.min_delta, state.stale, state.phase_best, state.best_epoch,
                 "this task's phase ends" if tr.cfg.schedule == "sequential" else "training ends")


def keep_best(tr: Training, state: TrainState, row: dict, dev: dict, score: float | None) -> None:
    """This evaluation's model as the phase's best when its selection score is the best so far: held
    (a copy, on the host) until the epoch ends, when `write_best` writes best.pt beside the state
    saved then, so an interrupted epoch never leaves a best.pt the saved state does not know."""
    extra = tr.options.checkpoint_extra
    if score is not None and score > state.phase_best:
        state.phase_best = state.best_score = score
        state.best_epoch = row["epoch"]
        state.best_dev = {k: v for k, v in dev.items() if not k.endswith("_loss")}
        tr.pending_best = checkpoint_dict(tr.model, tr.tokenizer, epoch=row["epoch"], dev_metrics=state.best_dev,
                                          **extra)
    elif state.phase_best == -math.inf and any(dev.get(tr.model.registry.tasks[t].metric_key, 0) is None
                                               for t in tr.dev):
        # No evaluation of this phase has every dev metric defined yet: this one's model stands in, never
        # recorded as selected (best_epoch stays unset), so a run whose metric stays undefined (a tiny
        # model's constant similarity scores) still ends with a model, the last, and says so.
        tr.pending_best = checkpoint_dict(tr.model, tr.tokenizer, epoch=row["epoch"], dev_metrics={}, **extra)
        state.best_score, state.best_epoch, state.best_dev = -math.inf, -1, {}   # the model is no selected one


def write_best(tr: Training) -> None:
    """best.pt from the best model held since the last write (`keep_best`), if any."""
    if tr.pending_best is not None:
        torch_save(tr.pending_best, tr.best_path)
        tr.pending_best = None


def fit_calibration(tr: Training, best: dict) -> None:
    """A head trained with a loss that fixes no scale (its declaration says so: `calibrate`; the model
    keeps a calibration for it: the correlation loss, the ranking loss) predicts on a scale of its
    own: fit a scale and shift of
    its outputs to the training labels, kept in the checkpoint (minbert.model.outputs), so that a
    regression's predictions land on the label scale without clipping that would change their
    correlation (least squares), and a binary task's logit gives probabilities (a logistic fit:
    Platt scaling). The outputs fitted are the model's own: in the run's precision, as the predict
    stage makes them on this device."""
    known = tr.model.registry.tasks
    tasks = [t for t in tr.train if t in tr.model.calibration and known[t].kind != "classification"]
    if not tasks:
        return
    tr.model.load_state_dict(best["state_dict"])
    calibration = dict(best.get("calibration") or {})
    for task in tasks:
        tr.model.calibration[task] = []           # the head's own outputs, on its own scale
        res = predict_task(tr.model, tr.train[task], tr.tokenizer, EVAL_BATCH_SIZE, tr.device, tr.amp)
        regression = known[task].kind == "regression"
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
