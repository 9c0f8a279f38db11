"""A claim's rows and their difference, settled or not (docs/report.md, "The training check"): each
row's curves (minbert.report.training) over every run and stage it depends on, and whether more
training could move the claim's own difference past its verdict's boundary.

A row's runs: itself, a repeated experiment's seeds or an ensemble's members; for each, the
pretraining it starts from and the pretraining that one starts from in turn, each training stage it
writes (a history that should be there and is not fails), and a distilled run's teacher; a `best_of`
row adds every other cell it chose from. The pair: each row's last curve on the claim's column gives
its trend over one more window of training (minbert.train.plateau); their difference, with its
standard error, must stay within the move that would change the verdict (`claim_bounds`: our
interval's distance from the verdict's boundaries, and a share of the smaller of the paper's effect
and ours), or the claim is undertrained (it clearly would) or inconclusive (the noise cannot tell).
"""
from __future__ import annotations

import math
import os.path
from dataclasses import replace

from minbert.core.errors import MinBertError
from minbert.report.formats import fmt_delta, fmt_interval
from minbert.report.scores import ScoreBook
from minbert.report.training import ClaimCheck, CurveCheck, RowCheck, claim_tolerance, pretrain_check, stage_checks
from minbert.train import plateau as rule

# ------------------------------------------------------------------ a claim's row

def runs_of(name: str, book: ScoreBook) -> list[str]:
    """The experiment runs behind a row: itself, a repeated experiment's seeds, an ensemble's members."""
    ensembles = book.data.params.params.ensembles       # their members are runs (seeds expanded)
    if name in ensembles:
        return [m for m in ensembles[name].members if m in book.data.runs]
    return [m for m in book.members(name) if m in book.data.runs]


def expected_stages(exp) -> list[str]:
    """The training stages whose histories an experiment's run writes."""
    retrain = getattr(getattr(exp, "retrain_heads", None), "enabled", False)
    return ["finetune"] + (["retrain_heads"] if retrain else [])


def missing(run: str, stage: str, where: str, own: bool = True) -> CurveCheck:
    return CurveCheck(run, stage, "", False, f"no history: {where} is absent (the stage has not run, or its file was "
                      f"deleted): nothing shows that it trained", brief="no history", curve="history", own=own)


def upstream(model, book: ScoreBook) -> str | None:
    """The pretraining whose model folder `model` (a setting: a name or a folder) is, or None."""
    layout = getattr(book.data, "layout", None)
    if not model or layout is None:
        return None
    want = os.path.normpath(str(model))
    return next((p for p in book.data.params.params.pretrainings
                 if os.path.normpath(layout.pretrain_model(p)) == want), None)


def pretraining_checks(exp, run_name: str, book: ScoreBook, cfg, own: bool) -> list[CurveCheck]:
    """The dev loss of the pretraining a run starts from, and of each pretraining that one starts
    from in turn (`model`: another pretraining's model folder)."""
    pretrainings = book.data.params.params.pretrainings
    name, seen, out = getattr(exp, "pretrain", None) or upstream(getattr(exp, "model", None), book), set(), []
    loaded = getattr(book.data, "pretrainings", {}) or {}
    while name and name not in seen and name in pretrainings:
        seen.add(name)
        results = loaded.get(name) or (book.data.runs[run_name] if not out else None)
        history = None if results is None else results.histories.get("pretrain")
        label = f"{run_name}" if not out else f"{run_name} (via {name})"
        if history is None:
            layout = getattr(book.data, "layout", None)
            out.append(missing(label, "pretrain", layout.pretrain_history(name) if layout else f"{name}'s history",
                               own))
        else:
            check = pretrain_check(results, history, pretrainings[name], cfg)
            check.run, check.own = label, own
            out.append(check)
        name = upstream(getattr(pretrainings[name], "model", None), book)
    return out


def run_checks(run_name: str, book: ScoreBook, cfg, claim: ClaimCheck, printed, own: bool = True,
               seen: frozenset = frozenset()) -> list[CurveCheck]:
    """Every curve of one run: its pretrainings, each training stage it writes (an absent history
    fails), and its distillation teacher's runs in turn."""
    run, exp = book.data.runs[run_name], book.data.params.experiments.get(run_name)
    out = pretraining_checks(exp, run_name, book, cfg, own) if exp is not None else []
    layout = getattr(book.data, "layout", None)
    for stage in expected_stages(exp) if exp is not None else list(run.histories):
        if stage == "pretrain":
            continue
        history = run.histories.get(stage)
        if history is None:
            out.append(missing(run_name, stage, layout.history(run_name, stage) if layout else f"its {stage} history",
                               own))
            continue
        for c in stage_checks(run, stage, history, exp, cfg, claim, printed):
            c.own = own
            out.append(c)
    distill = getattr(getattr(exp, "finetune", None), "distill", None)
    if distill is not None:
        for teacher in runs_of(distill.teacher, book):
            if teacher not in seen and teacher != run_name:
                for c in run_checks(teacher, book, cfg, claim, None, False, seen | {run_name}):
                    c.run = c.run if "teacher of" in c.run else f"{c.run} (teacher of {run_name})"
                    out.append(c)
    return out


def final_trend(curves: list[CurveCheck]) -> rule.Trend | None:
    """The trend of a run's last curve on the claim's column (its last stage's last phase)."""
    column = [c for c in curves if c.column and c.own]
    return column[-1].trend if column else None


def row_check(name: str, book: ScoreBook, cfg, claim: ClaimCheck, cells: tuple = ()) -> RowCheck:
    """Whether the row `name` trained, for the claim `claim`: every curve of every stage of every run it
    depends on, and of every other cell of a `best_of` row (`cells`); where only its own curves
    "still rising" failed, the claim's reference for the row (`claim.references`), itself checked."""
    check = RowCheck(name)
    for run_name in runs_of(name, book):
        curves = run_checks(run_name, book, cfg, claim, claim.printed.get(name))
        check.curves += curves
        check.finals.append(final_trend(curves))
    for cell in cells:
        if cell != name:
            for run_name in runs_of(cell, book):
                check.curves += [replace(c, own=False, run=f"{c.run} (a cell of {name})")
                                 for c in run_checks(run_name, book, cfg, claim, None, False)]
    failing = check.failing
    reference = claim.references.get(name)
    if failing and reference and all(c.rising and c.own and c.stage != "pretrain" for c in failing):
        answered = row_check(reference[0], book, cfg, replace(claim, references={}))
        check.reference = beats_reference(name, *reference, claim, book) if answered.trained else ""
        if not answered.trained:
            check.curves.append(CurveCheck(reference[0], "reference", "", False, f"the reference that could answer "
                                           f"for {name} did not train: {answered.evidence}",
                                           brief=f"its reference did not train ({answered.short})", own=False))
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


# ------------------------------------------------------------------ the claim's own difference

# each verdict's boundaries: (which end of our interval, the value it is compared with: 0, or the margin
# times the sign); a move of the difference that carries an end across one changes the verdict
BOUNDARIES = {"difference": (("low", 0), ("high", 0)),
              "no_effect": (("low", -1), ("high", 1), ("low", 0), ("high", 0)),
              "no_gain": (("high", 1), ("low", 0))}


def claim_bounds(cfg, kind: str, paper: float | None, ours: float, interval, margin: float | None
                 ) -> tuple[float, float, float]:
    """(the tolerance of each row's curves, the largest move of the claim's difference upward and
    downward that cannot change its verdict). The distance of our interval's ends from the verdict's
    boundaries (0; ± the margin) bounds each direction (math.inf where no boundary lies that way: a
    reproduced difference gains nothing from a move away from 0); each is held to `share` of it and of
    the smaller of the paper's effect and ours (the margin, for a claim of no effect or no gain),
    within `min_tolerance` and `tolerance`; a row's curves, both ways, to the smallest of them."""
    ends = {"low": interval.low, "high": interval.high}
    up = down = math.inf
    for end, sign in BOUNDARIES[kind]:
        gap = sign * (margin or 0.0) - ends[end]
        up, down = (min(up, gap), down) if gap >= 0 else (up, min(down, -gap))
    sizes = [abs(margin)] if kind != "difference" else [abs(x) for x in (paper, ours) if x is not None]
    size = min(sizes) if sizes else math.inf

    def bound(distance: float) -> float:
        return claim_tolerance(cfg, min(distance, size)) if math.isfinite(distance) else math.inf

    return claim_tolerance(cfg, min(size, up, down)), bound(up), bound(down)


def pair_trend(rows: list[RowCheck]) -> rule.Trend | None:
    """The trend of the claim's difference (first row − second): each row's mean over its runs of its
    last curve on the claim's column, with the standard error of the two means; None where a run has
    no such curve."""
    finals = [r.finals for r in rows]
    if len(finals) != 2 or not all(finals) or any(t is None for f in finals for t in f):
        return None
    gain = sum(sign * sum(t.gain for t in f) / len(f) for sign, f in zip((1, -1), finals))
    se = math.sqrt(sum(sum(t.se ** 2 for t in f) / len(f) ** 2 for f in finals))
    return rule.Trend(float(gain), se, min(t.fitted for f in finals for t in f), min(t.inside for f in finals for t in f))


def pair_check(rows: list[RowCheck], claim: ClaimCheck) -> tuple[str, str]:
    """Whether one more window of training could move the claim's difference past its verdict's
    boundary: ("settled" | "moving" | "unclear", what the page says)."""
    t = pair_trend(rows)
    if t is None:
        return "unclear", ("no trend of the claim's column for each run of its rows, so nothing shows how its "
                           "difference would move with more training")
    moved = rule.movement(t, claim.up, claim.down)
    limits = " and ".join(f"{word} {fmt_delta(sign * bound)}" for word, sign, bound in
                          (("above", 1, claim.up), ("below", -1, claim.down)) if math.isfinite(bound))
    said = f"one more window of training moves the difference by {fmt_delta(t.gain)} ± {t.se:.3f}"
    if moved in ("up", "down"):
        return "moving", f"still moving: {said}, past the verdict's boundary ({limits} would change it)"
    if moved == "unclear":
        return "unclear", (f"cannot tell at the evaluations' noise whether more training moves the difference past "
                           f"its verdict's boundary: {said}, against {limits}")
    return "settled", f"settled: {said}, within {limits or 'any move'}"
