"""Multi-task schedules visit the tasks in the order minbert/train/schedules.py documents."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from minbert.params.finetune import SCHEDULES
from minbert.train.schedules import epoch_plan, sampling_probabilities, sequential_phases, unit_batches

TASKS = ["sst", "para", "sts"]
SIZES = {"sst": 100, "para": 400, "sts": 60}   # smallest: sts (60 rows), largest: para (400 rows)
BS = 16


def sized(tasks) -> dict[str, int]:
    """The plan's task sizes, in the order the tasks take turns."""
    return {t: SIZES[t] for t in tasks}


def counts(plan) -> Counter:
    return Counter(t for update in plan for t in update)


def test_unit_batches_per_epoch_unit():
    assert unit_batches(SIZES, BS, "smallest") == math.ceil(60 / BS) == 4
    assert unit_batches(SIZES, BS, "largest") == math.ceil(400 / BS) == 25
    assert unit_batches(SIZES, BS, "sst") == math.ceil(100 / BS) == 7
    assert unit_batches({"sst": 0}, BS, "smallest") == 1   # never an empty epoch
    with pytest.raises(ValueError, match="epoch_unit"):
        unit_batches(SIZES, BS, "nli")


def test_round_robin_zips_one_update_per_task_in_task_order():
    plan = epoch_plan("round_robin", sized(TASKS), BS)
    assert plan == [("sst",), ("para",), ("sts",)] * 4
    # the order follows `tasks`, not the size dict
    assert epoch_plan("round_robin", sized(["sts", "sst"]), BS)[:4] == [("sts",), ("sst",), ("sts",), ("sst",)]


@pytest.mark.parametrize("unit,steps", [("smallest", 4), ("largest", 25), ("sst", 7), ("para", 25), ("sts", 4)])
def test_epoch_unit_sets_the_number_of_zipped_steps(unit, steps):
    assert len(epoch_plan("round_robin", sized(TASKS), BS, epoch_unit=unit)) == steps * len(TASKS)
    assert len(epoch_plan("simultaneous", sized(TASKS), BS, epoch_unit=unit)) == steps
    assert len(epoch_plan("drop_round_robin", sized(TASKS), BS, epoch_unit=unit)) == steps
    assert len(epoch_plan("proportional", sized(TASKS), BS, epoch_unit=unit)) == steps * len(TASKS)


def test_drop_round_robin_draws_one_task_per_step_seeded():
    plan = epoch_plan("drop_round_robin", sized(TASKS), BS, epoch_unit="largest", seed=3, epoch=1)
    assert len(plan) == 25 and all(len(u) == 1 and u[0] in TASKS for u in plan)
    assert plan == epoch_plan("drop_round_robin", sized(TASKS), BS, epoch_unit="largest", seed=3, epoch=1)
    assert plan != epoch_plan("drop_round_robin", sized(TASKS), BS, epoch_unit="largest", seed=4, epoch=1)
    assert plan != epoch_plan("drop_round_robin", sized(TASKS), BS, epoch_unit="largest", seed=3, epoch=2)
    # uniform over tasks: over many epochs each task is drawn about a third of the time
    many = [u for e in range(200) for u in epoch_plan("drop_round_robin", sized(TASKS), BS, "largest", 0, e)]
    observed = [counts(many)[t] for t in TASKS]
    assert chisquare(observed).pvalue > 1e-3, observed


def test_simultaneous_sums_all_tasks_every_update():
    plan = epoch_plan("simultaneous", sized(TASKS), BS)
    assert plan == [("sst", "para", "sts")] * 4


def test_task_by_task_runs_each_task_in_full_in_order():
    plan = epoch_plan("task_by_task", sized(TASKS), BS)
    expected = {t: math.ceil(n / BS) for t, n in SIZES.items()}   # 7, 25, 4
    assert counts(plan) == expected
    # contiguous blocks, in task order
    assert [u[0] for u in plan] == ["sst"] * 7 + ["para"] * 25 + ["sts"] * 4
    assert epoch_plan("task_by_task", sized(["para"]), BS) == [("para",)] * 25


@pytest.mark.parametrize("schedule,temperature", [("proportional", 1.0), ("temperature", 2.0),
                                                  ("temperature", 5.0)])
def test_sampling_frequencies_match_probabilities(schedule, temperature):
    sizes = np.array([SIZES[t] for t in TASKS], dtype=float)
    expected_p = sizes ** (1 / temperature) / (sizes ** (1 / temperature)).sum()   # independent formula
    assert np.allclose(sampling_probabilities(SIZES, temperature), expected_p)
    draws = [u for e in range(100) for u in
             epoch_plan(schedule, sized(TASKS), BS, epoch_unit="largest", seed=7, epoch=e, temperature=temperature)]
    assert all(len(u) == 1 for u in draws)
    observed = np.array([counts(draws)[t] for t in TASKS])
    n = observed.sum()
    assert n == 100 * 25 * 3
    assert chisquare(observed, expected_p * n).pvalue > 1e-3, (observed / n, expected_p)
    assert np.allclose(observed / n, expected_p, atol=0.01)


def test_temperature_flattens_towards_uniform():
    p1, p2, p_inf = (sampling_probabilities(SIZES, T) for T in (1.0, 2.0, 1e9))
    assert p1[1] > p2[1] > p_inf[1]            # the largest task loses share as T grows
    assert np.allclose(p_inf, 1 / 3, atol=1e-6)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES])
def test_plans_are_deterministic_and_capped_by_max_updates(schedule):
    # sequential fine-tuning plans each phase (one task) task by task (minbert.train.training.Plan)
    tasks, schedule = (["para"], "task_by_task") if schedule == "sequential" else (TASKS, schedule)
    a = epoch_plan(schedule, sized(tasks), BS, seed=5, epoch=2)
    assert a == epoch_plan(schedule, sized(tasks), BS, seed=5, epoch=2)
    capped = epoch_plan(schedule, sized(tasks), BS, seed=5, epoch=2, max_updates=3)
    assert capped == a[:3] and len(capped) == 3
    assert epoch_plan(schedule, sized(tasks), BS, seed=5, epoch=2, max_updates=10_000) == a


def test_unknown_schedule_and_sequential_phases():
    with pytest.raises(ValueError, match="unknown schedule"):
        epoch_plan("random", sized(TASKS), BS)
    assert sequential_phases(TASKS) == [["sst"], ["para"], ["sts"]]
