"""The training check: whether a claim's rows trained, so that its verdict judges the paper's method
and not a run cut short (docs/report.md, "The training check").

A row trained, for a claim, when every curve of every training stage it depends on has settled:
- a pretraining (masked LM, NLI, paraphrase-first), and the pretraining it started from, on its own
  dev loss: it moved (its best dev loss clearly below the starting model's) and flattened;
- fine-tuning and head re-training, phase by phase (sequential fine-tuning trains one task after
  another), on the dev selection score, and on the claim's own column in every phase from the first
  that trains it on (a column that falls while a later phase trains another task is moving too);
- the same for a distilled row's teacher, and for every cell of a `best_of` row (a cell still rising
  could overtake the one chosen).
Each score curve must rise clearly above what a constant prediction scores and have settled at the
noise of its evaluations (minbert.train.plateau: its trend over the last `window` of its learning-rate
budget, with its standard error from the rows scored, against the claim's tolerance). A history that
should be there and is not fails the row.

The budget is the learning rate summed over the updates (the distance a gradient method can travel),
not the count of updates: a curve cannot pass because its rate fell, only because it stopped moving
per unit of learning. A history carries it (`lr_budget`, each phase on its own schedule); an older one
is placed on the run's schedule in closed form from its `update` column.

A fine-tuned row still rising may count as trained only where it is the row the claim finds better,
the claim reads reproduced, and a frozen-encoder reference that itself trained answers it: the claim's
other row, or the table's reference with the same heads, which the row beats significantly on the
claim's column (more training could only widen its lead). Where the noise cannot tell whether a curve
settled, the row is unclear, and the claim inconclusive (minbert.report.settled reads the pair).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from minbert.core.metrics import selection_score, summarise
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS
from minbert.report.formats import fmt_delta, fmt_metric
from minbert.train import plateau as rule

COMBINED = ("overall", "mean")                  # the columns that combine the leaderboard's tasks
NOMINAL_STEPS = 1000                            # updates per epoch to place an older pretraining's history on


@dataclass
class CurveCheck:
    """One curve of one phase of one training stage of one run."""
    run: str
    stage: str                                  # pretrain | finetune | retrain_heads
    phase: str                                  # the tasks it trained, joined by "+" (a pretraining: its kind)
    trained: bool
    why: str                                    # in words, with the numbers
    brief: str = ""                             # the same in a few words (the claims table's line)
    curve: str = "selection score"              # what it reads: the selection score, a column, the dev loss
    evaluations: int = 0
    last_gain: float | None = None              # the trend: its change over one more window
    best: float | None = None
    chance: float | None = None
    at_chance: bool = False                     # learned nothing (or a pretraining did not move): never excused
    rising: bool = False                        # failed only by still rising: a reference may answer the claim
    unclear: bool = False                       # the evaluations' noise cannot tell whether it settled
    trend: rule.Trend | None = None
    noise: float | None = None                  # the sd of one of its evaluations (None: unknown)
    column: bool = False                        # it reads the claim's column (the selection score where they agree)
    own: bool = True                            # a curve of the row's own runs (not a teacher's, a cell's)


@dataclass
class ClaimCheck:
    """What the check reads for one claim: its column (metrics key and name), the tolerance of each
    row's curves and the bounds of the pair's move (minbert.report.settled), and for each of its rows
    the frozen run that may answer it (`references`)."""
    key: str
    column: str
    tolerance: float
    split: str = "dev"
    references: dict = field(default_factory=dict)   # row -> (frozen run, why it answers the claim)
    printed: dict = field(default_factory=dict)      # row -> the paper's own value of it on the claim's column
    up: float = math.inf                             # the pair's move that would change the verdict: above,
    down: float = math.inf                           # and below


@dataclass
class RowCheck:
    """A claim's row (a run, a repeated experiment's seeds, an ensemble's members)."""
    name: str
    curves: list = field(default_factory=list)  # CurveCheck
    reference: str = ""                         # how a frozen-encoder reference answered the claim, where it did
    finals: list = field(default_factory=list)  # each own run's last curve on the claim's column (a Trend or None)

    @property
    def status(self) -> str:
        """trained | unclear (the noise cannot tell) | undertrained."""
        failing = self.failing
        if not self.curves:
            return "undertrained"
        if not failing or self.reference:
            return "trained"
        return "unclear" if all(c.unclear for c in failing) else "undertrained"

    @property
    def trained(self) -> bool:
        return self.status == "trained"

    @property
    def failing(self) -> list[CurveCheck]:
        return [c for c in self.curves if not c.trained]

    @property
    def evidence(self) -> str:
        """What the page says of the row: the first curve that did not pass, or that all did."""
        if not self.curves:
            return f"{self.name}: no training history to check"
        if not self.failing:
            return f"{self.name}: trained ({len(self.curves)} curve{'s' if len(self.curves) != 1 else ''} passed)"
        text = self._first_failure(lambda c: c.why)
        return f"{text}; {self.reference}" if self.reference else text

    @property
    def short(self) -> str:
        """One line: the run, the stage and the curve that failed first, and how."""
        if not self.curves:
            return f"{self.name}: no history"
        if not self.failing:
            return f"{self.name}: trained"
        return self._first_failure(lambda c: c.brief or c.why)

    def _first_failure(self, how) -> str:
        """The run, stage, phase and curve of the first failing curve (one that is not merely unclear
        first), `how(curve)` it failed, and how many more failed."""
        failing = sorted(self.failing, key=lambda c: c.unclear)
        c = failing[0]
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        phase = f" {c.phase}" if c.phase and c.stage != "pretrain" else ""
        return f"{c.run} {c.stage.replace('_', ' ')}{phase}, {c.curve}: {how(c)}{more}"


def claim_tolerance(cfg, size: float | None) -> float:
    """`share` of a size (the paper's effect, ours, the margin, our interval's distance from the verdict's
    boundary), at least `min_tolerance`, at most `tolerance`; the cap where there is no size."""
    if size is None or not math.isfinite(size):
        return cfg.tolerance
    return float(min(cfg.tolerance, max(cfg.min_tolerance, cfg.share * abs(size))))


# ------------------------------------------------------------------ chance

def chance_metrics(run, tasks) -> dict | None:
    """The metrics of a constant prediction on the run's labelled dev rows: the majority class's
    share for a classification, a correlation of 0 for a regression; None without them."""
    out = {}
    for task in tasks:
        if task not in TASKS:
            return None
        frame = run.labelled(task, "dev")
        if frame is None:
            return None
        out[TASKS[task].metric_key] = 0.0 if TASKS[task].kind == "regression" else \
            float(frame["label"].value_counts(normalize=True).max())
    return out


def chance_score(run, tasks: list[str]) -> float | None:
    """The selection score of a constant prediction on the run's dev rows (`chance_metrics`)."""
    metrics = chance_metrics(run, tasks)
    return None if metrics is None else selection_score(metrics, tasks)


def column_tasks(key: str) -> list[str]:
    """The tasks a column reads: the leaderboard's for an overall, else its task."""
    return list(LEADERBOARD_TASKS) if key in COMBINED else [t for t in TASKS if TASKS[t].metric_key == key]


def column_chance(run, key: str) -> float | None:
    metrics = chance_metrics(run, column_tasks(key))
    return None if metrics is None else summarise(metrics).get(key)


def column_values(history: pd.DataFrame, key: str) -> np.ndarray | None:
    """The claim column's dev value at each evaluation of a history (None where it does not hold it)."""
    if key == "mean":
        cols = [f"dev_{TASKS[t].metric_key}" for t in LEADERBOARD_TASKS]
        return history[cols].mean(axis=1, skipna=False).to_numpy(float) if all(c in history for c in cols) else None
    col = f"dev_{key}"
    return history[col].to_numpy(float) if col in history.columns else None


# ------------------------------------------------------------------ the evaluations' noise

def column_weights(key: str) -> dict[str, float]:
    """How much each task's metric weighs in a claim column."""
    tasks = column_tasks(key)
    if key == "overall":
        return rule.score_weights(tasks)
    return {t: 1.0 / len(tasks) for t in tasks}


def score_noise(run, weights: dict[str, float], cfg, dev_size: int | None) -> float | None:
    """The sd of one evaluation of a score (its tasks' metrics, weighted) on the dev rows the run's
    training scored (`dev_size` of its dev set, the whole set without it): from each task's measured
    change between evaluations (`cfg.noise`, by the task's kind: minbert.train.plateau.weighted_noise).
    None where a task's rows are unknown."""
    rows = {}
    for task in weights:
        frame = run.labelled(task, "dev")
        known = [x for x in (dev_size, None if frame is None else len(frame)) if x]
        if not known:
            return None
        rows[task] = min(known)
    return rule.weighted_noise(rows, weights, cfg.noise)


# ------------------------------------------------------------------ the learning-rate budget

def budget_at(updates: np.ndarray, warmup_ratio: float, schedule: str) -> np.ndarray:
    """The learning-rate budget spent after each of `updates` (counted from the run's start; the
    run's last is its end), on one schedule over the run (minbert.train.optim.lr_at), in closed form."""
    updates = np.asarray(updates, dtype=float)
    total = float(max(np.nanmax(updates) if len(updates) else 1.0, 1.0))
    return rule.lr_budget(np.clip(updates, 0, total), int(total), int(warmup_ratio * total), schedule)


def positions(history: pd.DataFrame, warmup_ratio: float, schedule: str) -> np.ndarray:
    """Each evaluation's place in the run's learning-rate budget: its `lr_budget` column (the loop
    sums each phase's own rates); else from its `update` column on the run's one schedule (the
    histories written before); from its `epoch` column (a constant rate) where it records neither."""
    for col in ("lr_budget", "update"):
        if col in history.columns and history[col].notna().all():
            values = history[col].to_numpy(float)
            return values if col == "lr_budget" else budget_at(values, warmup_ratio, schedule)
    return history["epoch"].to_numpy(float)


# ------------------------------------------------------------------ one curve

def plateau(check: CurveCheck, values: np.ndarray, place: np.ndarray, start: float, cfg, bounds: tuple[float, float],
            lower: bool = False) -> CurveCheck:
    """Whether a curve (`values` at budget `place`, its phase starting at `start`) settled: one more
    `cfg.window` of its budget could not move it more than `bounds` (up, down: math.inf where that way
    does not count; a loss, `lower`: its drop is read as a gain), at its evaluations' noise
    (`check.noise`, minbert.train.plateau). Fills and returns `check`."""
    (up, down), noise, sign = bounds, check.noise or 0.0, -1.0 if lower else 1.0
    t = rule.trend(place, sign * values, start, cfg.window, noise, cfg.fit)
    inside = int(rule.in_window(place, start, cfg.window).sum())
    reach = int(rule.in_window(place, start, max(cfg.fit, cfg.window)).sum())
    if t is None or inside < cfg.window_evaluations:
        check.brief = f"{inside} evaluations in its last {cfg.window:.0%}, too few"
        check.why = (f"{inside} of its {len(values)} evaluations in the last {cfg.window:.0%} of its learning-rate "
                     f"budget, too few to show whether it settled (at least {cfg.window_evaluations}, and two in all "
                     f"over its last {max(cfg.fit, cfg.window):.0%}: raise evals_per_epoch)")
        return check
    check.trend, check.last_gain = t, t.gain
    moved = rule.movement(t, up, down)
    bound = down if moved == "down" or not math.isfinite(up) else up
    gain, limit = side_by_side(t.gain, bound)
    where = (f"its trend a window ({cfg.window:.0%} of its learning-rate budget), fitted over its last "
             f"{max(cfg.fit, cfg.window):.0%} ({reach} of {len(values)} evaluations"
             f"{' and the one before' if t.fitted > reach else ''})")
    said = (f"lowers it by {gain.lstrip('+')}" if lower else gain) + " a window" + (f" ± {t.se:.3f}" if t.se else "")
    word = {"up": "falling" if lower else "rising", "down": "rising" if lower else "falling"}.get(moved)
    if word:
        check.rising = moved == "up"
        check.brief = f"still {word} ({gain} > {limit})" if moved == "up" else f"still {word} ({gain} < -{limit})"
        check.why = f"still {word}: {where} {said} (more than {limit})"
        return check
    if moved == "unclear":
        check.unclear = True
        check.brief = f"cannot tell ({gain} ± {t.se:.3f} against {limit})"
        check.why = (f"cannot tell at its evaluations' noise (sd {noise:.4f} an evaluation): {where} {said}, against "
                     f"{limit}; telling needs a standard error of {bound / rule.Z_TWO_SIDED:.4f} or less (more "
                     f"evaluations in the window, or more dev rows each)")
        return check
    check.trained = True
    check.why = f"settled: {where} {said} (within {limit})"
    return check


def side_by_side(gain: float, tolerance: float) -> tuple[str, str]:
    """A gain and the tolerance it is held to as the page prints them: with digits enough that the
    printed numbers compare as the numbers do ('+0.0104' against '0.0100', never '+0.010' against
    '0.01' for a gain above it)."""
    digits = 3
    while digits < 7 and round(gain, digits) == round(tolerance, digits) and gain != tolerance:
        digits += 1
    return fmt_delta(gain, digits), (f"{tolerance:.3g}" if digits == 3 else f"{tolerance:.{digits}f}")
def score_curve(check: CurveCheck, values: np.ndarray, place: np.ndarray, start: float, cfg,
                bounds: tuple[float, float], printed: float | None = None) -> CurveCheck:
    """A curve of dev scores: evaluations enough, above chance (`check.chance`, what a constant
    prediction scores there; None where unknown), settled within `bounds` (up, down) at its
    evaluations' noise (`check.noise`; None: unknown, so it cannot tell). `printed`: the paper's own value of the
    row on this curve's column; where it is at chance too, a curve at chance reproduces the paper's
    row rather than failing to learn, and is held to settling alone."""
    keep = np.isfinite(values)
    values, place = values[keep], place[keep]
    check.evaluations = len(values)
    if len(values) < cfg.min_evaluations:
        check.brief = f"{len(values)} evaluation{'s' if len(values) != 1 else ''}, too few"
        check.why = (f"{len(values)} dev evaluation{'s' if len(values) != 1 else ''}, too few to show whether it "
                     f"settled (at least {cfg.min_evaluations}: raise evals_per_epoch)")
        return check
    if check.noise is None:
        check.unclear = True
        check.brief = "no dev rows to tell its noise"
        check.why = "no dev predictions to tell how many rows its evaluations scored, hence their noise"
        return check
    check.best, chance = float(values.max()), check.chance
    if chance is not None and check.best < chance + cfg.above_chance:
        if printed is not None and printed < chance + cfg.above_chance:
            check = plateau(check, values, place, start, cfg, bounds)
            check.why += (f"; at chance ({fmt_metric(check.best)} against {fmt_metric(chance)}) as the paper's "
                          f"own row is ({fmt_metric(printed)})")
            return check
        check.at_chance = True
        check.brief = f"at chance ({fmt_metric(check.best)} against {fmt_metric(chance)})"
        check.why = (f"flat at chance: its best {fmt_metric(check.best)} against {fmt_metric(chance)} for a "
                     f"constant prediction")
        return check
    return plateau(check, values, place, start, cfg, bounds)


def stage_schedule(exp) -> tuple[float, str]:
    """(warm-up share, schedule) of a run's fine-tuning or head re-training (both follow finetune's),
    for a history that records no `lr_budget`."""
    ft = getattr(exp, "finetune", None)
    return (getattr(ft, "warmup_ratio", 0.0), getattr(ft, "lr_schedule", "constant")) if ft else (0.0, "constant")


def stage_checks(run, stage: str, history: pd.DataFrame, exp, cfg, claim: ClaimCheck,
                 printed: float | None = None) -> list[CurveCheck]:
    """Each phase of a fine-tuning or head re-training history (`exp`: the run's experiment settings:
    its schedule, the dev rows its evaluations scored): its selection score (settled against a rise: a
    fall is a model past its best, and the best is kept), and the claim's column both ways in every
    phase from the one by which all its tasks have trained on (a later phase that trains another task
    may make it forget; where it is not the selection score itself); `printed`: the paper's value of
    the row on that column (score_curve)."""
    if "dev_score" not in history.columns or history.empty:
        return [CurveCheck(run.name, stage, "", False, "its history has no dev scores", brief="no dev scores")]
    phases = history["phase"].astype(str) if "phase" in history.columns else pd.Series([""] * len(history))
    place, dev_size = positions(history, *stage_schedule(exp)), getattr(getattr(exp, "finetune", None), "dev_size",
                                                                        None)
    needs, values = column_tasks(claim.key), column_values(history, claim.key)
    out, start, trained = [], 0.0, set()
    for phase in dict.fromkeys(phases):
        rows = (phases == phase).to_numpy()
        tasks = [t for t in phase.split("+") if t] or list(needs)
        trained |= set(tasks)
        same = set(needs) == set(tasks)             # the selection score is the column
        check = CurveCheck(run.name, stage, phase, False, "", chance=chance_score(run, tasks), column=same,
                           noise=score_noise(run, rule.score_weights(tasks), cfg, dev_size))
        out.append(with_stop(score_curve(check, history["dev_score"].to_numpy(float)[rows], place[rows], start, cfg,
                                         (claim.tolerance, math.inf)), history[rows]))
        if values is not None and set(needs) <= trained and not same and np.isfinite(values[rows]).any():
            check = CurveCheck(run.name, stage, phase, False, "", curve=f"{claim.split} {claim.column}",
                               chance=column_chance(run, claim.key), column=True,
                               noise=score_noise(run, column_weights(claim.key), cfg, dev_size))
            out.append(score_curve(check, values[rows], place[rows], start, cfg, (claim.tolerance, claim.tolerance),
                                   printed))
        start = float(place[rows][-1])
    return out


def with_stop(check: CurveCheck, rows: pd.DataFrame) -> CurveCheck:
    """`check` with what the run's loop said of the phase's end, where it stops at its plateau
    (finetune.until_plateau: history.csv's `stopped` on the phase's last evaluation, `plateau` or `cap`)."""
    said = rows["stopped"].dropna() if "stopped" in rows.columns else pd.Series([], dtype=object)
    if said.empty:
        return check
    epoch = float(rows["epoch"].iloc[-1])
    if said.iloc[-1] == "plateau":
        check.why += f"; the run stopped this phase at its plateau (epoch {epoch:g})"
    else:
        check.why += f"; the run trained this phase to its cap (epoch {epoch:g}) without reading it flat"
        check.brief += ", at its cap" if check.brief else ""
    return check


def pretrain_check(run, history: pd.DataFrame, settings, cfg) -> CurveCheck:
    """A pretraining's own dev loss (history.csv, with the starting model's from its metrics.json):
    it moved by at least `pretrain_min_drop` of the starting loss, and flattened, the trend of its last
    window dropping it by at most `pretrain_share` of its whole drop. `settings`: the pretraining's
    (kind, epochs, schedule). `run`: what holds its name and metrics."""
    kind = getattr(settings, "kind", "")
    check = CurveCheck(run.name, "pretrain", kind, False, "", curve="dev loss")
    loss = history["dev_loss"].to_numpy(float) if "dev_loss" in history.columns else np.array([])
    before = (run.pretrain_metrics or {}).get("dev_loss_before")
    keep = np.isfinite(loss)
    check.evaluations = int(keep.sum())
    if before is None or not np.isfinite(before) or not keep.any():
        check.brief = "no dev loss before and after it"
        check.why = "no dev loss before and after it to tell whether it moved"
        return check
    best = float(loss[keep].min())
    check.best, drop = best, float(before) - best
    if drop < cfg.pretrain_min_drop * abs(float(before)):
        check.at_chance = True
        check.brief = f"did not move ({-drop / abs(float(before)):+.1%})"
        check.why = (f"did not move: its dev loss went from {float(before):.4g} to at best {best:.4g} "
                     f"({-drop / abs(float(before)):+.1%}; it needs to fall by {cfg.pretrain_min_drop:.0%})")
        return check
    if check.evaluations < cfg.min_evaluations:
        check.brief = f"{check.evaluations} evaluation{'s' if check.evaluations != 1 else ''}, too few"
        check.why = (f"{check.evaluations} dev evaluation{'s' if check.evaluations != 1 else ''}, too few to show "
                     f"whether its loss flattened (at least {cfg.min_evaluations}: raise its evals_per_epoch)")
        return check
    place = pretrain_positions(history, settings)[keep]
    return plateau(check, np.concatenate([[float(before)], loss[keep]]), np.concatenate([[0.0], place]), 0.0, cfg,
                   (cfg.pretrain_share * drop, math.inf), lower=True)


def pretrain_positions(history: pd.DataFrame, settings) -> np.ndarray:
    """A pretraining's evaluations in its learning-rate budget: its `lr_budget` column, else its
    `epoch` column placed on its schedule over a nominal number of updates an epoch."""
    if "lr_budget" in history.columns and history["lr_budget"].notna().all():
        return history["lr_budget"].to_numpy(float)
    epochs = float(getattr(settings, "epochs", 1) or 1)
    steps = np.round(history["epoch"].to_numpy(float) * NOMINAL_STEPS)
    total = epochs * NOMINAL_STEPS
    warmup = int(getattr(settings, "warmup_ratio", 0.0) * total)
    return rule.lr_budget(np.clip(steps, 0, total), int(total), warmup, getattr(settings, "lr_schedule", "constant"))
