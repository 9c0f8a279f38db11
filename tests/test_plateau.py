"""The plateau rule (minbert.train.plateau): the learning-rate budget in closed form against the
schedule summed update by update, the trend and its standard error against numpy's least squares,
the rule's answers, and its error rates measured by simulation at each scale's geometry (the
evaluations of a phase and the dev rows each scores, params/papers.yaml `scales:`) and at the
evaluations' measured noise: a flat curve settles and one rising by twice the tolerance per window
does not, each at least 95% of the time."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from minbert.params import load_params
from minbert.params.studies import TrainingCheckParams
from minbert.train import plateau as rule
from minbert.train.optim import lr_at

ROOT = Path(__file__).resolve().parents[1]
CHECK = TrainingCheckParams()


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("total,warmup", [(100, 10), (37, 0), (50, 49), (1, 0), (1000, 100), (7, 3)])
def test_the_budget_in_closed_form_is_the_schedule_summed(schedule, total, warmup):
    summed = np.concatenate([[0.0], np.cumsum([lr_at(k, total, 1.0, warmup, schedule) for k in range(total + 20)])])
    assert rule.lr_budget(np.arange(total + 21), total, warmup, schedule) == pytest.approx(summed, abs=1e-9)


def test_a_budget_of_a_trillion_updates_costs_what_ten_do():
    t0 = time.perf_counter()
    b = rule.lr_budget(np.array([0, 5e11, 1e12]), int(1e12), int(1e11), "linear")
    assert time.perf_counter() - t0 < 0.1
    assert b[-1] == pytest.approx(0.5e11 + 0.45e12, rel=1e-9)        # half the warm-up + half the decay
    with pytest.raises(ValueError, match="unknown lr schedule"):
        rule.lr_budget(3, 10, 1, "step")


def test_the_trend_is_the_least_squares_slope_over_the_window_and_one_before():
    place = np.array([1.0, 2, 3, 4, 5, 6, 7, 8])
    values = np.array([0.5, 0.6, 0.65, 0.66, 0.67, 0.70, 0.71, 0.74])
    t = rule.trend(place, values, 0.0, 0.25, 0.01)
    x = place[5:] / 8                                              # the window (> 6) and one before (6)
    slope = np.polyfit(x, values[5:], 1)[0]
    assert t.gain == pytest.approx(slope * 0.25) and (t.fitted, t.inside) == (3, 2)
    assert t.se == pytest.approx(0.01 * 0.25 / math.sqrt(((x - x.mean()) ** 2).sum()))
    assert rule.trend(place[:1], values[:1], 0.0, 0.25, 0.01) is None          # nothing before the window


def test_the_rule_says_flat_up_down_or_unclear():
    t = rule.Trend(0.002, 0.003, 3, 2)
    assert rule.movement(t, 0.01) == "flat"                        # se 0.003 <= 0.01 / 1.645, gain within
    assert rule.movement(rule.Trend(0.012, 0.003, 3, 2), 0.01) == "up"
    assert rule.movement(rule.Trend(-0.05, 0.003, 3, 2), 0.01) == "flat"      # one-sided: a fall does not count
    assert rule.movement(rule.Trend(-0.05, 0.003, 3, 2), 0.01, 0.01) == "down"
    assert rule.movement(rule.Trend(0.002, 0.02, 3, 2), 0.01) == "unclear"    # too noisy to tell
    assert rule.movement(rule.Trend(0.09, 0.02, 3, 2), 0.01) == "up"          # clearly past it, noise or not
    assert rule.movement(rule.Trend(-0.09, 0.02, 3, 2), 0.01) == "flat"       # clearly within it (one-sided)
    assert rule.movement(rule.Trend(0.5, 0.02, 3, 2), math.inf, 0.01) == "flat"   # only a fall counts


DEV_ROWS = {"sst": 1101, "para": 3000, "sts": 863}     # the dev sets of ../shared/data (its README)


@pytest.fixture(scope="module", params=["laptop", "paper"])
def scale_geometries(request, tmp_path_factory):
    """Each geometry a scale fine-tunes a phase at (the one catalogue, params/papers.yaml's `scales:`, through the loader):
    (its evaluations' places in the phase's learning-rate budget, the dev rows each scores per task)."""
    folder = tmp_path_factory.mktemp(request.param)
    (folder / "params").symlink_to(ROOT / "params")
    (folder / "params.yaml").write_text(f"catalogue: papers\nscale: {request.param}\n")
    experiments = load_params(folder / "params.yaml").experiments.values()
    kinds = {(e.finetune.epochs, e.finetune.evals_per_epoch, e.finetune.dev_size, e.finetune.warmup_ratio,
              e.finetune.lr_schedule) for e in experiments if not e.finetune.freeze_encoder}
    out = []
    for epochs, evals, dev_size, warmup, schedule in sorted(kinds, key=str):
        place = rule.phase_positions(1000 * epochs, epochs * evals, int(warmup * 1000 * epochs), schedule)
        out.append((place, {t: min(dev_size or n, n) for t, n in DEV_ROWS.items()}))
    return request.param, out


def test_error_rates_at_each_scales_geometry_and_measured_noise(scale_geometries):
    """At each of the scale's geometries, on the overall score (the leaderboard formula, the measured
    noise of its three tasks) at the smallest tolerance the geometry tells (both a rise and a move either
    way): a flat curve settles and one rising by twice the tolerance per window fails, each at least 95%
    of 20,000 draws; below it the rule answers "unclear" rather than guess, and at the cap, told or not,
    it answers wrong (a flat curve rising, a rising one flat) at most 5% of the time."""
    scale, geometries = scale_geometries
    n = CHECK.noise
    for place, rows in geometries:
        noise = math.sqrt(sum((w * rule.evaluation_noise(rows[t], p.rows, p.jitter)) ** 2 for t, p, w in
                              (("sst", n.classification, 1), ("para", n.binary, 1), ("sts", n.regression, 0.5)))) / 3
        for two_sided in (False, True):     # a selection score (a rise counts) and a claim's column (both ways)
            smallest = rule.resolvable(place, 0.0, CHECK.window, noise, two_sided, CHECK.fit)
            tolerance = max(smallest * 1.02, CHECK.min_tolerance)
            flat, rising = rule.error_rates(place, CHECK.window, noise, tolerance, 7, two_sided, CHECK.fit)
            assert flat >= 0.95 and rising >= 0.95, (scale, len(place), two_sided, tolerance, flat, rising)
            below = rule.trend(place, np.zeros(len(place)), 0.0, CHECK.window, noise, CHECK.fit)
            assert rule.movement(below, smallest * 0.9, smallest * 0.9 if two_sided else math.inf) == "unclear"
        rng, cap = np.random.default_rng(11), CHECK.tolerance
        flat = rule.trend(place, rng.normal(0, noise, (20000, len(place))), 0.0, CHECK.window, noise, CHECK.fit)
        rising = rule.trend(place, 2 * cap * place / CHECK.window + rng.normal(0, noise, (20000, len(place))), 0.0,
                            CHECK.window, noise, CHECK.fit)
        assert np.mean(rule.movement(flat, cap) == "up") <= 0.05
        assert np.mean(rule.movement(rising, cap) == "flat") <= 0.05


def test_a_loop_stops_where_the_report_would_pass_the_curve():
    place = rule.phase_positions(1000, 12, 50, "constant")
    flat = 0.7 - 0.2 * np.exp(-12 * place)
    assert rule.settled(place, flat, 0.002, 0.01)
    assert not rule.settled(place, 0.5 + 0.1 * place, 0.002, 0.01)            # rising 0.025 a window
    assert not rule.settled(place, flat, 0.05, 0.01)                          # too noisy to tell: train on
    assert not rule.settled(place[:1], flat[:1], 0.002, 0.01)                 # one evaluation shows nothing


def test_where_the_old_statistic_flipped_a_coin_the_rule_says_it_cannot_tell():
    """The old statistic (the best in the window minus the best before) on the laptop's 6 evaluations
    at sd 0.005 and a 0.003 tolerance failed a curve flat since mid-budget about half the time; the
    rule at that noise cannot tell such a tolerance and says so (or that the curve clearly fell), and at a tolerance it can
    tell passes the flat curve and fails one rising by twice it, each at least 95% of the time."""
    place = rule.phase_positions(1000, 6, 100, "linear")
    noise = 0.005
    rng = np.random.default_rng(3)
    flat = rng.normal(0, noise, (20000, len(place)))
    inside = place > 1 - CHECK.window
    old_fail = np.mean(flat[:, inside].max(1) - flat[:, ~inside].max(1) > 0.003)
    assert 0.25 < old_fail < 0.75                                    # a coin flip
    answers = rule.movement(rule.trend(place, flat, 0.0, CHECK.window, noise), 0.003)
    assert np.mean(answers == "up") < 0.05 and np.mean(answers == "unclear") > 0.8     # never a coin flip
    tolerance = rule.resolvable(place, 0.0, CHECK.window, noise) * 1.02
    passed, failed = rule.error_rates(place, CHECK.window, noise, tolerance, seed=3)
    assert passed >= 0.95 and failed >= 0.95


def test_the_noise_measurement_splits_a_change_into_its_rows_and_the_models_jitter():
    """scripts/evaluation_noise.py on constructed predictions: rows whose correctness flips at random
    give a per-row part of the square root of the share that flips and no jitter; a whole block of rows
    flipping together (the model moving) adds jitter, which more rows would not average away."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluation_noise", ROOT / "scripts" / "evaluation_noise.py")
    noise = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noise)
    rng = np.random.default_rng(5)
    rows, evaluations = 2000, 30
    labels = rng.integers(0, 2, rows)
    right = rng.random(rows) < 0.8
    flip = rng.random((evaluations, rows)) < 0.05                 # each evaluation: 5% of rows off their base
    predictions = np.where(right ^ flip, labels, 1 - labels)
    got = noise.decompose("para", labels, predictions, draws=100)
    assert got["per_row"] == pytest.approx(math.sqrt(got["flips"]), rel=0.1)
    assert got["flips"] == pytest.approx(2 * 0.05 * 0.95, rel=0.1) and got["jitter"] < 0.005
    block = np.arange(rows) < 200                                 # 10% of the rows move together
    moved = rng.random(evaluations) < 0.5
    predictions = np.where(right ^ flip ^ (block & moved[:, None]), labels, 1 - labels)
    jittered = noise.decompose("para", labels, predictions, draws=100)
    assert jittered["jitter"] > 0.03 and jittered["change"] > got["change"]
