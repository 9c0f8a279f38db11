"""A training run's updates as its loop plans them (minbert.train.training.Plan), counted in closed
form: every epoch of a phase plans alike, a schedule that draws tasks at random by its expectation, so
what the estimate costs does not grow with the epochs or the updates."""
from __future__ import annotations

import math
from dataclasses import dataclass

from minbert.train.schedules import sampling_probabilities, sequential_phases, unit_batches


@dataclass
class PhasePlan:
    """One phase of a training run as its loop plans it: its tasks, its updates an epoch, how many
    of all its updates train each task (an expectation for a schedule that draws tasks at random)
    and its updates in all."""
    tasks: list[str]
    per_epoch: int
    per_task: dict[str, float]
    updates: int


@dataclass
class Planned:
    """A training run's updates as its loop plans them: its phases and the updates in all."""
    phases: list[PhasePlan]
    total: int


def planned_updates(cfg, tasks: list[str], sizes: dict[str, int]) -> Planned:
    """The updates minbert.train.training.Plan builds for `cfg` over `sizes`, summed in closed form
    (every epoch of a phase plans alike, a random schedule by its expectation): the cost of the
    estimate does not grow with the epochs or the updates."""
    sequential = cfg.schedule == "sequential"
    phases = sequential_phases(tasks) if sequential else [tasks]
    planned = []
    for phase in phases:
        unit = cfg.epoch_unit if cfg.epoch_unit in ("smallest", "largest") or cfg.epoch_unit in phase else "smallest"
        counts, n = epoch_counts("task_by_task" if sequential else cfg.schedule, {t: sizes[t] for t in phase},
                                 cfg.batch_size, unit, cfg.temperature, cfg.max_steps_per_epoch)
        planned.append(PhasePlan(list(phase), n, {t: c * cfg.epochs for t, c in counts.items()}, n * cfg.epochs))
    return Planned(planned, sum(p.updates for p in planned))


def epoch_counts(schedule: str, sizes: dict[str, int], batch_size: int, unit: str, temperature: float,
                 cap: int | None) -> tuple[dict[str, float], int]:
    """One epoch of minbert.train.schedules.epoch_plan counted without listing it: (the updates that
    train each task, the updates), the first `cap` only."""
    tasks, k = list(sizes), len(sizes)
    if schedule == "task_by_task":
        left, counts = cap or math.inf, {}
        for t in tasks:
            counts[t] = min(max(1, math.ceil(sizes[t] / batch_size)), left)
            left -= counts[t]
        return counts, int(sum(counts.values()))
    per_epoch = unit_batches(sizes, batch_size, unit) * (k if schedule != "simultaneous" and
                                                         schedule != "drop_round_robin" else 1)
    n = min(per_epoch, cap or per_epoch)
    if schedule == "simultaneous":
        return dict.fromkeys(tasks, n), n
    if schedule == "round_robin":                # the tasks in turn: the first n % k once more
        return {t: n // k + (i < n % k) for i, t in enumerate(tasks)}, n
    if schedule == "drop_round_robin":
        return dict.fromkeys(tasks, n / k), n
    if schedule in ("proportional", "temperature"):
        probs = sampling_probabilities(sizes, 1.0 if schedule == "proportional" else temperature)
        return {t: n * float(p) for t, p in zip(tasks, probs)}, n
    raise ValueError(f"unknown schedule {schedule!r}")
