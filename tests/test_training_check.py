"""The training check on constructed histories (a curve that flattened, one still rising, one flat
at chance, too few evaluations, sequential phases), the frozen reference that stands in for a
fine-tuned row still rising, and the verdict rules it feeds: the one-sided no-gain claim and a
difference whose seeds disagree in sign."""
from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest

from minbert.params.studies import TrainingCheckParams
from minbert.report.papers import claim_verdict
from minbert.report.training import chance_score, curve_checks, phase_check, row_check
from minbert.scoring import stats

CHECK = TrainingCheckParams()


class Run:
    """What the check reads of a run: its name, its labelled dev predictions, its histories."""

    def __init__(self, name="r", sst=(0, 1, 1, 2, 3, 1, 1, 4), sts=(0.5, 2.0, 4.5), histories=None):
        self.name = name
        self.frames = {"sst": pd.DataFrame({"label": list(sst)}), "sts": pd.DataFrame({"label": list(sts)}),
                       "para": pd.DataFrame({"label": [0, 0, 0, 1]})}
        self.histories = histories or {}

    def labelled(self, task, split="dev"):
        return self.frames.get(task)


def test_chance_is_the_majority_class_and_a_zero_correlation():
    run = Run()
    assert chance_score(run, ["sst"]) == pytest.approx(4 / 8)                 # label 1 is 4 of 8
    assert chance_score(run, ["sts"]) == pytest.approx(0.5)                   # r = 0 scores (0 + 1) / 2
    assert chance_score(run, ["sst", "para", "sts"]) == pytest.approx((0.5 + 0.75 + 0.5) / 3)
    assert chance_score(run, ["cfimdb"]) is None                              # no dev predictions to say


def test_a_curve_that_flattened_passes():
    c = phase_check(Run(), "finetune", "sst", np.array([0.40, 0.55, 0.60, 0.62, 0.625, 0.624, 0.63, 0.626]), CHECK)
    assert c.trained and c.evaluations == 8
    assert c.last_gain == pytest.approx(0.63 - 0.625)                         # last 2 of 8 against the 6 before
    assert "flattened" in c.why and "+0.005" in c.why


def test_a_curve_still_rising_is_undertrained_with_its_last_gain():
    c = phase_check(Run(), "finetune", "sst", np.array([0.51, 0.53, 0.55, 0.57, 0.59, 0.61, 0.63, 0.65]), CHECK)
    assert not c.trained and c.last_gain == pytest.approx(0.65 - 0.61)
    assert c.why.startswith("still rising: its last 2 of 8 evaluations gained +0.040")


def test_a_curve_flat_at_chance_is_undertrained_though_it_is_flat():
    c = phase_check(Run(), "finetune", "sst", np.array([0.50, 0.505, 0.50, 0.51, 0.505, 0.50]), CHECK)
    assert not c.trained and c.at_chance
    assert "flat at chance" in c.why and "0.500 for a constant prediction" in c.why


def test_too_few_evaluations_cannot_show_a_plateau():
    c = phase_check(Run(), "finetune", "sst", np.array([0.6, 0.61]), CHECK)
    assert not c.trained and "2 dev evaluations, too few" in c.why and "evals_per_epoch" in c.why


def test_settings_move_the_line():
    scores = np.array([0.40, 0.55, 0.60, 0.62, 0.625, 0.624, 0.63, 0.64])
    assert not phase_check(Run(), "finetune", "sst", scores, CHECK).trained                   # +0.015
    assert phase_check(Run(), "finetune", "sst", scores, CHECK.model_copy(update={"tolerance": 0.02})).trained


def test_each_phase_of_a_sequential_run_is_checked_on_its_own():
    history = pd.DataFrame({"phase": ["para"] * 4 + ["sts"] * 4 + ["sst"] * 4,
                            "dev_score": [0.7, 0.8, 0.81, 0.81, 0.6, 0.7, 0.8, 0.9, 0.55, 0.6, 0.61, 0.6]})
    checks = curve_checks(Run(), "finetune", history, CHECK)
    assert [(c.phase, c.trained) for c in checks] == [("para", True), ("sts", False), ("sst", True)]
    assert curve_checks(Run(), "finetune", pd.DataFrame({"epoch": [1]}), CHECK)[0].why == \
        "its history has no dev scores"


class Book:
    """The ScoreBook part the row check reads: runs, seeds, experiments' settings, differences."""

    def __init__(self, runs, frozen, difference=None):
        self.data = NS(runs={r.name: r for r in runs},
                       params=NS(params=NS(ensembles={}),
                                 experiments={r.name: NS(finetune=NS(freeze_encoder=r.name in frozen)) for r in runs}))
        self.confidence = 0.95
        self._difference = difference

    def members(self, name):
        return [name]

    def difference(self, a, b, split, key):
        return self._difference


def est(values):
    return stats.Estimate(float(np.mean(values)), np.asarray(values, dtype=float), ())


def test_a_fine_tuned_row_still_rising_counts_when_it_clearly_beats_the_frozen_reference():
    rising = pd.DataFrame({"phase": ["sst"] * 4, "dev_score": [0.55, 0.6, 0.65, 0.7]})
    ft, frozen = Run("ft", histories={"finetune": rising}), Run("frozen", histories={"finetune": rising})
    better = Book([ft, frozen], frozen={"frozen"}, difference=est([0.1, 0.12, 0.14] * 50))
    row = row_check("ft", better, CHECK, reference="frozen", key="sst_acc")
    assert row.trained and "beats the frozen encoder (frozen) on dev sst_acc by +0.120" in row.evidence
    # not when the difference could be 0, not for a frozen row, not without a reference
    unclear = Book([ft, frozen], frozen={"frozen"}, difference=est([-0.01, 0.05, 0.1] * 50))
    assert not row_check("ft", unclear, CHECK, reference="frozen", key="sst_acc").trained
    assert not row_check("frozen", better, CHECK, reference="ft", key="sst_acc").trained
    assert not row_check("ft", better, CHECK).trained
    # nor for a row flat at chance: it learned nothing, whatever the reference did
    flat = Run("flat", histories={"finetune": pd.DataFrame({"phase": ["sst"] * 4, "dev_score": [0.5] * 4})})
    assert not row_check("flat", Book([flat, frozen], {"frozen"}, est([0.1] * 50)), CHECK, "frozen",
                         key="sst_acc").trained


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
        return NS(name=name, trained=trained)

    # "ft" counts as trained on one claim's column (the frozen reference) but not on another's
    claims = [NS(training=[row("ft", True), row("frozen", True)]), NS(training=[row("ft", False), row("b", True)]),
              NS(training=[])]
    rows = rows_checked(claims)
    assert rows == {"ft": False, "frozen": True, "b": True}
    card = Scorecard(claims, {}, False, rows=rows)
    assert card.rows_trained == 2 and card.rows_untrained == ["ft"]
    assert RowCheck("x").trained is False                      # no history: not trained
