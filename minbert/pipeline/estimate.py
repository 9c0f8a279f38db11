"""How long a params file's pipeline will take on this machine, said before it starts (`minbert estimate`).

Every job the planner plans (minbert.pipeline.plan) is priced by what it will run here:
- a training run (fine-tuning, head re-training, paraphrase-first pretraining): its planned updates
  (minbert.train.training.Plan on the rows after downsampling, summed in closed form), each at the pipeline's own update
  measured here now (minbert.pipeline.costs.measure: minbert.train.loop's batches drawn as its loop
  draws them and the step it takes on this device, captured on CUDA where the run allows it; three
  passes for SMART),
  its dev evaluations (the evaluation pass, batches of 128), its checkpoints (the resumable state
  and the best model each epoch), the CUDA graphs it records, and its start-up;
  a fine-tuning that stops at its plateau (`finetune.until_plateau`), each phase halfway from the
  earliest stop its evaluations' noise allows to its cap (PLATEAU_PRICED; both ends said beside it);
- masked-LM and NLI pretraining: its steps (`max_steps_per_epoch` counted) and dev-loss passes
  (before the first epoch and after each of an epoch's `evals_per_epoch` parts);
- a prediction or a teacher: the forward passes over its rows; prepare, evaluate, ensemble, export
  and the report: their start-up and an allowance each (ALLOWANCE, measured on the demo).
Each job is priced at the precision it runs (a float32 pretraining measured apart). Then the jobs
are scheduled as the engine runs them (`snakemake --cores all`): each starts when the jobs it reads
from have finished and the machine has room, the head of the longest chain first (workflow/dag.py's
priorities). On a CPU a job that runs the network holds min(8, cores) of them
(fewer with --max-threads; its update is measured with as many torch threads, or the params'
`threads`); on GPUs, `jobs_per_gpu` of them share each device by time
slices, each at its own speed while at most SHARED_AT_FULL_SPEED run on it (bench/gpu_sharing.py),
sharing that throughput beyond. The estimate is when the last job ends; the work by stage is
said beside it, its rounded parts adding up to its rounded total.

The rows of each split are counted in the raw files (as prepare reads them, before it drops any).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.nli_data import NLI_DATA
from minbert.core.tasks import TASKS
from minbert.data.downsample import target_sizes
from minbert.data.raw import RAW_SPLITS, raw_path
from minbert.params.catalogue import LoadedParams
from minbert.params.fields import Downsample
from minbert.params.load import load_params
from minbert.pipeline.costs import EVAL_BATCH, StepCost, busy_note, measure, task_lengths, typical_length
from minbert.pipeline.plan import pipeline
from minbert.pipeline.planned import PhasePlan, planned_updates
from minbert.train import plateau as plateau_rule
from minbert.train.points import eval_points

NETWORK_THREADS = 8     # what a network stage asks of a CPU (minbert.pipeline.stage_specs.NETWORK)
# Four captured MiniLM jobs side by side on one H200 by time slices each ran at its full speed
# (4.15x one alone: bench/gpu_sharing.py); beyond four it is not measured, so more share that.
SHARED_AT_FULL_SPEED = 4
# Seconds of work of the stages that run no network, beyond their start-up: their run records on the
# demo (2 CPU cores, under other work), per job and for the report per experiment it shows.
ALLOWANCE = {"prepare": 1.0, "evaluate": 2.5, "ensemble": 3.0, "export": 3.0, "report": 4.0}
REPORT_PER_JOB = 0.05
# A job's start-up where nobody measured it: `minbert progress` prices a running pipeline's waiting
# jobs without measuring (its start-up is the demo's, 2 CPU cores: Python, the stage's imports, the model).
STARTUP = 6.0
# A phase that stops at its plateau (finetune.until_plateau) is priced this share of the way from the
# earliest stop its evaluations' noise allows to its cap: halfway, until a run records where its phases
# stopped (docs/results.md); the estimate says both ends beside it.
PLATEAU_PRICED = 0.5


@dataclass
class Machine:
    """Where the jobs run: CPU cores, GPUs and how many jobs share one (0 GPUs: the CPU), the most
    threads the engine gives a job (Snakemake's --max-threads) and torch's threads in a job (the
    params' `threads`; default: as many as the engine gives it)."""
    device: str = "cpu"
    cores: int = 1
    gpus: int = 0
    jobs_per_gpu: int = 4
    threads: int | None = None            # the engine's --max-threads
    torch_threads: int | None = None      # a job's torch threads (the params' base.threads)

    @property
    def reserved(self) -> int:
        """The cores the engine holds for a network job (workflow/dag.py's stage_threads)."""
        held = max(1, self.cores // (self.gpus * self.jobs_per_gpu)) if self.gpus else min(NETWORK_THREADS, self.cores)
        return max(1, min(held, self.threads or held))

    @property
    def job_threads(self) -> int:
        """The threads a network job's torch runs with (its update is measured with as many)."""
        return self.torch_threads or self.reserved

    def describe(self) -> str:
        torch_threads = f", torch on {self.job_threads}" if self.job_threads != self.reserved else ""
        if self.gpus:
            return f"{self.gpus} GPU(s), {self.jobs_per_gpu} jobs per GPU, {self.cores} cores{torch_threads}"
        at_once = max(1, self.cores // self.reserved)
        return f"{self.cores} cores, {self.reserved} threads a network job{torch_threads} ({at_once} at a time)"


@dataclass
class Priced:
    id: str
    stage: str
    seconds: float
    deps: list[str]
    network: bool
    updates: int = 0
    ends: tuple[float, float] | None = None          # a run that stops at its plateau: its seconds at either end


@dataclass
class Estimate:
    jobs: list[Priced] = field(default_factory=list)
    wall: float = 0.0                                 # when the last job ends, scheduled as the engine runs them
    chain: list[str] = field(default_factory=list)    # the longest chain of jobs, first to last
    chain_seconds: float = 0.0
    walls: tuple[float, float] | None = None          # were every run that stops at its plateau at either end

    @property
    def updates(self) -> int:
        return sum(j.updates for j in self.jobs)

    @property
    def seconds(self) -> dict[str, float]:
        """The work by stage (job seconds)."""
        out: dict[str, float] = {}
        for j in self.jobs:
            out[j.stage] = out.get(j.stage, 0.0) + j.seconds
        return out

    @property
    def total(self) -> float:
        """All the jobs' seconds: the work, whether or not jobs overlap."""
        return sum(j.seconds for j in self.jobs)


# ---------------------------------------------------------------- what each job costs

def train_rows(lp: LoadedParams, layout=None) -> dict[str, dict[str, int]]:
    """{split: {task: rows}} counted in the raw files (lines but the header)."""
    rows: dict[str, dict[str, int]] = {s: {} for s in RAW_SPLITS}
    for task in TASKS:
        for split in RAW_SPLITS:
            path = Path(raw_path(lp.params.data.dir, task, split))
            if path.is_file():
                with open(path, "rb") as f:
                    rows[split][task] = max(sum(1 for _ in f) - 1, 0)
    if lp.params.data.nli_file and Path(lp.params.data.nli_file).is_file():
        with open(lp.params.data.nli_file, "rb") as f:
            rows["train"][NLI_DATA.name] = sum(1 for _ in f)
    return rows


def sentences(task: str, heads) -> int:
    """Sentences an example costs: 1 for one sentence, 2 for a pair (read apart, or cross-encoded at
    twice the length), 3 for a hybrid pair (both)."""
    if task not in TASKS or not TASKS[task].pair:
        return 1
    return 3 if task in getattr(heads, "hybrid", ()) else 2


def phase_share(cfg, phase: PhasePlan, dev_rows: dict[str, int], plateau: float) -> float:
    """The share of a phase's planned updates a run prices: all of them, or where it stops at its
    plateau (finetune.until_plateau), `plateau` of the way from the earliest stop its evaluations'
    noise allows (the first evaluation at which a flat curve can read flat: minbert.train.plateau.
    earliest_stop, on the dev rows it scores) to its cap (0: the earliest, 1: the cap)."""
    rule = getattr(cfg, "until_plateau", None)
    if rule is None or not rule.enabled:
        return 1.0
    updates, warmup = phase.updates, int(cfg.warmup_ratio * phase.updates)    # Plan.schedule's
    at = [e * phase.per_epoch + k for e in range(cfg.epochs) for k in eval_points(phase.per_epoch, cfg.evals_per_epoch)]
    tasks = phase.tasks
    rows = {t: min(dev_rows.get(t, 0), cfg.dev_size or dev_rows.get(t, 0)) for t in tasks}
    noise = plateau_rule.weighted_noise(rows, plateau_rule.score_weights(tasks), rule.noise)
    place = plateau_rule.lr_budget(np.array(at, dtype=float), updates, warmup, cfg.lr_schedule)
    first = plateau_rule.earliest_stop(place, noise, rule)
    earliest = at[first - 1] / max(updates, 1) if first else 1.0
    return earliest + plateau * (1.0 - earliest)


def fit_seconds(cfg, tasks: list[str], rows: dict[str, dict[str, int]], cost: StepCost, seed: int,
                max_length: int | None = None, plateau: float = PLATEAU_PRICED) -> tuple[float, int]:
    """(seconds, updates) of one training run as its loop plans it (`planned_updates`) on `rows` ({split: {task: rows}}),
    each task's sentences weighed by their length against the one measured (cut to `max_length`:
    StepCost.weight); a run that stops at its plateau, each phase for its share of the plan
    (`phase_share`, at `plateau`)."""
    sizes, dev_rows = rows["train"], rows["dev"]
    tasks = [t for t in tasks if sizes.get(t)]
    if not tasks:
        return 0.0, 0
    target = target_sizes({t: sizes[t] for t in tasks}, cfg.downsample)
    plan = planned_updates(cfg, tasks, target)
    share = [phase_share(cfg, phase, dev_rows, plateau) for phase in plan.phases]
    frozen = cfg.freeze_encoder
    # a frozen encoder's outputs are computed once, but where dropout, SMART or a task's own layers
    # (extra_layers: its branch) make them differ each time (minbert.train.frozen.cacheable)
    cached = {t for t in tasks if frozen and not cfg.frozen_encoder_dropout and not cfg.smart.enabled
              and t not in cfg.heads.extra_layers}
    smart = set(cfg.smart.tasks or tasks) if cfg.smart.enabled else set()
    seconds = 0.0
    for phase, part in zip(plan.phases, share):
        for task, count in phase.per_task.items():
            if task in cached:
                continue
            n = cfg.batch_size * sentences(task, cfg.heads) * cost.weight(task, max_length)
            trains = not frozen or task in cfg.heads.extra_layers      # a branch's layers train
            seconds += count * cost.of(n, train=trains) * (3 if task in smart else 1) * part
    # the cached tasks' features, once per split
    seconds += sum(cost.of(target[t] * sentences(t, cfg.heads) * cost.weight(t, max_length), train=False)
                   for t in cached)
    evaluations = sum(share) * cfg.epochs * getattr(cfg, "evals_per_epoch", 1)
    cap = getattr(cfg, "dev_size", None)
    dev = {t: min(dev_rows.get(t, 0), cap or dev_rows.get(t, 0)) * sentences(t, cfg.heads) * cost.weight(t, max_length)
           for t in tasks}
    seconds += sum(_batched(dev[t], cost) for t in cached)
    seconds += evaluations * _batched(sum(n for t, n in dev.items() if t not in cached), cost)
    # the resumable state and the best model, written after each epoch
    seconds += sum(share) * cfg.epochs * cost.checkpoint
    # on CUDA, a graph recorded per task and batch shape (a few length buckets each)
    seconds += cost.capture * 3 * len(tasks)
    return seconds, round(sum(part * phase.updates for phase, part in zip(plan.phases, share)))


def _batched(n_sentences: float, cost: StepCost) -> float:
    batches = math.ceil(n_sentences / EVAL_BATCH)
    return cost.of(EVAL_BATCH, train=False) * batches


def pretrain_seconds(pre, rows: dict, cost: StepCost, base_finetune, seed: int) -> tuple[float, int]:
    """(seconds, updates) of a pretraining: its steps (at most `max_steps_per_epoch` an epoch) and a
    dev-loss pass before the first epoch and after each of an epoch's `evals_per_epoch` parts."""
    train, dev = rows["train"], rows["dev"]
    if pre.kind == "para_first":                 # one fine-tuning on para, at the pretraining's own pace
        evals = (pre.finetune or {}).get("evals_per_epoch", base_finetune.evals_per_epoch)
        cfg = base_finetune.model_copy(update={"epochs": pre.epochs, "batch_size": pre.batch_size,
                                               "max_steps_per_epoch": pre.max_steps_per_epoch,
                                               "evals_per_epoch": evals, "downsample": Downsample(mode="none")})
        return fit_seconds(cfg, ["para"], rows, cost, seed)
    if pre.kind == "mlm":
        n = sum(target_sizes({t: train.get(t, 0) for t in pre.mlm.tasks}, pre.mlm.downsample).values())
        n_dev = sum(dev.get(t, 0) for t in pre.mlm.tasks)
        per_example = 1
    else:                                        # nli: every part of an example through the encoder
        n, n_dev, per_example = train.get(NLI_DATA.name, 0), dev.get(NLI_DATA.name, 0), 3
    if pre.dev_size:
        n_dev = min(n_dev, pre.dev_size)
    steps = math.ceil(n / pre.batch_size)
    if pre.max_steps_per_epoch is not None:
        steps = min(steps, pre.max_steps_per_epoch)
    seconds = pre.epochs * steps * cost.of(per_example * pre.batch_size)
    passes = pre.epochs * pre.evals_per_epoch + 1     # before the first epoch, after each part of each
    seconds += passes * math.ceil(n_dev / pre.batch_size) * cost.of(per_example * pre.batch_size, False)
    seconds += max(pre.epochs - 1, 0) * cost.checkpoint
    return seconds, pre.epochs * steps


def runs_network(job) -> bool:
    """Whether a planned job runs the network (its stage asks for a GPU: minbert.pipeline.stage_specs.NETWORK)."""
    return "gpu" in job.spec.resources


def network_seconds(job, rows: dict, cost: StepCost, heads=None, plateau: float = PLATEAU_PRICED
                    ) -> tuple[float, int] | None:
    """(seconds, training updates) of what a planned job (minbert.pipeline.job.Job) runs on the
    network, its start-up left out: a training run's, a pretraining's, a prediction's or a teacher's
    passes over `rows` ({split: {task: rows}}) at `cost`; None for a job that runs no network. `heads`:
    the predicting experiment's (a hybrid pair is read three times); None: a pair counts twice.
    `plateau`: where between its earliest stop and its cap a fine-tuning that stops at its plateau is priced.
    `minbert progress` prices its waiting jobs with it at a unit cost per sentence."""
    if not runs_network(job):
        return None
    s = job.spec.model.model_validate(job.settings)
    cap = getattr(s, "max_length", None)
    if job.stage == "finetune":
        return fit_seconds(s.finetune, s.finetune.tasks, rows, cost, s.seed, cap, plateau)
    if job.stage == "retrain_heads":
        return fit_seconds(s.train, s.train.tasks, rows, cost, s.seed, cap)
    if job.stage == "pretrain":
        return pretrain_seconds(s.pretraining, rows, cost, s.finetune, s.seed)
    # a prediction's dev and test splits; a teacher's training rows, once per member
    splits, members = (s.splits, 1) if job.stage == "predict" else (["train"], len(s.members))
    n = sum(rows[split].get(t, 0) * sentences(t, heads) * cost.weight(t, cap) for t in s.predicts for split in splits)
    return _batched(n * members, cost), 0


def job_precision(job) -> str | None:
    """The precision a planned job's network runs at (a pretraining's own: minbert.params.resolve), or None."""
    return job.settings.get("precision") if runs_network(job) else None


def job_seconds(job, rows: dict, cost: StepCost, lp: LoadedParams, jobs_in_report: int,
                plateau: float = PLATEAU_PRICED) -> tuple[float, int]:
    """(seconds, training updates) of one planned job (minbert.pipeline.job.Job) on this machine:
    its network's work and start-up (`network_seconds`), or a job's that runs none (its start-up
    and an allowance)."""
    heads = lp.experiments[job.name].finetune.heads if job.stage == "predict" and job.name in lp.experiments \
        else None
    work = network_seconds(job, rows, cost, heads, plateau)
    if work is None:
        extra = REPORT_PER_JOB * jobs_in_report if job.stage == "report" else 0.0
        return cost.light_startup + ALLOWANCE.get(job.stage, 1.0) + extra, 0
    return work[0] + cost.startup, work[1]


# ---------------------------------------------------------------- scheduling them

def schedule(priced: list[Priced], machine: Machine) -> tuple[float, list[str], float]:
    """When the last job ends (seconds), scheduled as the engine runs them: a job starts once the jobs
    it reads from have ended and the machine has room (cores; a GPU slot for a network job on GPUs),
    the one heading the longest chain first; k network jobs on one GPU each run at
    min(1, SHARED_AT_FULL_SPEED / k) of their own speed. Also the longest chain (job ids) and its seconds."""
    by_id = {p.id: p for p in priced}
    height: dict[str, float] = {}
    after: dict[str, list[str]] = {p.id: [] for p in priced}
    for p in priced:
        for d in p.deps:
            after[d].append(p.id)
    for p in reversed(_topological(priced)):
        height[p.id] = p.seconds + max((height[q] for q in after[p.id]), default=0.0)
    head = max(priced, key=lambda p: height[p.id]) if priced else None
    chain, cur = [], head
    while cur is not None:
        chain.append(cur.id)
        nxt = [by_id[q] for q in after[cur.id]]
        cur = max(nxt, key=lambda p: height[p.id]) if nxt else None
    need = {p.id: machine.reserved if p.network else 1 for p in priced}
    waiting = {p.id: len(p.deps) for p in priced}
    ready = [p.id for p in priced if not p.deps]
    running: dict[str, list] = {}                  # id -> [seconds of its own left, its GPU or None]
    now, done = 0.0, 0
    while done < len(priced):
        ready.sort(key=lambda i: -height[i])
        for i in list(ready):
            if running and sum(need[r] for r in running) + need[i] > machine.cores:
                continue
            gpu = None
            if by_id[i].network and machine.gpus:
                on = [sum(1 for v in running.values() if v[1] == g) for g in range(machine.gpus)]
                gpu = min(range(machine.gpus), key=on.__getitem__)
                if on[gpu] >= machine.jobs_per_gpu:
                    continue
            running[i] = [by_id[i].seconds, gpu]
            ready.remove(i)
        if not running:
            break
        shared = {g: sum(1 for v in running.values() if v[1] == g) for g in range(machine.gpus)}
        rate = {i: (min(1.0, SHARED_AT_FULL_SPEED / shared[v[1]]) if v[1] is not None else 1.0)
                for i, v in running.items()}
        step = min(v[0] / rate[i] for i, v in running.items())
        now += step
        for i, v in list(running.items()):
            v[0] -= step * rate[i]
            if v[0] <= 1e-9:
                del running[i]
                done += 1
                for q in after[i]:
                    waiting[q] -= 1
                    if waiting[q] == 0:
                        ready.append(q)
    return now, chain, height[head.id] if head else 0.0


def _topological(priced: list[Priced]) -> list[Priced]:
    by_id, out, seen = {p.id: p for p in priced}, [], set()

    def visit(p: Priced) -> None:
        if p.id in seen:
            return
        seen.add(p.id)
        for d in p.deps:
            visit(by_id[d])
        out.append(p)
    for p in priced:
        visit(p)
    return out


def estimate(lp: LoadedParams, cost: StepCost, machine: Machine | None = None,
             cost_at: Callable[[str], StepCost] | None = None) -> Estimate:
    """The pipeline's jobs priced (the module docstring) and scheduled on `machine` (default: one CPU
    core). `cost_at`: the cost at the precision a job runs (default: `cost` for every job)."""
    machine = machine or Machine()
    rows = train_rows(lp)
    jobs = pipeline(lp, Layout())
    maker = {o: j.id for j in jobs for o in j.outputs}
    priced = []
    for job in jobs:
        precision = job_precision(job)
        job_cost = cost_at(precision) if cost_at and precision else cost
        seconds, updates = job_seconds(job, rows, job_cost, lp, len(jobs))
        # the planner names each read by the output that holds it (Job.deps): the jobs that make them
        deps = sorted({maker[d] for d in job.deps if d in maker} - {job.id})
        ends = tuple(job_seconds(job, rows, job_cost, lp, len(jobs), end)[0] for end in (0.0, 1.0)) \
            if job.stage == "finetune" else None
        priced.append(Priced(job.id, job.stage, seconds, deps, runs_network(job), updates,
                             ends if ends and ends[0] < ends[1] else None))
    wall, chain, chain_seconds = schedule(priced, machine)
    walls = None
    if any(p.ends for p in priced):           # the wall time were every such run to stop at either end
        walls = tuple(schedule([replace(p, seconds=p.ends[k]) if p.ends else p for p in priced], machine)[0]
                      for k in (0, 1))
    return Estimate(priced, wall, chain, chain_seconds, walls)


# ---------------------------------------------------------------- saying it

def fmt_seconds(seconds: float, tenths: bool = False) -> str:
    """Hours and minutes; in tenths of a minute (`tenths`) for a short run."""
    if tenths:
        return f"{seconds / 60:.1f} min"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def rounded_parts(parts: dict[str, float], unit: float = 60.0) -> tuple[dict[str, int], int]:
    """Each part in whole `unit`s, rounded so that they add up to the rounded total (the parts'
    floors, then the largest remainders rounded up); parts that come to 0 are left out."""
    total = round(sum(parts.values()) / unit)
    exact = {k: v / unit for k, v in parts.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:max(total - sum(out.values()), 0)]:
        out[k] += 1
    return {k: v for k, v in out.items() if v}, total


def _minutes(m: int, tenths: bool = False) -> str:
    if tenths:
        return f"{m / 10:.1f} min"
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def describe(est: Estimate, where: str, machine: Machine | None = None) -> str:
    """The estimate in a few lines: the wall time, the longest chain, the work by stage (its parts
    adding up to its total)."""
    machine = machine or Machine()
    tenths = est.total < 20 * 60                 # a short run in tenths of a minute, a long one in minutes
    parts, work = rounded_parts(est.seconds, 6.0 if tenths else 60.0)
    stages = " + ".join(f"{s} {_minutes(m, tenths)}" for s, m in sorted(parts.items(), key=lambda kv: -kv[1]))
    chain = " -> ".join(i.replace("@", " ") for i in est.chain if not i.startswith(("report", "prepare")))
    plateau = ""
    if est.walls:
        runs = sum(1 for j in est.jobs if j.ends)
        plateau = (f"; {runs} fine-tunings stop at their plateau, each priced halfway between the earliest stop its "
                   f"evaluations' noise allows and its cap: between {fmt_seconds(est.walls[0], tenths)} (all at the "
                   f"earliest) and {fmt_seconds(est.walls[1], tenths)} (all at their caps)")
    return (f"about {fmt_seconds(est.wall, tenths)} on {where}, {machine.describe()}: {len(est.jobs)} jobs, "
            f"{est.updates:,} training updates; the longest chain {fmt_seconds(est.chain_seconds, tenths)} ({chain}); "
            f"the work {_minutes(work, tenths)} = {stages or 'nothing'}{plateau}")


def machine_here(device_type: str, threads: int | None = None, cores: int | None = None,
                 jobs_per_gpu: int = 4, torch_threads: int | None = None) -> Machine:
    """This machine as the engine uses it by default (`snakemake --cores all`): every core this
    process may use, every visible GPU when the jobs run on CUDA."""
    gpus = 0
    if device_type == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    return Machine(device_type, cores or len(os.sched_getaffinity(0)), gpus, jobs_per_gpu, threads, torch_threads)


def estimate_lines(params: str, device: str | None = None, threads: int | None = None, cores: int | None = None,
                   jobs_per_gpu: int = 4, cpu_time: bool = False) -> list[str]:
    """`minbert estimate`: what it prints (the estimate, a line when the cores were busy, and one when
    the precision that runs is a slow one on this device). `cpu_time`: every cost measured in CPU
    seconds (`measure`)."""
    from minbert.core.runtime import MAX_THREADS, pick_device, precision_on, slow_precision

    for flag, n in (("--threads", threads), ("--cores", cores), ("--jobs-per-gpu", jobs_per_gpu)):
        if n is not None and not 1 <= n <= MAX_THREADS:
            raise MinBertError(f"{flag} {n}: expected a whole number from 1 to {MAX_THREADS}")
    lp = load_params(params)
    base = lp.base
    dev = pick_device(device or base.device)
    machine = machine_here(dev.type, threads, cores, jobs_per_gpu, base.threads)
    busy = None if cpu_time else busy_note(dev.type)      # before this process adds its own load
    with lp.registry.active():                            # the params' own tasks
        length = typical_length(lp, base.model)
        lengths = {t: n for t, (_, n) in task_lengths(lp, base.model).items()}
        measured = {}                                     # precision that runs -> its cost

        def cost_at(precision: str) -> StepCost:
            runs = precision_on(precision, dev)
            if runs not in measured:
                at = measure(base.model, dev.type, runs, machine.job_threads, length, base.cuda_graphs, cpu_time)
                measured[runs] = replace(at, length=length, lengths=lengths)
            return measured[runs]

        cost = cost_at(base.precision)
        priced = estimate(lp, cost, machine, cost_at)
    captured = dev.type == "cuda" and base.cuda_graphs
    runs = precision_on(base.precision, dev)
    others = "".join(f"; the jobs in {p} at its own step" for p in measured if p != runs)
    where = (f"{dev.type} ({runs}{others}, {'captured' if captured else 'eager'} steps, "
             f"sentences of {length} word pieces{', in CPU seconds' if cpu_time else ''})")
    notes = (busy, slow_precision(dev, runs))
    return [describe(priced, where, machine)] + [note for note in notes if note]
