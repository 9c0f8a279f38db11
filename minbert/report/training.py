"""The training check: whether a claim's row trained, so that its verdict judges the paper's method
and not a run cut short (docs/report.md, "The training check").

A row trained when, for every seed, every training stage (fine-tuning, head re-training) and every
phase of it (sequential fine-tuning trains one task after another), its dev selection score
(`dev_score` of history.csv, one value per dev evaluation):
- has enough evaluations to show a curve (`min_evaluations`; `finetune.evals_per_epoch` gives a
  short run more of them);
- rises clearly above what a constant prediction scores on the same dev rows (the majority class,
  a zero correlation): a curve flat at chance learned nothing;
- has flattened: its best over the last `window` of the evaluations is at most `tolerance` above its
  best before them (its "last gain").
A fine-tuned row whose curve did not flatten (but rose above chance) still counts as trained on a
claim's column where it beats the table's frozen-encoder row there significantly: it has learned
what freezing cannot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.metrics import selection_score
from minbert.core.tasks import TASKS
from minbert.report.formats import fmt_delta, fmt_interval, fmt_metric
from minbert.report.scores import ScoreBook


@dataclass
class CurveCheck:
    """One phase of one training stage of one run."""
    run: str
    stage: str                                  # finetune | retrain_heads
    phase: str                                  # the tasks it scored, joined by "+"
    trained: bool
    why: str                                    # in words, with the numbers
    evaluations: int = 0
    last_gain: float | None = None
    best: float | None = None
    chance: float | None = None
    at_chance: bool = False                     # learned nothing: no reference can stand in


@dataclass
class RowCheck:
    """A claim's row (a run, a repeated experiment's seeds, an ensemble's members)."""
    name: str
    curves: list = field(default_factory=list)  # CurveCheck
    reference: str = ""                         # how the frozen-encoder reference stood in, where it did

    @property
    def trained(self) -> bool:
        return bool(self.curves) and (all(c.trained for c in self.curves) or bool(self.reference))

    @property
    def evidence(self) -> str:
        """What the page says of the row: the first curve that did not pass, or that all did."""
        failing = [c for c in self.curves if not c.trained]
        if not self.curves:
            return f"{self.name}: no training history to check"
        if not failing:
            return f"{self.name}: trained ({len(self.curves)} curve{'s' if len(self.curves) != 1 else ''} flattened)"
        c = failing[0]
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        text = f"{c.run} {c.stage.replace('_', ' ')} {c.phase}: {c.why}{more}"
        return f"{text}; {self.reference}" if self.reference else text


def chance_score(run, tasks: list[str]) -> float | None:
    """The selection score of a constant prediction on the run's labelled dev rows: the majority
    class's share for a classification, a correlation of 0 for a regression; None without them."""
    metrics = {}
    for task in tasks:
        if task not in TASKS:
            return None
        frame = run.labelled(task, "dev")
        if frame is None:
            return None
        if TASKS[task].kind == "regression":
            metrics[TASKS[task].metric_key] = 0.0
        else:
            metrics[TASKS[task].metric_key] = float(frame["label"].value_counts(normalize=True).max())
    return selection_score(metrics, tasks)


def curve_checks(run, stage: str, history: pd.DataFrame, cfg) -> list[CurveCheck]:
    """Each phase of a training history against the check's settings (`cfg`: TrainingCheckParams)."""
    if "dev_score" not in history.columns or history.empty:
        return [CurveCheck(run.name, stage, "", False, "its history has no dev scores")]
    phases = history["phase"].astype(str) if "phase" in history.columns else pd.Series([""] * len(history))
    checks = []
    for phase in dict.fromkeys(phases):
        scores = history.loc[phases == phase, "dev_score"].to_numpy(dtype=float)
        checks.append(phase_check(run, stage, phase, scores[np.isfinite(scores)], cfg))
    return checks


def phase_check(run, stage: str, phase: str, scores: np.ndarray, cfg) -> CurveCheck:
    """One phase's curve of dev selection scores (finite values, in evaluation order)."""
    n = len(scores)
    check = CurveCheck(run.name, stage, phase, False, "", evaluations=n)
    if n < cfg.min_evaluations:
        check.why = (f"{n} dev evaluation{'s' if n != 1 else ''}, too few to show whether its curve flattened "
                     f"(at least {cfg.min_evaluations}: raise finetune.evals_per_epoch)")
        return check
    check.best = float(scores.max())
    check.chance = chance_score(run, [t for t in phase.split("+") if t])
    if check.chance is not None and check.best < check.chance + cfg.above_chance:
        check.at_chance = True
        check.why = (f"flat at chance: its best dev score {fmt_metric(check.best)} against "
                     f"{fmt_metric(check.chance)} for a constant prediction")
        return check
    window = max(1, math.ceil(n * cfg.window))
    check.last_gain = float(scores[-window:].max() - scores[:-window].max())
    span = f"its last {window} of {n} evaluations"
    if check.last_gain > cfg.tolerance:
        check.why = (f"still rising: {span} gained {fmt_delta(check.last_gain)} on its best before them "
                     f"(more than {cfg.tolerance:g})")
        return check
    check.trained = True
    check.why = f"flattened: {span} gained {fmt_delta(check.last_gain)} (at most {cfg.tolerance:g})"
    return check


def runs_of(name: str, book: ScoreBook) -> list[str]:
    """The experiment runs behind a row: itself, a repeated experiment's seeds, an ensemble's members."""
    ensembles = book.data.params.params.ensembles       # their members are runs (seeds expanded)
    if name in ensembles:
        return [m for m in ensembles[name].members if m in book.data.runs]
    return [m for m in book.members(name) if m in book.data.runs]


def row_check(name: str, book: ScoreBook, cfg, reference: str | None = None, split: str = "dev",
              key: str | None = None) -> RowCheck:
    """Whether the row `name` trained; `reference`: the table's frozen-encoder row, which a fine-tuned
    row that did not flatten may beat significantly on the claim's column (`split`, `key`) instead."""
    check = RowCheck(name)
    for run_name in runs_of(name, book):
        run = book.data.runs[run_name]
        for stage, history in run.histories.items():
            if stage != "pretrain":
                check.curves += curve_checks(run, stage, history, cfg)
    failing = [c for c in check.curves if not c.trained]
    if failing and reference and key and not any(c.at_chance for c in failing) and fine_tuned(name, book):
        check.reference = beats_reference(name, reference, split, key, book)
    return check


def fine_tuned(name: str, book: ScoreBook) -> bool:
    """Every run of the row fine-tunes its encoder."""
    experiments = book.data.params.experiments
    runs = runs_of(name, book)
    return bool(runs) and all(r in experiments and not experiments[r].finetune.freeze_encoder for r in runs)


def beats_reference(name: str, reference: str, split: str, key: str, book: ScoreBook) -> str:
    """How the row beats the frozen reference on the column (its paired difference, interval above
    0), or "" where it does not."""
    try:
        est = book.difference(name, reference, split, key)
    except MinBertError:
        return ""
    if est is None:
        return ""
    iv = est.interval(book.confidence)
    if iv.low <= 0:
        return ""
    return (f"but it beats the frozen encoder ({reference}) on {split} {key} by {fmt_delta(est.value)} "
            f"{fmt_interval(iv, signed=True)}, so it counts as trained")
