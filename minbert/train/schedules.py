"""Multi-task schedules: which tasks each optimiser update trains on, for one epoch.

An epoch's plan is a list of updates; each update is a tuple of tasks whose losses are summed
before one optimiser step. With U = ceil(N_unit / batch_size) "unit batches", where N_unit is
the size of the epoch unit (`smallest` task, `largest` task, or a named task):

| schedule           | one epoch                                                               |
|--------------------|-------------------------------------------------------------------------|
| round_robin        | U steps; each step one update per task, in the order of `tasks`         |
|                    | (sequential round-robin: batches zipped, [sst], [para], [sts], ...)      |
| drop_round_robin   | U updates; each a task drawn uniformly at random (the others' batches   |
|                    | of that zipped step are dropped)                                        |
| simultaneous       | U updates; each sums the losses of all tasks                            |
| task_by_task       | every batch of the first task, then of the second, ...: ceil(n_t / bs)  |
|                    | updates per task, each task with its own size                           |
| proportional       | U * K updates; each a task drawn with probability proportional to n_t   |
| temperature        | U * K updates; probability proportional to n_t ** (1 / T)               |

Sequential single-task fine-tuning (`sequential`, SFT) trains one task after another, each for
all epochs, keeping each phase's best checkpoint; its per-epoch plan is task_by_task on one task
(see `sequential_phases`). Tasks with fewer batches than the plan asks for cycle through their
data again (reshuffled).
"""
from __future__ import annotations

import math
import random

import numpy as np


def unit_batches(task_sizes: dict[str, int], batch_size: int, epoch_unit: str) -> int:
    if epoch_unit == "smallest":
        n = min(task_sizes.values())
    elif epoch_unit == "largest":
        n = max(task_sizes.values())
    elif epoch_unit in task_sizes:
        n = task_sizes[epoch_unit]
    else:
        raise ValueError(f"epoch_unit {epoch_unit!r} is not smallest, largest or a trained task")
    return max(1, math.ceil(n / batch_size))


def sampling_probabilities(task_sizes: dict[str, int], temperature: float) -> np.ndarray:
    sizes = np.array([task_sizes[t] for t in task_sizes], dtype=float)
    w = sizes ** (1.0 / temperature)
    return w / w.sum()


def epoch_plan(schedule: str, sizes: dict[str, int], batch_size: int, epoch_unit: str = "smallest", seed: int = 0,
               epoch: int = 0, temperature: float = 2.0, max_updates: int | None = None) -> list[tuple[str, ...]]:
    """The updates of one epoch over the tasks of `sizes` (task -> training rows, in the order the
    tasks take turns), deterministic in (seed, epoch)."""
    tasks = list(sizes)
    rng = random.Random(seed * 1_000_003 + epoch)
    U = unit_batches(sizes, batch_size, epoch_unit)
    if schedule == "round_robin":
        plan = [(t,) for _ in range(U) for t in tasks]
    elif schedule == "drop_round_robin":
        plan = [(rng.choice(tasks),) for _ in range(U)]
    elif schedule == "simultaneous":
        plan = [tuple(tasks)] * U
    elif schedule == "task_by_task":
        plan = [(t,) for t in tasks for _ in range(max(1, math.ceil(sizes[t] / batch_size)))]
    elif schedule in ("proportional", "temperature"):
        probs = sampling_probabilities(sizes, 1.0 if schedule == "proportional" else temperature)
        draws = np.random.default_rng(seed * 1_000_003 + epoch).choice(len(tasks), size=U * len(tasks), p=probs)
        plan = [(tasks[i],) for i in draws]
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return plan[:max_updates] if max_updates else plan


def sequential_phases(tasks: list[str]) -> list[list[str]]:
    """SFT: one phase per task, in the order given."""
    return [[t] for t in tasks]
