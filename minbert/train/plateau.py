"""Whether a training curve has flattened, at the noise of its evaluations: the rule the report's
training check reads (minbert.report.training) and a training loop may stop on, written once.

A curve is one phase's dev evaluations: each one's place in the phase's learning-rate budget (the
learning rate summed over the updates before it, `lr_budget`) and its score. Its **trend** is the
least-squares slope through the evaluations in the last `fit` of the budget (and the last one before
it, where fewer than three lie there), read as the change that one more `window` of the same budget
would bring (`Trend.gain`); its standard error follows from the noise of one evaluation (`noise`: the
sd of one evaluation's score about the curve), which the caller knows from the rows scored
(`evaluation_noise`, `weighted_noise`). A fit over more
of the budget than the window reads a slope with a smaller error; where the curve still bends there,
the slope over the longer stretch is the steeper one, so the rule errs toward "still moving".

The rule (`movement`): one more window could move the curve past `up` (above) or `down` (below)?
- "flat" where it could not: the gain lies within the bounds even at the edge of its one-sided 95%
  interval (two-sided where both bounds count), or the noise is small enough to tell a flat curve from
  one moving by twice the bound (`se <= bound / z`) and the gain lies within;
- "up" or "down" where it could: clearly past a bound, or past it where the noise can tell;
- "unclear" where the noise is too large to tell either way (`se > bound / z`): more evaluations, or
  more dev rows each, would tell.

So a flat curve passes and one moving by twice the bound per window fails, each at least 95% of the
time wherever the rule does not answer "unclear" (`error_rates` measures it by simulation; the tests
and docs/report.md state it at each scale's geometry). `earliest_stop` says after how many of a phase's
evaluations a flat curve can first read flat (what `minbert estimate` prices a run that stops at its
plateau by). Everything here is numpy over arrays: no report, no model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minbert.core.tasks import TASKS

Z_ONE_SIDED = 1.6448536269514722        # the 95% quantile of the normal
Z_TWO_SIDED = 1.959963984540054         # its 97.5% quantile


@dataclass(frozen=True)
class Trend:
    """A curve's change over one more window of its budget, as fitted over its last window."""
    gain: float                         # the fitted change over one more window (score units)
    se: float                           # its standard error at the evaluations' noise
    fitted: int                         # evaluations the fit read (those in the window and one before)
    inside: int                         # of them in the window


def lr_budget(step, total: int, warmup: int, schedule: str = "linear"):
    """The learning rate summed over the updates before `step` (0..total; an array or a number), for a
    peak rate of 1, on minbert.train.optim.lr_at's schedule: linear warm-up over `warmup` updates, then
    constant, or a linear or cosine decay to 0 at `total`. In closed form: no loop over the updates, so
    a history's `update` of 1e12 costs what 10 does."""
    s = np.asarray(step, dtype=float)
    w = float(max(warmup, 0))
    ramp = np.minimum(s, w)
    out = ramp * (ramp + 1) / (2 * w) if w > 0 else np.zeros_like(s)       # sum of (k + 1) / w, k < min(s, w)
    n = np.maximum(s - w, 0.0)                                               # updates after the warm-up
    if schedule == "constant":
        return out + n
    d = float(max(1, total - warmup))
    n = np.minimum(n, d)                                                     # the rate is 0 from `total` on
    if schedule == "linear":
        return out + n - n * (n - 1) / (2 * d)                               # sum of 1 - j / d, j < n
    if schedule == "cosine":                                                 # sum of (1 + cos(pi j / d)) / 2
        a = math.pi / d
        cos_sum = np.where(n > 0, np.sin(n * a / 2) * np.cos((n - 1) * a / 2) / math.sin(a / 2), 0.0)
        return out + (n + cos_sum) / 2
    raise ValueError(f"unknown lr schedule {schedule!r}")


def evaluation_noise(rows: int, per_row: float, jitter: float = 0.0) -> float:
    """The noise of one evaluation on `rows` dev rows: a score's change between two successive
    evaluations of a model that has stopped improving has variance jitter^2 + per_row^2 / rows (the
    model's own move, and the rows whose prediction flips: for an accuracy, `per_row` is the square root
    of the share of rows that flip), and the change of two independent evaluations has twice the
    variance of one."""
    return math.sqrt((jitter ** 2 + per_row ** 2 / max(rows, 1)) / 2)


def score_weights(tasks: list[str]) -> dict[str, float]:
    """How much each task's metric weighs in a selection score of `tasks` (minbert.core.metrics.
    selection_score: a mean on a 0-1 scale, a correlation's (r + 1) / 2 counting half its r)."""
    return {t: (0.5 if TASKS[t].kind == "regression" else 1.0) / len(tasks) for t in tasks if t in TASKS}


def weighted_noise(rows: dict[str, int], weights: dict[str, float], noise) -> float:
    """The noise of one evaluation of a score that weighs each task's metric by `weights`, each task
    scored on `rows[task]` dev rows; `noise`: each kind of task's parts (`.classification`, `.binary`,
    `.regression`, each with `.rows` and `.jitter`: minbert.params.plateau.EvaluationNoise). The tasks
    are independent, so their variances add."""
    var = 0.0
    for task, weight in weights.items():
        parts = getattr(noise, TASKS[task].kind)
        var += (weight * evaluation_noise(rows[task], parts.rows, parts.jitter)) ** 2
    return math.sqrt(var)


def in_window(place, start: float, window: float) -> np.ndarray:
    """Which evaluations lie in the last `window` of the phase's budget (after its start)."""
    place = np.asarray(place, dtype=float)
    span = float(place[-1] - start) if len(place) else 0.0
    return place > place[-1] - window * span + 1e-9 * span if span > 0 else np.zeros(len(place), bool)


def trend(place, values, start: float, window: float, noise: float, fit: float | None = None) -> Trend | None:
    """The trend of a curve (`values` at budget `place`, its phase starting at `start`; `values` may
    carry leading dimensions, one curve per row, for a simulation): the slope through the evaluations in
    its last `fit` of the budget (default: the window), and the one before where fewer than 3 lie there,
    read over one more `window`. None where the window holds no evaluation or the fit fewer than 2."""
    place = np.asarray(place, dtype=float)
    values = np.asarray(values, dtype=float)
    inside, fitted = in_window(place, start, window), in_window(place, start, max(fit or window, window))
    if fitted.sum() < 3 and not fitted.all() and fitted.any():
        fitted[int(np.argmax(fitted)) - 1] = True
    if not inside.any() or fitted.sum() < 2:
        return None
    x = (place[fitted] - start) / (place[-1] - start)
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    gain = (values[..., fitted] * xc).sum(axis=-1) / sxx * window
    se = noise * window / math.sqrt(sxx)
    return Trend(gain if gain.ndim else float(gain), float(se), int(fitted.sum()), int(inside.sum()))


def movement(t: Trend, up: float = math.inf, down: float = math.inf):
    """Whether one more window could move the curve past `up` above or `down` below it (math.inf: a
    direction that does not count): "flat", "up", "down" or "unclear" (module docstring). `t.gain`
    may be an array (a simulation): the answer is then an array of those words."""
    z = Z_TWO_SIDED if math.isfinite(up) and math.isfinite(down) else Z_ONE_SIDED
    g, se = np.asarray(t.gain, dtype=float), t.se
    tells = se * z <= min(up, down)
    out = np.where(g + z * se <= up, np.where(g - z * se >= -down, "flat", "unclear"), "unclear").astype(object)
    if tells:
        out = np.where((g <= up) & (g >= -down), "flat", out)
    out = np.where((g > up) & (tells | (g - z * se > up)), "up", out)
    out = np.where((g < -down) & (tells | (g + z * se < -down)), "down", out)
    return str(out) if out.ndim == 0 else out


def settled(place, values, noise: float, tolerance: float, window: float = 0.25, fit: float | None = 0.5,
            start: float = 0.0) -> bool:
    """Whether a training loop may stop: the curve so far (`values` at budget `place`, its phase starting
    at `start`) reads "flat" against a rise of `tolerance` a window, at its evaluations' `noise` (the
    report's training check reads the same rule, with its settings)."""
    t = trend(place, values, start, window, noise, fit)
    return t is not None and movement(t, tolerance) == "flat"


def resolvable(place, start: float, window: float, noise: float, two_sided: bool = False,
               fit: float | None = None) -> float | None:
    """The smallest bound the rule tells at this geometry and noise (`z * se`): below it a flat curve
    reads "unclear". None where the window cannot be fitted."""
    place = np.asarray(place, dtype=float)
    t = trend(place, np.zeros(len(place)), start, window, noise, fit)
    return None if t is None else (Z_TWO_SIDED if two_sided else Z_ONE_SIDED) * t.se


def earliest_stop(place, noise: float, rule) -> int | None:
    """After how many of a phase's evaluations (at budget `place`, the phase starting at 0, in the order
    they come) a curve flat throughout first reads flat at `noise`: the first k, from `min_evaluations`
    on, with `window_evaluations` in its last `window` and its trend told to within `tolerance`
    (`rule`: minbert.params.plateau.UntilPlateau, filled). None where it never does in `place`."""
    place = np.asarray(place, dtype=float)
    for k in range(max(rule.min_evaluations, 2), len(place) + 1):
        if in_window(place[:k], 0.0, rule.window).sum() < rule.window_evaluations:
            continue
        told = resolvable(place[:k], 0.0, rule.window, noise, fit=rule.fit)
        if told is not None and told <= rule.tolerance:
            return k
    return None


DRAWS = 20000                           # curves per simulation


def error_rates(place, window: float, noise: float, tolerance: float, seed: int = 0, two_sided: bool = False,
                fit: float | None = None) -> tuple[float, float]:
    """(how often a flat curve reads "flat", how often one rising by twice `tolerance` per window reads
    "up"), by simulation: DRAWS curves each, independent normal noise of sd `noise` at each evaluation
    of `place` (a phase's budget positions, from 0 at its start)."""
    place = np.asarray(place, dtype=float)
    rng, shape = np.random.default_rng(seed), (DRAWS, len(place))
    down = tolerance if two_sided else math.inf
    flat = trend(place, rng.normal(0.0, noise, shape), 0.0, window, noise, fit)
    rising = trend(place, 2 * tolerance * place / place[-1] / window + rng.normal(0.0, noise, shape), 0.0, window,
                   noise, fit)
    if flat is None or rising is None:
        return 0.0, 0.0
    return (float(np.mean(movement(flat, tolerance, down) == "flat")),
            float(np.mean(movement(rising, tolerance, down) == "up")))


def phase_positions(updates: int, evaluations: int, warmup: int, schedule: str) -> np.ndarray:
    """Where a phase of `updates` updates evaluates dev `evaluations` times, evenly spaced (the last at
    its end), in its learning-rate budget as a share of the whole (a scale's geometry)."""
    points = np.array(sorted({max(1, round(updates * (j + 1) / evaluations)) for j in range(evaluations)}))
    return lr_budget(points, updates, warmup, schedule) / lr_budget(updates, updates, warmup, schedule)
