"""Ending a phase at its plateau (`finetune.until_plateau`): after each dev evaluation the phase's
curves so far are read by the rule the report's training check reads (minbert.train.plateau), at the
noise of the dev rows the run scores, and the phase ends once its selection score reads flat and no
trained task's own metric reads still rising; `finetune.epochs` is the cap. The reading goes into the
evaluation's history row (`plateau`), and the phase's last row says how it ended (`stopped`: `plateau`
or `cap`), which the report's training check quotes.

Its curves are placed as the check places them: on the learning-rate budget (`lr_budget`), the phase
starting where the previous phase's last evaluation stood.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.tasks import TASKS
from minbert.train import plateau

log = logging.getLogger("minbert.train.loop")
READINGS = ("flat", "rising", "unclear", "few")     # what `reading` says of a phase so far


def stops_early(cfg) -> bool:
    """Whether a run's phases may end before their planned epochs (early stopping, or the plateau)."""
    return cfg.early_stopping is not None or cfg.until_plateau.enabled


def phase_curve(history: list[dict], phase: str, column: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(budget places, values, the phase's start) of one column over the phase's evaluations so far,
    its undefined values left out."""
    first = next(i for i, r in enumerate(history) if r["phase"] == phase)
    start = float(history[first - 1]["lr_budget"]) if first else 0.0
    rows = [r for r in history[first:] if r["phase"] == phase]
    place = np.array([r["lr_budget"] for r in rows], dtype=float)
    values = np.array([r.get(column, math.nan) for r in rows], dtype=float)
    keep = np.isfinite(values)
    return place[keep], values[keep], start


def reading(history: list[dict], phase: str, tasks: list[str], rows: dict[str, int], rule) -> tuple[str, str]:
    """How the rule reads the phase so far: (one of READINGS, why in words). `tasks`: those its selection
    score averages; `rows`: the dev rows each scored; `rule`: the filled UntilPlateau."""
    place, values, start = phase_curve(history, phase, "dev_score")
    inside = int(plateau.in_window(place, start, rule.window).sum()) if len(place) else 0
    if len(values) < rule.min_evaluations or inside < rule.window_evaluations:
        return "few", f"{len(values)} evaluations, {inside} in the last {rule.window:.0%} of its budget"
    noise = plateau.weighted_noise(rows, plateau.score_weights(tasks), rule.noise)
    t = plateau.trend(place, values, start, rule.window, noise, rule.fit)
    said = plateau.movement(t, rule.tolerance)
    why = f"dev_score {t.gain:+.4f} ± {t.se:.4f} a window (tolerance {rule.tolerance:g})"
    if said != "flat":
        return ("rising" if said == "up" else "unclear"), why
    for task in tasks if len(tasks) > 1 else ():
        place, values, start = phase_curve(history, phase, f"dev_{task}_{TASKS[task].metric}")
        t = plateau.trend(place, values, start, rule.window, plateau.weighted_noise(rows, {task: 1.0}, rule.noise),
                          rule.fit)
        if t is not None and plateau.movement(t, rule.tolerance) == "up":
            return "rising", f"{why}; {task} still rising ({t.gain:+.4f} ± {t.se:.4f} a window)"
    return "flat", why


def phase_stops(history: list[dict]) -> list[dict]:
    """How each phase of a run that stops at its plateau ended: [{phase, stopped, epoch, update}]."""
    return [{k: r[k] for k in ("phase", "stopped", "epoch", "update")} for r in history if r.get("stopped")]


def plateau_stop(tr, state, tasks: list[str], row: dict) -> None:
    """After an evaluation (`row`, the last of `state.history`): the rule's reading of the phase into
    the row, and the phase ended (`state.stopped`) where it reads flat. `tasks`: those the selection
    score averages. Main rank only, as the evaluation."""
    rule = tr.cfg.until_plateau
    if not rule.enabled:
        return
    unset = [f.name for f in dataclasses.fields(rule) if getattr(rule, f.name) is None]
    if unset:
        raise MinBertError(f"finetune.until_plateau.{unset[0]} is not set: load the params with "
                           f"minbert.params.load_params, which takes the keys left unset from report.training_check")
    rows = {t: len(tr.dev[t]) if t in tr.dev else 0 for t in tasks}
    said, why = reading(state.history, row["phase"], tasks, rows, rule)
    row["plateau"] = said
    if said == "flat":
        row["stopped"] = "plateau"
        state.stopped = True
        log.info("at its plateau: %s; %s", why, "this task's phase ends" if len(tr.cfg.tasks) > len(tasks)
                 else "training ends")


def mark_cap(cfg, state, phase: str) -> None:
    """At a phase's end: where it stops at its plateau and did not, its last evaluation says it ran to its
    cap (`stopped: cap`)."""
    last = state.history[-1] if state.history else None
    if cfg.until_plateau.enabled and last is not None and last["phase"] == phase and not last.get("stopped"):
        last["stopped"] = "cap"
