"""The training check: whether a claim's row trained, so that its verdict judges the paper's method
and not a run cut short (docs/report.md, "The training check").

A row trained, for a claim, when every seed's every training stage passes:
- a pretraining (masked LM, NLI, paraphrase-first) on its own dev loss: it moved (its best dev loss
  is clearly below the starting model's) and its curve flattened;
- fine-tuning and head re-training, phase by phase (sequential fine-tuning trains one task after
  another), on the dev selection score and on the claim's own column wherever the phase trains
  it: each curve rose clearly above what a constant prediction scores and flattened.

A curve has flattened when its best over the last `window` of its learning-rate budget is at most a
tolerance above its best before. The budget is the sum of the learning rate over the updates (the
distance a gradient method can travel), not the count of updates: a schedule that decays to 0 spends
a quarter of its budget in about its last half of updates, so a curve cannot pass because its rate
fell, only because it stopped rising per unit of learning. The tolerance is tied to the claim: a
share of the paper's effect (of the margin, for a no-effect or no-gain claim), between a floor and a
cap, so a row still gaining a good part of the effect claimed cannot carry a verdict on it.

A fine-tuned row that rose above chance but is still rising counts as trained on a claim only where a
frozen-encoder reference answers the claim: the claim's other row is that frozen row (and the row
beats it significantly, so more training cannot undo the finding), or a frozen run with the same
heads, which the row beats significantly on the claim's column (its fine-tuning, not its heads, made
the difference). A pretraining that did not move, a curve at chance or too few evaluations are never
excused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.metrics import selection_score, summarise
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS
from minbert.report.formats import fmt_delta, fmt_interval, fmt_metric
from minbert.report.scores import ScoreBook
from minbert.train.optim import lr_at

COMBINED = ("overall", "mean")                  # the columns that combine the leaderboard's tasks
NOMINAL_STEPS = 1000                            # updates per epoch to draw a pretraining's schedule on


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
    last_gain: float | None = None
    best: float | None = None
    chance: float | None = None
    at_chance: bool = False                     # learned nothing (or a pretraining did not move): never excused
    rising: bool = False                        # failed only by still rising: a reference may answer the claim


@dataclass
class ClaimCheck:
    """What the check reads for one claim: its column (metrics key and name), the tolerance tied to
    its size, and for each of its rows the frozen run that may answer it (`references`)."""
    key: str
    column: str
    tolerance: float
    split: str = "dev"
    references: dict = field(default_factory=dict)   # row -> (frozen run, why it answers the claim)
    printed: dict = field(default_factory=dict)      # row -> the paper's own value of it on the claim's column


@dataclass
class RowCheck:
    """A claim's row (a run, a repeated experiment's seeds, an ensemble's members)."""
    name: str
    curves: list = field(default_factory=list)  # CurveCheck
    reference: str = ""                         # how a frozen-encoder reference answered the claim, where it did

    @property
    def trained(self) -> bool:
        return bool(self.curves) and (all(c.trained for c in self.curves) or bool(self.reference))

    @property
    def failing(self) -> list[CurveCheck]:
        return [c for c in self.curves if not c.trained]

    @property
    def evidence(self) -> str:
        """What the page says of the row: the first curve that did not pass, or that all did."""
        failing = self.failing
        if not self.curves:
            return f"{self.name}: no training history to check"
        if not failing:
            return f"{self.name}: trained ({len(self.curves)} curve{'s' if len(self.curves) != 1 else ''} passed)"
        text = self._first_failure(lambda c: c.why)
        return f"{text}; {self.reference}" if self.reference else text

    @property
    def short(self) -> str:
        """One line: the run, the stage and the curve that failed first, and how."""
        failing = self.failing
        if not self.curves:
            return f"{self.name}: no history"
        if not failing:
            return f"{self.name}: trained"
        return self._first_failure(lambda c: c.brief or c.why)

    def _first_failure(self, how) -> str:
        """The run, stage, phase and curve of the first failing curve, `how(curve)` it failed, and
        how many more failed."""
        failing = self.failing
        c = failing[0]
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        phase = f" {c.phase}" if c.phase and c.stage != "pretrain" else ""
        return f"{c.run} {c.stage.replace('_', ' ')}{phase}, {c.curve}: {how(c)}{more}"


def claim_tolerance(cfg, size: float | None) -> float:
    """The largest last gain a curve of a claim's row may have: `share` of the claim's size (the
    paper's effect, or the claim's margin), at least `min_tolerance` (below it dev noise decides),
    at most `tolerance`; the cap where the paper states no size."""
    if size is None:
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


# ------------------------------------------------------------------ the learning-rate budget

@lru_cache(maxsize=256)
def _budget(total: int, warmup: int, schedule: str) -> np.ndarray:
    """The learning rate summed over the first k updates, k = 0..total, for a peak rate of 1."""
    rates = np.array([lr_at(k, total, 1.0, warmup, schedule) for k in range(total)], dtype=float)
    return np.concatenate([[0.0], np.cumsum(rates)])


def budget_at(updates: np.ndarray, warmup_ratio: float, schedule: str) -> np.ndarray:
    """The learning-rate budget spent after each of `updates` (counted from the run's start; the
    run's last is its end), on the run's schedule (minbert.train.optim.lr_at)."""
    total = int(max(updates.max(), 1))
    return _budget(total, int(warmup_ratio * total), schedule)[np.clip(updates.astype(int), 0, total)]


def positions(history: pd.DataFrame, warmup_ratio: float, schedule: str) -> np.ndarray:
    """Each evaluation's place in the run's learning-rate budget: from its `update` column on the
    run's schedule; from its `epoch` column (a constant rate) where it records no updates."""
    if "update" in history.columns and history["update"].notna().all():
        return budget_at(history["update"].to_numpy(float), warmup_ratio, schedule)
    return history["epoch"].to_numpy(float)


# ------------------------------------------------------------------ one curve

def plateau(check: CurveCheck, values: np.ndarray, place: np.ndarray, start: float, cfg, tolerance: float,
            lower: bool = False) -> CurveCheck:
    """Whether a curve (`values` at budget `place`, its phase starting at `start`) flattened: its best
    over the last `cfg.window` of the phase's budget at most `tolerance` above its best before
    (`lower`: a loss, which falls). Fills and returns `check`."""
    span = place[-1] - start            # the evaluations made within the window: after its start
    window = place > place[-1] - cfg.window * span + 1e-9 * span if span > 0 else \
        np.arange(len(values)) >= len(values) - 1
    inside, before = values[window], values[~window]
    if len(inside) < cfg.window_evaluations or not len(before):
        check.brief = f"{int(window.sum())} evaluations in its last {cfg.window:.0%}, too few"
        check.why = (f"{int(window.sum())} of its {len(values)} evaluations in the last "
                     f"{cfg.window:.0%} of its learning-rate budget, too few to show whether it flattened (at least "
                     f"{cfg.window_evaluations} and one before: raise evals_per_epoch)")
        return check
    best = (lambda v: -np.min(v)) if lower else np.max
    check.last_gain = float(best(inside) - best(before))
    where = f"its last {cfg.window:.0%} of learning-rate budget ({len(inside)} of {len(values)} evaluations)"
    gain, limit = side_by_side(check.last_gain, tolerance)
    moved = f"lowered it by {gain.lstrip('+')}" if lower else f"gained {gain}"     # a loss's drop, unsigned
    if check.last_gain > tolerance:
        check.rising = True
        check.brief = f"still {'falling' if lower else 'rising'} ({gain} > {limit})"
        check.why = f"still {'falling' if lower else 'rising'}: {where} {moved} (more than {limit})"
        return check
    check.trained = True
    check.why = f"flattened: {where} {moved} (at most {limit})"
    return check


def side_by_side(gain: float, tolerance: float) -> tuple[str, str]:
    """A gain and the tolerance it is held to as the page prints them: with digits enough that the
    printed numbers compare as the numbers do ('+0.0104' against '0.0100', never '+0.010' against
    '0.01' for a gain above it)."""
    digits = 3
    while digits < 7 and round(gain, digits) == round(tolerance, digits) and gain != tolerance:
        digits += 1
    return fmt_delta(gain, digits), (f"{tolerance:.3g}" if digits == 3 else f"{tolerance:.{digits}f}")


def score_curve(check: CurveCheck, values: np.ndarray, place: np.ndarray, start: float, cfg, tolerance: float,
                printed: float | None = None) -> CurveCheck:
    """A curve of dev scores: evaluations enough, above chance (`check.chance`, what a constant
    prediction scores there; None where unknown), flattened. `printed`: the paper's own
    value of the row on this curve's column; where it is at chance too, a curve at chance reproduces
    the paper's row rather than failing to learn, and is held to flattening alone."""
    keep = np.isfinite(values)
    values, place = values[keep], place[keep]
    check.evaluations = len(values)
    if len(values) < cfg.min_evaluations:
        check.brief = f"{len(values)} evaluation{'s' if len(values) != 1 else ''}, too few"
        check.why = (f"{len(values)} dev evaluation{'s' if len(values) != 1 else ''}, too few to show whether it "
                     f"flattened (at least {cfg.min_evaluations}: raise evals_per_epoch)")
        return check
    check.best, chance = float(values.max()), check.chance
    if chance is not None and check.best < chance + cfg.above_chance:
        if printed is not None and printed < chance + cfg.above_chance:
            check = plateau(check, values, place, start, cfg, tolerance)
            check.why += (f"; at chance ({fmt_metric(check.best)} against {fmt_metric(chance)}) as the paper's "
                          f"own row is ({fmt_metric(printed)})")
            return check
        check.at_chance = True
        check.brief = f"at chance ({fmt_metric(check.best)} against {fmt_metric(chance)})"
        check.why = (f"flat at chance: its best {fmt_metric(check.best)} against {fmt_metric(chance)} for a "
                     f"constant prediction")
        return check
    return plateau(check, values, place, start, cfg, tolerance)


def stage_checks(run, stage: str, history: pd.DataFrame, schedule: tuple[float, str], cfg,
                 claim: ClaimCheck, printed: float | None = None) -> list[CurveCheck]:
    """Each phase of a fine-tuning or head re-training history: its selection score, and the claim's
    column where the phase trains the column's tasks (and it is not the selection score itself);
    `printed`: the paper's value of the row on that column (score_curve)."""
    if "dev_score" not in history.columns or history.empty:
        return [CurveCheck(run.name, stage, "", False, "its history has no dev scores")]
    phases = history["phase"].astype(str) if "phase" in history.columns else pd.Series([""] * len(history))
    place = positions(history, *schedule)
    out, start = [], 0.0
    for phase in dict.fromkeys(phases):
        rows = (phases == phase).to_numpy()
        tasks = [t for t in phase.split("+") if t]
        out.append(score_curve(CurveCheck(run.name, stage, phase, False, "", chance=chance_score(run, tasks)),
                               history["dev_score"].to_numpy(float)[rows], place[rows], start, cfg, claim.tolerance))
        needs = column_tasks(claim.key)
        values = column_values(history, claim.key)
        if values is not None and needs and set(needs) <= set(tasks) and tasks != needs:
            out.append(score_curve(CurveCheck(run.name, stage, phase, False, "", curve=f"{claim.split} {claim.column}",
                                              chance=column_chance(run, claim.key)),
                                   values[rows], place[rows], start, cfg, claim.tolerance, printed))
        start = float(place[rows][-1])
    return out


def pretrain_check(run, history: pd.DataFrame, settings, cfg) -> CurveCheck:
    """A pretraining's own dev loss (history.csv, with the starting model's from its metrics.json):
    it moved by at least `pretrain_min_drop` of the starting loss, and flattened, its last drop at
    most `pretrain_share` of its whole drop. `settings`: the pretraining's (kind, epochs, schedule)."""
    kind = getattr(settings, "kind", "")
    check = CurveCheck(run.name, "pretrain", kind, False, "", curve="dev loss")
    loss = history["dev_loss"].to_numpy(float) if "dev_loss" in history.columns else np.array([])
    before = (run.pretrain_metrics or {}).get("dev_loss_before")
    keep = np.isfinite(loss)
    check.evaluations = int(keep.sum())
    if before is None or not np.isfinite(before) or not keep.any():
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
    epochs = float(getattr(settings, "epochs", 1) or 1)
    steps = np.round(history["epoch"].to_numpy(float)[keep] / epochs * epochs * NOMINAL_STEPS)
    budget = budget_at(np.concatenate([[0.0], steps, [epochs * NOMINAL_STEPS]]),
                       getattr(settings, "warmup_ratio", 0.0), getattr(settings, "lr_schedule", "constant"))
    place = budget[:-1]                             # the start (the loss before), then each evaluation
    return plateau(check, np.concatenate([[float(before)], loss[keep]]), place, 0.0, cfg,
                   cfg.pretrain_share * drop, lower=True)


# ------------------------------------------------------------------ a claim's row

def runs_of(name: str, book: ScoreBook) -> list[str]:
    """The experiment runs behind a row: itself, a repeated experiment's seeds, an ensemble's members."""
    ensembles = book.data.params.params.ensembles       # their members are runs (seeds expanded)
    if name in ensembles:
        return [m for m in ensembles[name].members if m in book.data.runs]
    return [m for m in book.members(name) if m in book.data.runs]


def stage_schedule(exp, stage: str) -> tuple[float, str]:
    """(warm-up share, schedule) of a run's fine-tuning or head re-training (both follow finetune's)."""
    ft = getattr(exp, "finetune", None)
    return (getattr(ft, "warmup_ratio", 0.0), getattr(ft, "lr_schedule", "constant")) if ft else (0.0, "constant")


def pretraining_of(exp, book: ScoreBook):
    name = getattr(exp, "pretrain", None)
    return book.data.params.params.pretrainings.get(name) if name else None


def row_check(name: str, book: ScoreBook, cfg, claim: ClaimCheck) -> RowCheck:
    """Whether the row `name` trained, for the claim `claim`: every curve of every stage of every run,
    and where only "still rising" failed, the claim's reference for the row (`claim.references`)."""
    check = RowCheck(name)
    experiments = book.data.params.experiments
    for run_name in runs_of(name, book):
        run, exp = book.data.runs[run_name], experiments.get(run_name)
        for stage, history in run.histories.items():
            if stage == "pretrain":
                check.curves.append(pretrain_check(run, history, pretraining_of(exp, book), cfg))
            else:
                check.curves += stage_checks(run, stage, history, stage_schedule(exp, stage), cfg, claim,
                                             claim.printed.get(name))
    failing = check.failing
    reference = claim.references.get(name)
    if failing and reference and all(c.rising and c.stage != "pretrain" for c in failing):
        check.reference = beats_reference(name, *reference, claim, book)
    return check


def fine_tuned(name: str, book: ScoreBook) -> bool:
    """Every run of the row fine-tunes its encoder."""
    experiments = book.data.params.experiments
    runs = runs_of(name, book)
    return bool(runs) and all(r in experiments and not experiments[r].finetune.freeze_encoder for r in runs)


def beats_reference(name: str, reference: str, why: str, claim: ClaimCheck, book: ScoreBook) -> str:
    """How the row beats the frozen reference on the claim's column (its paired difference, interval
    above 0), or "" where it does not."""
    try:
        est = book.difference(name, reference, claim.split, claim.key)
    except MinBertError:
        return ""
    if est is None:
        return ""
    iv = est.interval(book.confidence)
    if iv.low <= 0:
        return ""
    return (f"but it beats {reference} ({why}) on {claim.split} {claim.column} by {fmt_delta(est.value)} "
            f"{fmt_interval(iv, signed=True)}, so it counts as trained for this claim")
