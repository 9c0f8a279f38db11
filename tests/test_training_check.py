"""The training check on constructed histories: a curve that settled, one still rising, one too noisy
to tell, one flat at chance, too few evaluations (in all, and within the last quarter of the
learning-rate budget), a decaying schedule that cannot pass by itself, each phase's own budget from
the history, a budget at a trillion updates, sequential phases, the claim's own column (rising while
the selection score is flat; falling through a later phase; at chance while the other tasks
trained), pretrainings (moved and flattened, did not move, still falling, absent, upstream), the
frozen references that may answer a claim (only for its better row, only where they trained
themselves, never with other heads), absent histories, best_of cells and distillation teachers, the
claim's own difference (its bounds, moving, unclear), the laptop run's two concatenation rows of 002,
and the verdict rules the check feeds."""
from __future__ import annotations

import math
import time
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest

from minbert.core.layout import Layout
from minbert.params.plateau import EvaluationNoise, NoiseParts, UntilPlateau, with_check_rule
from minbert.params.studies import TrainingCheckParams
from minbert.report.effects import encoder_alone, references
from minbert.report.papers import claim_verdict, training_check
from minbert.report.settled import claim_bounds, pair_check, row_check
from minbert.report.training import (
    ClaimCheck,
    CurveCheck,
    RowCheck,
    budget_at,
    chance_score,
    claim_tolerance,
    column_chance,
    plateau,
    positions,
    pretrain_check,
    score_curve,
    stage_checks,
)
from minbert.scoring import stats
from minbert.train import plateau as rule
from minbert.train import stopping

# the logic on near-noiseless evaluations (the noise's own effect has tests of its own)
QUIET = NoiseParts(jitter=0.0, rows=0.01)
# the trend fitted over the window itself (the default fits over the last half: a test of its own)
CHECK = TrainingCheckParams(noise=EvaluationNoise(classification=QUIET, binary=QUIET, regression=QUIET), fit=0.25)
NOISY = TrainingCheckParams()                               # the measured noise
SELECTION = ClaimCheck("overall", "Overall", 0.01)          # a claim on the overall: only the selection score
CONSTANT = NS(finetune=NS(warmup_ratio=0.0, lr_schedule="constant", dev_size=None))     # an experiment's schedule
DECAYING = NS(finetune=NS(warmup_ratio=0.1, lr_schedule="linear", dev_size=None))


class Run:
    """What the check reads of a run: its name, its labelled dev predictions, its histories and its
    pretraining's metrics."""

    def __init__(self, name="r", sst=(0, 1, 1, 2, 3, 1, 1, 4), sts=(0.5, 2.0, 4.5), histories=None,
                 pretrain_metrics=None, rows=1000):
        self.name = name                            # its dev sets: the labels given, repeated to about `rows`
        self.frames = {"sst": pd.DataFrame({"label": list(sst) * (rows // len(sst))}),
                       "sts": pd.DataFrame({"label": list(sts) * (rows // len(sts))}),
                       "para": pd.DataFrame({"label": [0, 0, 0, 1] * (rows // 4)})}
        self.histories = histories or {}
        self.pretrain_metrics = pretrain_metrics

    def labelled(self, task, split="dev"):
        return self.frames.get(task)


def curve(scores, cfg=CHECK, tolerance=0.01, place=None, chance=None, noise=0.0005):
    scores = np.asarray(scores, dtype=float)
    place = np.arange(1, len(scores) + 1, dtype=float) if place is None else place
    return score_curve(CurveCheck("r", "finetune", "sst", False, "", chance=chance, noise=noise), scores, place, 0.0,
                       cfg, (tolerance, np.inf))


def history(phase, scores, **columns):
    n = len(scores)
    return pd.DataFrame({"epoch": [round((k + 1) / n, 4) for k in range(n)], "update": [10 * (k + 1) for k in range(n)],
                         "phase": [phase] * n, "dev_score": scores, **columns})


def test_chance_is_the_majority_class_and_a_zero_correlation():
    run = Run()
    assert chance_score(run, ["sst"]) == pytest.approx(4 / 8)                 # label 1 is 4 of 8
    assert chance_score(run, ["sts"]) == pytest.approx(0.5)                   # r = 0 scores (0 + 1) / 2
    assert chance_score(run, ["sst", "para", "sts"]) == pytest.approx((0.5 + 0.75 + 0.5) / 3)
    assert chance_score(run, ["cfimdb"]) is None                              # no dev predictions to say
    assert column_chance(run, "sts_pearson") == 0.0 and column_chance(run, "mean") == pytest.approx((0.5 + 0.75) / 3)


def test_a_curve_that_settled_passes():
    c = curve([0.40, 0.55, 0.60, 0.62, 0.625, 0.624, 0.626, 0.626])
    assert c.trained and c.evaluations == 8
    # the slope through evaluations 6-8 (the window and one before), over one more window
    assert c.last_gain == pytest.approx(0.626 - 0.624)
    assert c.why.startswith("settled: its trend a window (25% of its learning-rate budget), fitted over its last 25% "
                            "(2 of 8 evaluations and the one before) +0.002 a window ± 0.001 (within 0.01)")


def test_a_curve_still_rising_is_undertrained_with_its_last_gain():
    c = curve([0.51, 0.53, 0.55, 0.57, 0.59, 0.61, 0.63, 0.65])
    assert not c.trained and c.rising and c.last_gain == pytest.approx(0.04)
    assert c.why.startswith("still rising: its trend a window (25% of its learning-rate budget), fitted over its last "
                            "25% (2 of 8 evaluations and the one before) +0.040 a window")
    assert c.brief == "still rising (+0.040 > 0.01)"


def test_a_gain_just_past_the_tolerance_prints_as_past_it():
    """The laptop run printed "gained +0.010 (more than 0.01)" for a gain of 0.0104: the printed figures
    must compare as the numbers do, so both take the digits that tell them apart."""
    c = curve([0.50, 0.55, 0.58, 0.60, 0.605, 0.61, 0.6154, 0.6204])
    assert not c.trained and c.last_gain == pytest.approx(0.0104)
    assert c.why.endswith("+0.0104 a window ± 0.001 (more than 0.0100)")
    assert c.brief == "still rising (+0.0104 > 0.0100)"
    c = curve([0.50, 0.55, 0.58, 0.60, 0.605, 0.61, 0.6154, 0.6196])
    assert c.trained and c.why.endswith("+0.0096 a window ± 0.001 (within 0.0100)")
    assert curve([0.51, 0.53, 0.55, 0.57, 0.59, 0.61, 0.63, 0.65]).why.endswith("(more than 0.01)")   # apart at 3


def test_a_curve_flat_at_chance_is_undertrained_though_it_is_flat():
    c = curve([0.50, 0.505, 0.50, 0.51, 0.505, 0.50], chance=0.5)
    assert not c.trained and c.at_chance and not c.rising
    assert "flat at chance" in c.why and "0.500 for a constant prediction" in c.why


def test_too_few_evaluations_cannot_show_a_plateau():
    c = curve([0.6, 0.61, 0.61])
    assert not c.trained and "3 dev evaluations, too few" in c.why and "evals_per_epoch" in c.why
    # enough in all, but one evaluation in the last quarter of the budget: no plateau can be seen there
    c = curve([0.5, 0.6, 0.6, 0.6, 0.6, 0.61], place=np.array([0.1, 0.2, 0.3, 0.4, 0.5, 1.0]))
    assert not c.trained and c.why.startswith("1 of its 6 evaluations in the last 25%")


def test_a_decaying_schedule_cannot_pass_by_itself():
    """A run at 10% warm-up then linear decay to 0, its score growing by the same amount per unit of
    learning rate throughout (never flattening): over its last quarter of updates it gains little,
    as the rate is low there, and a check on updates would pass it; on its learning-rate budget it
    is still rising."""
    updates = np.arange(1, 9) * 100.0
    budget = budget_at(updates, 0.1, "linear")
    scores = 0.40 + 0.12 * budget / budget[-1]                   # linear in the budget: no plateau at all
    by_updates = scores[-2:].max() - scores[:-2].max()           # the last quarter of the updates
    assert by_updates < 0.01                                     # what a check on updates would have passed
    c = curve(scores, place=budget)
    assert not c.trained and c.rising and c.last_gain == pytest.approx(0.03) and "(4 of 8 evaluations)" in c.why
    # the same curve flattening in its budget passes
    flat = 0.40 + 0.25 * (1 - np.exp(-12 * budget / budget[-1]))
    assert curve(flat, place=budget).trained


def test_the_tolerance_is_tied_to_the_claims_size():
    assert claim_tolerance(CHECK, 0.006) == pytest.approx(0.003)             # half of a small effect
    assert claim_tolerance(CHECK, -0.3) == pytest.approx(0.01)               # at most the cap
    assert claim_tolerance(CHECK, 0.001) == pytest.approx(0.002)             # at least the floor
    assert claim_tolerance(CHECK, None) == pytest.approx(0.01)               # a size the paper does not print
    scores = [0.40, 0.55, 0.60, 0.62, 0.625, 0.624, 0.63, 0.63]               # last gain +0.005
    assert curve(scores, tolerance=claim_tolerance(CHECK, 0.04)).trained     # a large effect: +0.005 is small
    assert not curve(scores, tolerance=claim_tolerance(CHECK, 0.006)).trained   # +0.006: it is most of it
    with pytest.raises(ValueError, match="min_tolerance"):
        TrainingCheckParams(min_tolerance=0.02, tolerance=0.01)


def test_each_phase_of_a_sequential_run_is_checked_on_its_own_budget():
    h = pd.DataFrame({"phase": ["para"] * 5 + ["sts"] * 5 + ["sst"] * 5, "epoch": range(1, 16),
                      "update": [10 * k for k in range(1, 16)],
                      "dev_score": [0.7, 0.8, 0.81, 0.81, 0.81, 0.6, 0.7, 0.8, 0.9, 0.95, 0.55, 0.6, 0.61, 0.6, 0.61]})
    checks = stage_checks(Run(), "finetune", h, CONSTANT, CHECK, SELECTION)
    assert [(c.phase, c.trained) for c in checks] == [("para", True), ("sts", False), ("sst", True)]
    assert stage_checks(Run(), "finetune", pd.DataFrame({"epoch": [1]}), CONSTANT, CHECK,
                        SELECTION)[0].why == "its history has no dev scores"


def test_the_claims_column_rising_while_the_selection_score_is_flat_is_undertrained():
    flat = [0.60, 0.65, 0.66, 0.661, 0.660, 0.661, 0.660, 0.661]
    sts = [0.50, 0.60, 0.65, 0.70, 0.74, 0.78, 0.82, 0.86]                    # still rising...
    sst = [0.45, 0.46, 0.45, 0.43, 0.41, 0.39, 0.37, 0.35]                    # ...while SST falls
    h = history("sst+para+sts", flat, dev_sts_pearson=sts, dev_sst_acc=sst, dev_para_acc=[0.7] * 8)
    on_selection = stage_checks(Run(), "finetune", h, CONSTANT, CHECK, SELECTION)
    assert all(c.trained for c in on_selection)                               # the selection score is flat
    on_sts = stage_checks(Run(), "finetune", h, CONSTANT, CHECK, ClaimCheck("sts_pearson", "STS", 0.01))
    assert [(c.curve, c.trained) for c in on_sts] == [("selection score", True), ("dev STS", False)]
    assert on_sts[1].why.startswith("still rising") and on_sts[1].last_gain == pytest.approx(0.86 - 0.78)


def test_a_claims_column_at_chance_fails_though_the_other_tasks_trained():
    scores = [0.55, 0.60, 0.62, 0.63, 0.63, 0.631, 0.63, 0.631]
    h = history("sst+para+sts", scores, dev_sts_pearson=[0.0, 0.01, -0.01, 0.0, 0.005, 0.0, 0.01, 0.0])
    checks = stage_checks(Run(), "finetune", h, CONSTANT, CHECK, ClaimCheck("sts_pearson", "STS", 0.01))
    assert checks[0].trained and not checks[1].trained and checks[1].at_chance
    assert "flat at chance: its best 0.010 against 0.000" in checks[1].why


def test_a_column_at_chance_where_the_papers_own_row_is_at_chance_is_held_to_flattening_alone():
    """000's frozen baseline prints Para 0.630 where a constant prediction scores about 0.62: a row that
    reproduces it at chance did not fail to learn, it reproduces the paper's row; it must still have
    flattened. Where the paper's row is above chance, a curve at chance stays undertrained."""
    scores = [0.55, 0.60, 0.62, 0.63, 0.63, 0.631, 0.63, 0.631]
    flat = [0.0, 0.01, -0.01, 0.0, 0.005, 0.0, 0.01, 0.0]
    rising = [-0.03, -0.02, -0.015, -0.01, -0.005, 0.0, 0.005, 0.012]
    sts = ClaimCheck("sts_pearson", "STS", 0.01)
    as_printed = stage_checks(Run(), "finetune", history("sst+para+sts", scores, dev_sts_pearson=flat),
                              CONSTANT, CHECK, sts, printed=0.012)
    assert as_printed[1].trained and not as_printed[1].at_chance
    assert as_printed[1].why.endswith("as the paper's own row is (0.012)") and "at chance (0.010 against 0.000)" in \
        as_printed[1].why
    still = stage_checks(Run(), "finetune", history("sst+para+sts", scores, dev_sts_pearson=rising),
                         CONSTANT, CHECK, sts, printed=0.012)
    assert not still[1].trained and still[1].rising and still[1].why.startswith("still rising")
    above = stage_checks(Run(), "finetune", history("sst+para+sts", scores, dev_sts_pearson=flat),
                         CONSTANT, CHECK, sts, printed=0.206)
    assert not above[1].trained and above[1].at_chance


def pretraining(losses, before, kind="nli", epochs=1, warmup=0.1, schedule="linear"):
    n = len(losses)
    run = Run(histories={"pretrain": pd.DataFrame({"epoch": [epochs * (k + 1) / n for k in range(n)],
                                                   "train_loss": losses, "dev_loss": losses})},
              pretrain_metrics={"dev_loss_before": before})
    settings = NS(kind=kind, epochs=epochs, warmup_ratio=warmup, lr_schedule=schedule)
    return pretrain_check(run, run.histories["pretrain"], settings, CHECK)


def test_a_pretraining_is_checked_on_its_own_dev_loss():
    moved = pretraining([0.150, 0.130, 0.128, 0.1275], before=0.22)
    assert moved.trained and moved.curve == "dev loss" and moved.why.startswith("settled")
    still = pretraining([0.20, 0.18, 0.16, 0.14], before=0.22)               # falling as fast at its end
    assert not still.trained and still.rising and still.why.startswith("still falling")
    assert "lowers it by 0.0" in still.why and "a window (more than" in still.why   # a loss's drop, unsigned
    idle = pretraining([0.0991, 0.0990, 0.0991, 0.0990], before=0.0992)      # 0.2% below where it started
    assert not idle.trained and idle.at_chance and idle.why.startswith("did not move: its dev loss went from 0.0992")
    once = pretraining([0.13], before=0.22)                                   # one evaluation: no curve
    assert not once.trained and "1 dev evaluation, too few" in once.why
    unknown = pretrain_check(Run(), pd.DataFrame({"epoch": [1], "dev_loss": [0.1]}), NS(kind="mlm"), CHECK)
    assert not unknown.trained and "no dev loss before" in unknown.why


# ------------------------------------------------------------------ rows and their references

class Heads(dict):
    def model_dump(self, mode="python"):
        return dict(self)


UV = Heads(para="concat_uv", sts="concat_uv")
COSINE = Heads(para="concat", sts="cosine")
CROSS = Heads(para="cross", sts="cross")


class Book:
    """The ScoreBook part the check reads: runs, seeds, experiments' settings, values and differences."""

    def __init__(self, runs, settings, difference=None, values=None):
        self.data = NS(runs={r.name: r for r in runs}, layout=Layout(), pretrainings={},
                       params=NS(params=NS(ensembles={}, pretrainings={}),
                                 experiments={n: NS(finetune=NS(freeze_encoder=frozen, heads=heads, warmup_ratio=0.0,
                                                                lr_schedule="constant", dev_size=None, distill=None),
                                                    pretrain=None, model="all-MiniLM-L6-v2",
                                                    retrain_heads=NS(enabled=False))
                                              for n, (frozen, heads) in settings.items()}))
        self.confidence = 0.95
        self._difference = difference or {}
        self._values = values or {}

    def members(self, name):
        return [name]

    def difference(self, a, b, split, key):
        return self._difference.get((a, b))

    def value(self, name, split, key):
        return self._values.get(name)


def est(values):
    return stats.Estimate(float(np.mean(values)), np.asarray(values, dtype=float), ())


RISING = pd.DataFrame({"phase": ["sst+para+sts"] * 8, "dev_score": [0.55, 0.6, 0.65, 0.7, 0.72, 0.74, 0.76, 0.78],
                       "epoch": range(1, 9)})
FLAT = pd.DataFrame({"phase": ["sst+para+sts"] * 8, "dev_score": [0.55, 0.6, 0.62, 0.63] + [0.63] * 4,
                     "epoch": range(1, 9)})
CLEARLY = est([0.1, 0.12, 0.14] * 50)


def claim_check(sp, claim, chosen, book, key="sst_acc"):
    return ClaimCheck(key, "SST", 0.01, "dev", references(sp, claim, chosen, book))


def test_a_row_still_rising_counts_against_the_claims_own_frozen_row():
    ft, frozen = Run("ft", histories={"finetune": RISING}), Run("frozen", histories={"finetune": FLAT})
    book = Book([ft, frozen], {"ft": (False, COSINE), "frozen": (True, UV)}, {("ft", "frozen"): CLEARLY})
    sp = NS(frozen_reference="", reference_run="", encoder_alone=[])
    chosen = {"FT": "ft", "Frozen": "frozen"}
    claim = NS(kind="difference", rows=("FT", "Frozen"))
    row = row_check("ft", book, CHECK, claim_check(sp, claim, chosen, book))
    assert row.trained and "beats frozen (the claim's frozen row) on dev SST by +0.120" in row.evidence
    # not when the difference could be 0, not for the frozen side, not on a no-effect claim
    unclear = Book([ft, frozen], {"ft": (False, COSINE), "frozen": (True, UV)},
                   {("ft", "frozen"): est([-0.01, 0.1] * 50)})
    assert not row_check("ft", unclear, CHECK, claim_check(sp, claim, chosen, unclear)).trained
    reversed_claim = NS(kind="difference", rows=("Frozen", "FT"))
    assert "ft" not in references(sp, reversed_claim, chosen, book)
    assert references(sp, NS(kind="no_effect", rows=("FT", "Frozen")), chosen, book) == {}


def test_a_reference_with_other_heads_never_stands_in():
    """002's laptop run: a cross-encoder or cosine row still rising beat the frozen [u, v] reference
    on STS by its head design alone, and counted as trained; only a reference with the row's own
    heads may answer for it."""
    cos, cross = Run("cos", histories={"finetune": RISING}), Run("cross", histories={"finetune": RISING})
    uv, ref = Run("uv", histories={"finetune": RISING}), Run("ref", histories={"finetune": FLAT})
    settings = {"cos": (False, COSINE), "cross": (False, CROSS), "uv": (False, UV), "ref": (True, UV)}
    book = Book([cos, cross, uv, ref], settings,
                {(r, "ref"): CLEARLY for r in ("cos", "cross", "uv")})
    sp = NS(frozen_reference="", reference_run="ref", encoder_alone=[])
    chosen = {"Cos": "cos", "Cross": "cross", "UV": "uv"}
    claim = NS(kind="difference", rows=("Cross", "Cos"))
    check = claim_check(sp, claim, chosen, book, key="sts_pearson")
    assert check.references == {}
    assert not row_check("cross", book, CHECK, check).trained
    assert not row_check("cos", book, CHECK, check).trained
    same = NS(kind="difference", rows=("UV", "Cos"))
    check = claim_check(sp, same, chosen, book, key="sts_pearson")
    assert check.references == {"uv": ("ref", "the table's frozen reference, with the same heads")}
    assert row_check("uv", book, CHECK, check).trained and not row_check("cos", book, CHECK, check).trained


def test_nothing_excuses_a_curve_at_chance_or_a_pretraining_that_did_not_move():
    flat = Run("flat", histories={"finetune": pd.DataFrame({"phase": ["sst"] * 8, "dev_score": [0.5] * 8,
                                                            "epoch": range(1, 9)})})
    frozen = Run("frozen", histories={"finetune": FLAT})
    book = Book([flat, frozen], {"flat": (False, UV), "frozen": (True, UV)}, {("flat", "frozen"): CLEARLY})
    check = ClaimCheck("sst_acc", "SST", 0.01, "dev", {"flat": ("frozen", "the claim's frozen row")})
    assert not row_check("flat", book, CHECK, check).trained
    idle = pd.DataFrame({"epoch": [0.25, 0.5, 0.75, 1.0], "train_loss": [0.1] * 4, "dev_loss": [0.0991] * 4})
    pre = Run("pre", histories={"pretrain": idle, "finetune": RISING}, pretrain_metrics={"dev_loss_before": 0.0992})
    book = Book([pre, frozen], {"pre": (False, UV), "frozen": (True, UV)}, {("pre", "frozen"): CLEARLY})
    book.data.params.experiments["pre"].pretrain = "nli"
    book.data.params.params.pretrainings["nli"] = NS(kind="nli", epochs=1, warmup_ratio=0.1, lr_schedule="linear")
    row = row_check("pre", book, CHECK, ClaimCheck("sst_acc", "SST", 0.01, "dev", {"pre": ("frozen", "x")}))
    assert not row.trained and row.reference == ""
    assert row.evidence.startswith("pre pretrain, dev loss: did not move")


def laptop_sequential(phase_scores):
    """A 002 row at the laptop scale: Para, STS, SST one after another, 125 updates each, dev
    evaluated 6 times a phase, the rate warming up over 10% of the run and decaying to 0."""
    updates = [int(p * 125 + 125 * (k + 1) / 6) for p in range(3) for k in range(6)]
    lr = [1e-4 * min((u + 1) / 37, 1 - (u - 37) / 338) for u in updates]
    return pd.DataFrame({"epoch": [round(u / 125, 4) for u in updates], "update": updates, "lr": lr,
                         "phase": ["para"] * 6 + ["sts"] * 6 + ["sst"] * 6,
                         "dev_score": [s for scores in phase_scores for s in scores]})


def test_the_laptop_runs_concatenation_rows_of_002_are_undertrained():
    """docs/results.md's laptop run: r002_concat and r002_concat_smart still rose in their Para and
    STS phases; both beat the frozen [u, v] reference (r002_frozen) on STS, which made "SMART lowers
    STS" read reproduced and "concatenation beats the cosine head on STS" read reversed. Their heads
    are not the reference's: both claims are undertrained."""
    concat = laptop_sequential([[0.78, 0.80, 0.81, 0.82, 0.835, 0.85], [0.80, 0.84, 0.86, 0.88, 0.905, 0.93],
                                [0.55, 0.60, 0.62, 0.63, 0.63, 0.63]])
    smart = laptop_sequential([[0.77, 0.79, 0.81, 0.82, 0.83, 0.845], [0.78, 0.82, 0.85, 0.88, 0.90, 0.92],
                               [0.56, 0.61, 0.63, 0.64, 0.64, 0.64]])
    cos = laptop_sequential([[0.76, 0.78, 0.80, 0.81, 0.811, 0.811], [0.88, 0.90, 0.91, 0.912, 0.912, 0.912],
                             [0.55, 0.60, 0.63, 0.63, 0.63, 0.63]])
    runs = [Run("r002_concat", histories={"finetune": concat}), Run("r002_concat_smart", histories={"finetune": smart}),
            Run("r002_cos_sim", histories={"finetune": cos}),
            Run("r002_frozen", histories={"finetune": laptop_sequential([[0.6, 0.7, 0.72, 0.72, 0.72, 0.72]] * 3)})]
    settings = {"r002_concat": (False, CROSS), "r002_concat_smart": (False, CROSS), "r002_cos_sim": (False, COSINE),
                "r002_frozen": (True, UV)}
    book = Book(runs, settings, {(r, "r002_frozen"): CLEARLY for r in settings})
    for r in runs:
        book.data.params.experiments[r.name].finetune.warmup_ratio = 0.1
        book.data.params.experiments[r.name].finetune.lr_schedule = "linear"
    sp = NS(frozen_reference="", reference_run="r002_frozen", encoder_alone=[])
    chosen = {"Cos-Sim": "r002_cos_sim", "Concat": "r002_concat", "Concat+SMART": "r002_concat_smart"}
    for rows in (("Concat", "Concat+SMART"), ("Concat", "Cos-Sim")):
        claim = NS(kind="difference", rows=rows)
        check = ClaimCheck("sts_pearson", "STS", claim_tolerance(CHECK, 0.062), "dev",
                           references(sp, claim, chosen, book))
        row = row_check(chosen[rows[0]], book, CHECK, check)
        assert not row.trained and row.reference == ""
        assert "still rising" in row.evidence and "finetune para" in row.evidence
    assert row_check("r002_cos_sim", book, CHECK, check).trained


def test_the_encoder_alone_beside_an_effect_several_times_the_papers():
    """004's R4 - R2 on STS: +0.640 here against the paper's +0.069; R3 and R1 (the same heads over
    the frozen encoder) give +0.600 of it, so the method made +0.040."""
    runs = [Run(n) for n in ("r4", "r2", "r3", "r1")]
    settings = {"r4": (False, COSINE), "r2": (False, UV), "r3": (True, COSINE), "r1": (True, UV)}
    book = Book(runs, settings, {("r3", "r1"): est([0.58, 0.6, 0.62] * 50)},
                values={"r4": 0.84, "r2": 0.20, "r3": 0.80, "r1": 0.20})
    view = NS(kind="difference", paper_difference=0.069, difference=0.640, better_run="r4", worse_run="r2",
              split="dev")
    alone = encoder_alone(view, ["r3", "r1"], 3.0, book, "sts_pearson")
    assert (alone.better, alone.worse) == ("r3", "r1")
    assert alone.difference == pytest.approx(0.60) and alone.made == pytest.approx(0.04)
    assert alone.interval.low > 0.5
    # within 3 times the paper's effect, nothing is added; a row with no frozen twin says so
    assert encoder_alone(NS(**{**vars(view), "difference": 0.2}), ["r3", "r1"], 3.0, book, "sts_pearson") is None
    del book.data.params.experiments["r3"]
    alone = encoder_alone(view, ["r1"], 3.0, book, "sts_pearson")
    assert alone.better is None and alone.difference is None and "no run here trains r4's heads" in alone.note
    # a frozen row is its own encoder alone: both rows frozen, the whole effect is the encoder's with those heads
    view = NS(**{**vars(view), "better_run": "r1", "worse_run": "r1"})
    assert encoder_alone(view, [], 3.0, book, "sts_pearson").made == pytest.approx(0.640)


def test_plateau_reads_a_loss_the_other_way():
    c = CurveCheck("r", "pretrain", "mlm", False, "")
    loss = np.array([5.0, 3.0, 2.5, 2.49, 2.49, 2.49, 2.49, 2.49])
    assert plateau(c, loss, np.arange(8.0), 0.0, CHECK, (0.1, np.inf), lower=True).trained
    c = CurveCheck("r", "pretrain", "mlm", False, "")
    assert not plateau(c, np.linspace(5.0, 1.0, 8), np.arange(8.0), 0.0, CHECK, (0.1, np.inf), lower=True).trained


def test_no_gain_claims_are_one_sided():
    # the paper: "failed to improve"; margin 0.01 on the claim's column
    assert claim_verdict(0.0, est([-0.03, -0.02, -0.01] * 50), margin=0.01, kind="no_gain") == "reproduced"
    assert claim_verdict(0.0, est([-0.002, 0.003, 0.008] * 50), margin=0.01, kind="no_gain") == "reproduced"
    # a loss of any size is still no gain (a two-sided no-effect claim would call it "differs")
    assert claim_verdict(0.0, est([-0.2, -0.1, -0.05] * 50), margin=0.01, kind="no_gain") == "reproduced"
    assert claim_verdict(0.0, est([-0.2, -0.1, -0.05] * 50), margin=0.01) == "differs"
    assert claim_verdict(0.0, est([0.02, 0.03, 0.04] * 50), margin=0.01, kind="no_gain") == "differs"
    assert claim_verdict(0.0, est([-0.01, 0.0, 0.03] * 50), margin=0.01, kind="no_gain") == "inconclusive"


def test_a_difference_whose_seeds_disagree_in_sign_is_never_reproduced():
    ours = est([0.01, 0.02, 0.03] * 50)
    assert claim_verdict(0.02, ours, seed_differences=[0.03, 0.02, 0.01]) == "reproduced"
    assert claim_verdict(0.02, ours, seed_differences=[0.05, 0.03, -0.01]) == "not significant"
    assert claim_verdict(-0.02, est([-0.01, -0.02] * 50), seed_differences=[-0.01, 0.004]) == "not significant"


def test_the_scorecard_counts_each_claim_row_once_trained_only_where_every_claim_found_it_trained():
    from minbert.report.papers import Scorecard, rows_checked
    from minbert.report.training import RowCheck

    def row(name, trained):
        return NS(name=name, trained=trained, evidence=f"{name} did not train")

    # "ft" counts as trained on one claim's column (the frozen reference) but not on another's
    claims = [NS(training=[row("ft", True), row("frozen", True)]), NS(training=[row("ft", False), row("b", True)]),
              NS(training=[])]
    rows = rows_checked(claims)
    assert rows == {"ft": False, "frozen": True, "b": True}
    card = Scorecard(claims, {}, False, rows=rows)
    assert card.rows_trained == 2 and card.rows_untrained == ["ft"]
    assert card.evidence == [("ft", "ft did not train")]                     # said once
    assert RowCheck("x").trained is False                      # no history: not trained


# ------------------------------------------------------------------ a run that stops at its plateau

def test_the_check_quotes_how_a_run_that_stops_at_its_plateau_ended_each_phase():
    """history.csv's `stopped` (finetune.until_plateau) is read: a phase stopped at its plateau says so
    beside its verdict, and one that ran to its cap still rising says that it hit the cap."""
    flat = [0.6, 0.7, 0.75, 0.8, 0.81, 0.81, 0.81, 0.81]
    rising = [0.50, 0.53, 0.56, 0.59, 0.62, 0.65, 0.68, 0.71]
    h = pd.concat([history("sst", flat, stopped=[None] * 7 + ["plateau"]),
                   history("para", rising, stopped=[None] * 7 + ["cap"])], ignore_index=True)
    h["update"], h["epoch"] = range(10, 170, 10), [k / 4 for k in range(1, 17)]
    settled, still = stage_checks(Run(), "finetune", h, CONSTANT, CHECK, SELECTION)
    assert settled.trained and settled.why.endswith("; the run stopped this phase at its plateau (epoch 2)")
    assert not still.trained and still.why.endswith("; the run trained this phase to its cap (epoch 4) without "
                                                    "reading it flat")
    assert still.brief.endswith(", at its cap")


@pytest.mark.parametrize("seed", range(3))
def test_the_loop_stops_exactly_where_the_check_passes_the_curve(seed):
    """The loop's reading (minbert.train.stopping) and the check's (`plateau`) of the same selection-score
    curve, at the same noise, tolerance, window and fit, agree on every prefix of curves flat, rising,
    bending and noisy: a run stops where its check would pass it."""
    cfg = NOISY
    loop_rule = with_check_rule(UntilPlateau(enabled=True), cfg)
    rows = {"sst": 300}
    noise = rule.weighted_noise(rows, {"sst": 1.0}, cfg.noise)
    rng = np.random.default_rng(seed)
    for shape in (lambda x: 0.6 + 0 * x, lambda x: 0.4 + 0.2 * x, lambda x: 0.7 - 0.3 * np.exp(-5 * x)):
        x = np.arange(1, 25) / 24
        scores = shape(x) + rng.normal(0, noise, len(x))
        place = rule.lr_budget(np.arange(1, 25) * 10, 240, 24, "constant")
        for k in range(1, 25):
            hist = [{"phase": "sst", "lr_budget": p, "dev_score": v} for p, v in zip(place[:k], scores[:k])]
            said, _ = stopping.reading(hist, "sst", ["sst"], rows, loop_rule)
            check = CurveCheck("r", "finetune", "sst", False, "", noise=noise)
            passed = plateau(check, scores[:k], place[:k], 0.0, cfg, (cfg.tolerance, math.inf)).trained \
                and k >= cfg.min_evaluations
            assert (said == "flat") == passed, (seed, k, said, check.why)


# ------------------------------------------------------------------ the budget each history carries

def test_each_phase_is_placed_on_its_own_budget_as_the_history_records_it():
    """A sequential row whose phases each warm up briefly and then hold a constant rate: the history's
    `lr_budget` (the loop's sum of each update's rate) places each evaluation; one schedule over the
    whole run drawn from its `update` column would put the last phase's evaluations elsewhere."""
    updates = np.arange(1, 25) * 12.5
    per_phase = np.concatenate([rule.lr_budget(u - p * 100, 100, 10, "constant") + p * rule.lr_budget(100, 100, 10,
                                "constant") for p, u in enumerate(np.split(updates, 3))]) * 1e-4
    h = pd.DataFrame({"phase": ["para"] * 8 + ["sts"] * 8 + ["sst"] * 8, "epoch": updates / 100, "update": updates,
                      "lr_budget": per_phase, "dev_score": [0.6, 0.7, 0.75, 0.8, 0.81, 0.81, 0.81, 0.81] * 3})
    assert positions(h, 0.1, "linear") == pytest.approx(per_phase)
    assert positions(h.drop(columns="lr_budget"), 0.1, "linear") != pytest.approx(per_phase)
    assert [c.trained for c in stage_checks(Run(), "finetune", h, DECAYING, CHECK, SELECTION)] == [True] * 3


def test_a_history_at_a_trillion_updates_is_checked_at_once():
    """issue 57: the budget looped over every update, so an `update` of 1e12 never finished."""
    updates = np.linspace(1e11, 1e12, 8)
    h = pd.DataFrame({"phase": ["sst+para+sts"] * 8, "epoch": np.arange(1, 9), "update": updates,
                      "dev_score": [0.55, 0.6, 0.62, 0.63, 0.63, 0.63, 0.63, 0.63]})
    t0 = time.perf_counter()
    checks = stage_checks(Run(), "finetune", h, DECAYING, CHECK, SELECTION)
    assert time.perf_counter() - t0 < 1.0 and checks[0].trained
    assert budget_at(updates, 0.1, "linear")[-1] == pytest.approx(0.5e12, rel=1e-6)       # half the warm-up and decay


# ------------------------------------------------------------------ the evaluations' noise

def test_a_curve_too_noisy_to_tell_is_unclear_not_a_coin_flip():
    """On 300 dev rows an SST accuracy moves by about 0.034 between evaluations of a settled model (the
    measured noise): a tolerance of 0.003 cannot be told at that noise, whichever way the curve's last
    points fell; 0.06, with three evaluations in and before the window, can."""
    scores = [0.40, 0.45, 0.47, 0.48, 0.482, 0.479, 0.484, 0.481]
    noise = rule.evaluation_noise(300, NOISY.noise.classification.rows, NOISY.noise.classification.jitter)
    c = curve(scores, NOISY, tolerance=0.003, noise=noise)
    assert not c.trained and c.unclear and not c.rising and c.brief.startswith("cannot tell (")
    assert "more evaluations in the window, or more dev rows each" in c.why
    assert curve(scores, NOISY, tolerance=0.06, noise=noise).trained          # a tolerance it can tell
    row = RowCheck("r", [c])
    assert row.status == "unclear" and not row.trained


def test_the_noise_of_a_score_comes_from_its_tasks_rows():
    from minbert.report.training import score_noise
    from minbert.train.plateau import score_weights

    run = Run(rows=1200)                                                       # sst 1,200, para 1,200, sts 1,200
    n = NOISY.noise
    one = score_noise(run, {"sst": 1.0}, NOISY, None)
    assert one == pytest.approx(np.sqrt((n.classification.jitter ** 2 + n.classification.rows ** 2 / 1200) / 2))
    at_300 = score_noise(run, {"sst": 1.0}, NOISY, 300)
    assert at_300 == pytest.approx(np.sqrt((n.classification.jitter ** 2 + n.classification.rows ** 2 / 300) / 2))
    overall = score_noise(run, score_weights(["sst", "para", "sts"]), NOISY, None)
    parts = [np.sqrt((p.jitter ** 2 + p.rows ** 2 / 1200) / 2) * w
             for p, w in ((n.classification, 1), (n.binary, 1), (n.regression, 0.5))]
    assert overall == pytest.approx(np.sqrt(np.sum(np.square(parts))) / 3)


# ------------------------------------------------------------------ the holes: each failed before its fix

def rows_book(*rows, difference=None):
    """A Book of runs (name, finetune history, frozen, heads)."""
    runs = [Run(n, histories={"finetune": h}) for n, h, *_ in rows]
    return Book(runs, {n: (frozen, heads) for n, _, frozen, heads in rows}, difference or {})


def test_a_still_rising_worse_row_is_never_excused_by_the_tables_reference():
    """effects.py gave the table's frozen reference with the same heads to either row: 002's Cos-Sim >
    Baseline with Baseline (the worse row) still rising read reproduced, though that row's next quarter
    could erase the lead. Only the better row's rise is answered (more training only widens its lead)."""
    book = rows_book(("better", FLAT, False, UV), ("worse", RISING, False, UV), ("ref", FLAT, True, UV),
                     difference={("worse", "ref"): CLEARLY, ("better", "ref"): CLEARLY})
    sp = NS(frozen_reference="", reference_run="ref", encoder_alone=[])
    claim = NS(kind="difference", rows=("A", "B"))
    refs = references(sp, claim, {"A": "better", "B": "worse"}, book)
    assert "worse" not in refs
    assert not row_check("worse", book, CHECK, ClaimCheck("sst_acc", "SST", 0.01, "dev", refs)).trained
    refs = references(sp, claim, {"A": "worse", "B": "better"}, book)       # now the rising row is the better one
    assert refs == {"worse": ("ref", "the table's frozen reference, with the same heads")}
    assert row_check("worse", book, CHECK, ClaimCheck("sst_acc", "SST", 0.01, "dev", refs)).trained
    assert references(sp, NS(kind="no_gain", rows=("A", "B")), {"A": "worse", "B": "better"}, book) == {}


def test_a_reference_is_checked_like_any_row():
    """A reference flat at chance answered for a row still rising: it shows nothing of what fine-tuning
    made. The reference must have trained itself."""
    at_chance = pd.DataFrame({"phase": ["sst"] * 8, "dev_score": [0.5, 0.505, 0.5, 0.5, 0.505, 0.5, 0.5, 0.505],
                              "epoch": range(1, 9)})
    book = rows_book(("ft", RISING, False, UV), ("ref", at_chance, True, UV), ("worse", FLAT, False, COSINE),
                     difference={("ft", "ref"): CLEARLY})
    refs = references(NS(frozen_reference="", reference_run="ref", encoder_alone=[]), NS(kind="difference",
                      rows=("A", "B")), {"A": "ft", "B": "worse"}, book)
    assert refs == {"ft": ("ref", "the table's frozen reference, with the same heads")}
    row = row_check("ft", book, CHECK, ClaimCheck("sst_acc", "SST", 0.01, "dev", refs))
    assert not row.trained and row.reference == ""
    assert "the reference that could answer for ft did not train: ref finetune sst, selection score: flat at chance" \
        in row.evidence or any("flat at chance" in c.why for c in row.curves)


def test_an_absent_history_fails_the_row():
    """A row with `pretrain: nli_triplet` and no pretraining history read "trained (1 curve passed)"; a
    fine-tuning or head re-training history that should be there and is not fails too."""
    book = rows_book(("pre", FLAT, False, UV))
    book.data.params.experiments["pre"].pretrain = "nli_triplet"
    book.data.params.params.pretrainings["nli_triplet"] = NS(kind="nli", epochs=1, warmup_ratio=0.0,
                                                              lr_schedule="constant", model=None)
    row = row_check("pre", book, CHECK, SELECTION)
    assert not row.trained and row.short == "pre pretrain, history: no history"
    assert "results/pretrain/nli_triplet/history.csv is absent" in row.evidence
    book = rows_book(("rh", FLAT, False, UV))
    book.data.params.experiments["rh"].retrain_heads.enabled = True
    assert "results/experiments/rh/retrain_heads/history.csv is absent" in row_check("rh", book, CHECK,
                                                                                     SELECTION).evidence
    book.data.runs["rh"].histories = {}
    row = row_check("rh", book, CHECK, SELECTION)
    assert not row.trained and [c.stage for c in row.failing] == ["finetune", "retrain_heads"]


def test_a_sequential_rows_claim_column_is_read_in_its_later_phases():
    """002's SMART row: QQP falling 0.10 through its SST phase went unseen (the column was read only in
    the phase that trains it), though that forgetting is the paper's own cause of "SMART lowers QQP"."""
    para = [0.70, 0.76, 0.79, 0.80, 0.80, 0.80]
    h = laptop_sequential([para, [0.80, 0.84, 0.86, 0.87, 0.87, 0.87], [0.55, 0.60, 0.62, 0.63, 0.63, 0.63]])
    h["dev_para_acc"] = para + [0.80] * 6 + [0.80, 0.78, 0.76, 0.74, 0.72, 0.70]
    on_para = ClaimCheck("para_acc", "Para", 0.01)
    checks = stage_checks(Run(), "finetune", h, DECAYING, CHECK, on_para)
    assert [(c.phase, c.curve, c.trained) for c in checks] == [
        ("para", "selection score", True), ("sts", "selection score", True), ("sts", "dev Para", True),
        ("sst", "selection score", True), ("sst", "dev Para", False)]
    assert checks[-1].why.startswith("still falling") and checks[-1].last_gain < -0.01
    # an overall claim is read from the phase by which all its tasks have trained: the last one here
    h["dev_overall"] = h["dev_para_acc"]
    overall = stage_checks(Run(), "finetune", h, DECAYING, CHECK, ClaimCheck("overall", "Overall", 0.01))
    assert [(c.phase, c.curve) for c in overall][-1] == ("sst", "dev Overall")


def test_every_cell_of_a_best_of_row_its_teacher_and_its_upstream_pretraining_are_read():
    """R9 and R10 ("fails to improve") stood on the chosen cell alone, a cell still rising beside it; a
    distilled row's teacher and the pretraining a pretraining starts from were never read."""
    book = rows_book(("chosen", FLAT, False, UV), ("other", RISING, False, UV))
    assert row_check("chosen", book, CHECK, SELECTION).trained
    row = row_check("chosen", book, CHECK, SELECTION, cells=("chosen", "other"))
    assert not row.trained and row.short.startswith("other (a cell of chosen) finetune sst+para+sts, selection score: "
                                                    "still rising")
    book = rows_book(("student", FLAT, False, UV), ("teacher", RISING, False, UV))
    book.data.params.experiments["student"].finetune.distill = NS(teacher="teacher")
    row = row_check("student", book, CHECK, SELECTION)
    assert not row.trained and row.short.startswith("teacher (teacher of student) finetune")
    book = rows_book(("ft", FLAT, False, UV))
    moved = pd.DataFrame({"epoch": [0.25, 0.5, 0.75, 1.0], "dev_loss": [0.150, 0.130, 0.128, 0.1275]})
    idle = pd.DataFrame({"epoch": [0.25, 0.5, 0.75, 1.0], "dev_loss": [0.0991] * 4})
    book.data.pretrainings = {"nli": NS(name="nli", histories={"pretrain": moved},
                                        pretrain_metrics={"dev_loss_before": 0.22}),
                              "mlm": NS(name="mlm", histories={"pretrain": idle},
                                        pretrain_metrics={"dev_loss_before": 0.0992})}
    book.data.params.params.pretrainings = {
        "nli": NS(kind="nli", epochs=1, warmup_ratio=0.1, lr_schedule="linear", model="results/pretrain/mlm/model"),
        "mlm": NS(kind="mlm", epochs=1, warmup_ratio=0.0, lr_schedule="constant", model=None)}
    book.data.params.experiments["ft"].pretrain = "nli"
    row = row_check("ft", book, CHECK, SELECTION)
    assert [(c.run, c.stage, c.trained) for c in row.curves] == [
        ("ft", "pretrain", True), ("ft (via mlm)", "pretrain", False), ("ft", "finetune", True)]
    assert row.short.startswith("ft (via mlm) pretrain, dev loss: did not move")


# ------------------------------------------------------------------ the claim's own difference

def test_the_bounds_of_a_claims_difference_are_its_verdicts_boundaries():
    iv = stats.Interval(0.01, 0.05)
    row, up, down = claim_bounds(CHECK, "difference", 0.02, 0.03, iv, None)   # reproduced: only a fall toward 0
    assert up == np.inf and down == pytest.approx(0.005) and row == pytest.approx(0.005)
    row, up, down = claim_bounds(CHECK, "difference", 0.2, -0.01, stats.Interval(-0.03, 0.014), None)
    assert up == down == pytest.approx(0.005)          # not significant: either way, half of ours (the smaller)
    row, up, down = claim_bounds(CHECK, "difference", 0.2, -0.05, stats.Interval(-0.09, 0.004), None)
    assert up == pytest.approx(0.01) and down == pytest.approx(0.002)         # 0.004 from significance
    row, up, down = claim_bounds(CHECK, "no_gain", 0.0, 0.0, stats.Interval(-0.03, 0.004), 0.01)
    assert up == pytest.approx(0.003) and down == np.inf                      # only a rise past the margin
    row, up, down = claim_bounds(CHECK, "no_effect", 0.0, 0.0, stats.Interval(-0.004, 0.004), 0.01)
    assert up == down == pytest.approx(0.002)                                 # the floor: 0 lies inside
    assert claim_bounds(CHECK, "difference", None, 0.3, stats.Interval(0.2, 0.4), None) == (0.01, np.inf, 0.01)


def test_two_rows_each_within_the_tolerance_can_still_move_the_difference():
    """FREEZE_SST: each row within its tolerance, one falling and one rising, moved the difference by
    the whole effect in one more quarter-budget."""
    rows = [RowCheck("a", finals=[rule.Trend(-0.0015, 0.0002, 3, 2)]), RowCheck("b", finals=[rule.Trend(0.0015, 0.0002,
                                                                                              3, 2)])]
    _, up, down = claim_bounds(CHECK, "difference", 0.006, 0.006, stats.Interval(0.002, 0.010), None)
    status, said = pair_check(rows, ClaimCheck("sst_acc", "SST", 0.002, up=up, down=down))
    assert status == "moving" and said.startswith("still moving: one more window of training moves the difference by "
                                                  "−0.003")
    same_way = [RowCheck("a", finals=[rule.Trend(0.0015, 0.0002, 3, 2)]), rows[1]]
    assert pair_check(same_way, ClaimCheck("sst_acc", "SST", 0.002, up=up, down=down))[0] == "settled"
    noisy = [RowCheck("a", finals=[rule.Trend(0.0, 0.004, 3, 2)]), RowCheck("b", finals=[rule.Trend(0.0, 0.004, 3, 2)])]
    assert pair_check(noisy, ClaimCheck("sst_acc", "SST", 0.002, up=up, down=down))[0] == "unclear"
    assert pair_check([rows[0], RowCheck("b", finals=[None])], ClaimCheck("sst_acc", "SST", 0.01))[0] == "unclear"


def claim_case(better_history, worse_history, verdict="reproduced", interval=(0.05, 0.15), cfg=CHECK):
    """A claim "A > B" judged `verdict` on our +0.10 `interval`, through papers.training_check."""
    book = rows_book(("a", better_history, False, UV), ("b", worse_history, False, COSINE))
    view = NS(verdict=verdict, paper_difference=0.1, difference=0.1, interval=stats.Interval(*interval),
              better="A", worse="B", judged="", settled="", training=[], tolerance=None)
    sp = NS(rows=[NS(label="A", stand_in="", dev={}, best_of=[]), NS(label="B", stand_in="", dev={}, best_of=[])],
            frozen_reference="", reference_run="")
    claim = NS(kind="difference", rows=("A", "B"), margin=None, column="Overall", split="dev")
    training_check(view, sp, claim, {"A": "a", "B": "b"}, "overall", book, cfg)
    return view


def test_a_claim_on_rows_still_moving_is_undertrained_and_one_the_noise_cannot_tell_is_inconclusive():
    view = claim_case(FLAT, FLAT)
    assert view.verdict == "reproduced" and view.settled.startswith("settled") and view.tolerance == 0.01
    view = claim_case(FLAT, RISING)                                        # the worse row still rising
    assert (view.verdict, view.judged) == ("undertrained", "reproduced")
    assert view.training[1].short.startswith("b finetune sst+para+sts, selection score: still rising")
    loud = NoiseParts(jitter=0.5, rows=3.0)
    noisy = TrainingCheckParams(noise=EvaluationNoise(classification=loud, binary=loud, regression=loud))
    view = claim_case(FLAT, FLAT, cfg=noisy)
    assert (view.verdict, view.judged) == ("inconclusive", "reproduced")
    assert view.training[0].status == "unclear"
