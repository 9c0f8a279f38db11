"""What a fine-tuning run works with and where it stands: the plan of its updates, its state
(saved as `last.pt` after every epoch, minbert.train.resumable), the options of one `fit` call,
`Training` (the model, optimiser, data and settings of the run) and the epoch's running totals.
The loop that moves them is minbert.train.loop."""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from minbert.core.layout import BEST_STATE_FILE, STATE_FILE
from minbert.core.runtime import autocast, precision_name
from minbert.core.settings import Finetune
from minbert.data.batches import TaskData
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer
from minbert.train.distributed import DistInfo
from minbert.train.objectives import TaskObjective, build_objective
from minbert.train.optim import AdamW
from minbert.train.resumable import SavedParts, load_training_state, save_training_state
from minbert.train.schedules import epoch_plan, sequential_phases

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the plan

@dataclass
class Plan:
    """Every epoch's updates, fixed before the first step (so the lr schedule knows its length).

    `phases` are the task groups trained one after another: one group of all tasks, or one task
    per group for sequential fine-tuning. Each phase runs the learning-rate schedule on its own
    updates (`schedule`): a linear warm-up over `warmup_ratio` of the phase's updates from its first,
    then the rate held (`constant`) or decayed to 0 at the phase's last update (`linear`, `cosine`),
    so a later phase of a sequential run gets the whole schedule too, as a constant rate gives every
    phase its share. A run of one phase is the schedule over all its updates."""
    phases: list[list[str]]
    epochs: dict[tuple[int, int], list[tuple[str, ...]]]     # (phase, epoch) -> updates
    total_updates: int
    phase_updates: list[int]                                 # each phase's updates, all its epochs
    warmup_ratio: float

    @classmethod
    def build(cls, cfg: Finetune, tasks: list[str], sizes: dict[str, int], seed: int) -> Plan:
        sequential = cfg.schedule == "sequential"
        phases = sequential_phases(tasks) if sequential else [tasks]
        epochs = {}
        for pi, phase_tasks in enumerate(phases):
            unit = cfg.epoch_unit if cfg.epoch_unit in ("smallest", "largest") or cfg.epoch_unit in phase_tasks \
                else "smallest"
            for epoch in range(cfg.epochs):
                epochs[(pi, epoch)] = epoch_plan("task_by_task" if sequential else cfg.schedule,
                                                 {t: sizes[t] for t in phase_tasks}, cfg.batch_size, unit, seed,
                                                 epoch, cfg.temperature, cfg.max_steps_per_epoch)
        per_phase = [sum(len(epochs[(pi, e)]) for e in range(cfg.epochs)) for pi in range(len(phases))]
        return cls(phases, epochs, sum(per_phase), per_phase, cfg.warmup_ratio)

    def schedule(self, phase: int) -> tuple[int, int]:
        """(updates, warm-up updates) of the phase's learning-rate schedule: the `total_steps` and
        `warmup_steps` of minbert.train.optim.lr_at, whose `step` counts the phase's updates from 0."""
        n = self.phase_updates[phase]
        return n, int(self.warmup_ratio * n)

    def walked(self, phase: int, epoch: int, task: str) -> int:
        """How many batches of `task` the phase's epochs before `epoch` drew."""
        return sum(task in update for e in range(epoch) for update in self.epochs[(phase, e)])

    def drawn(self, task: str) -> int:
        """How many batches of `task` the whole run draws."""
        return sum(task in update for updates in self.epochs.values() for update in updates)


# ---------------------------------------------------------------- the state

@dataclass
class TrainState:
    """Where a run is; saved after every epoch (with the model, optimiser and RNGs) as last.pt."""
    phase: int = 0
    epoch: int = 0                    # within the phase
    update: int = 0                   # global, across epochs and phases
    phase_start: int = 0              # the `update` at which the current phase began (its schedule's step 0)
    lr_budget: float = 0.0            # the learning rate summed over those updates, each phase on its own
                                      # schedule (history.csv's `lr_budget`, the training check's axis)
    history: list = field(default_factory=list)
    best_score: float = -math.inf
    best_epoch: float = -1          # the history's `epoch` of the best evaluation
    best_dev: dict = field(default_factory=dict)
    phase_best: float = -math.inf     # sequential: each phase keeps its own best
    stale: int = 0                    # evaluations in a row without improvement (early stopping)
    stopped: bool = False             # early stopping ended the current phase
    seconds: float = 0.0
    examples: int = 0
    dev_before: dict | None = None


@dataclass
class FitOptions:
    """How one `fit` call runs, beside the training settings (minbert.core.settings.Finetune)."""
    out_dir: Path                               # where model.pt and history.csv go when it has finished
    seed: int = 0                               # the run's seed, device and precision: an experiment's
    device: torch.device = torch.device("cpu")  # training (minbert.train.experiment) sets them from its settings
    bf16: bool = False
    fp16: bool = False                          # fp16 autocast, trained with a gradient scaler
    state_dir: Path | None = None               # the resumable state; default <out_dir>.state
    # the job's resolved description and its fingerprint (minbert.pipeline.runinfo, which computes
    # it once, runtime included): a state is resumed only when saved under the same one; default: the
    # settings, seed and data sizes, with where and how the run runs
    description: dict | None = None
    fingerprint: str | None = None
    dist_info: DistInfo = field(default_factory=DistInfo)
    resume: bool = True
    stop_after_epochs: int | None = None        # stop (state saved) after this many epochs of this call
    checkpoint_extra: dict = field(default_factory=dict)   # more keys for model.pt (experiment, stage)
    progress: bool = True
    evaluate_first: bool = False                # dev metrics of the starting model (FitResult.dev_before)
    cuda_graphs: bool = True                    # on CUDA, the captured step where the run allows it

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)
        self.state_dir = Path(self.state_dir) if self.state_dir is not None else \
            self.out_dir.with_name(self.out_dir.name + ".state")

    @property
    def precision(self) -> str:
        return precision_name(self.bf16, self.fp16)


@dataclass
class Training:
    """What one `fit` call works with: fixed for the call, but for the running totals and the best
    model not yet written."""
    model: MultitaskModel
    tokenizer: Tokenizer
    train: dict[str, TaskData]
    dev: dict[str, TaskData]
    cfg: Finetune
    options: FitOptions
    optimizer: AdamW
    params: list
    momentum: object | None                     # SMART's momentum copy of the model (or None)
    generators: dict[str, torch.Generator]
    fingerprint: str
    description: dict
    totals: EpochTotals
    features: dict = field(default_factory=dict)       # task -> its training split's stored embeddings
    dev_features: dict = field(default_factory=dict)   # task -> its dev split's (minbert.train.frozen)
    objectives: dict = field(default_factory=dict)     # task -> its TaskObjective (Training.objective)
    captured: object | None = None              # minbert.train.step.CapturedSteps, on CUDA
    pending_best: dict | None = None            # the best model since best.pt was last written (minbert.train.loop)
    scaler: object | None = None                # torch.amp.GradScaler of an fp16 run
    trackers: object | None = None              # minbert.train.tracking.Trackers (main rank, finetune.tracking)
    progress: object | None = None              # minbert.core.progress.Progress (main rank): for `minbert progress`
    progress_from: tuple = (0, 0.0)             # (update, time) this process started at: its rate
    eval_seconds: tuple = (0.0, 0)              # dev evaluations' total seconds and count so far

    @property
    def device(self) -> torch.device:
        return self.options.device

    @property
    def dist(self) -> DistInfo:
        return self.options.dist_info

    @property
    def state_dir(self) -> Path:
        return self.options.state_dir

    @property
    def last_path(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def best_path(self) -> Path:
        return self.state_dir / BEST_STATE_FILE

    @property
    def precision(self) -> str:
        return self.options.precision

    def amp(self):
        return autocast(self.device, self.precision)

    def objective(self, task: str) -> TaskObjective:
        """The task's training objective (minbert.train.objectives), built on first use."""
        if task not in self.objectives:
            self.objectives[task] = build_objective(task, self.model, self.cfg, self.train[task].soft is not None,
                                                    self.momentum, self.generators["smart"])
        return self.objectives[task]


def _saved_parts(tr: Training) -> SavedParts:
    return SavedParts({"model": tr.model, "momentum": tr.momentum.module if tr.momentum is not None else None,
                       "scaler": tr.scaler}, tr.optimizer, tr.device, tr.generators)


def save_state(tr: Training, state: TrainState) -> None:
    save_training_state(tr.last_path, fingerprint=tr.fingerprint, description=tr.description,
                        position=asdict(state), parts=_saved_parts(tr))


def resume_state(tr: Training) -> TrainState | None:
    """The saved state when it belongs to this job (minbert.train.resumable); None otherwise."""
    position = load_training_state(tr.last_path, fingerprint=tr.fingerprint, description=tr.description,
                                   parts=_saved_parts(tr), log=log)
    if position is None:
        return None
    state = TrainState(**position)
    log.info("resuming from %s at phase %d epoch %d", tr.last_path, state.phase, state.epoch)
    return state


# ---------------------------------------------------------------- one epoch

class EpochTotals:
    """An epoch's running totals, kept where they are computed: losses on the device, outputs
    (copies) on the device, labels and counts on the host (which knew them first). The host reads
    the device's part once per CHECK_EVERY updates (the non-finite check) and at the end of the
    epoch (the history row), never per batch. One object serves the whole run (`reset` at each
    epoch), so a captured step (minbert.train.step) always adds into the same tensors."""

    def __init__(self, tasks: list[str], device: torch.device):
        self.tasks = list(tasks)
        self.loss = torch.zeros(len(tasks), device=device)          # Σ loss · n per task
        # the first update whose loss of each task was not finite (-1: none yet)
        self.first_bad = torch.full((len(tasks),), -1, dtype=torch.long, device=device)
        self.flag = torch.zeros(1, device=device)      # non-finite losses this update (all ranks after the all-reduce)
        self.flagged = torch.zeros(1, device=device)   # summed over the epoch's updates so far
        self.reset()

    def reset(self) -> None:
        self.loss.zero_()
        self.first_bad.fill_(-1)
        self.flag.zero_()
        self.flagged.zero_()
        self.outputs: dict[str, list[torch.Tensor]] = {t: [] for t in self.tasks}
        self.labels: dict[str, list[np.ndarray]] = {t: [] for t in self.tasks}
        self.n = {t: 0 for t in self.tasks}

    def add_loss(self, task: str, loss: torch.Tensor, n: int, update, flag: torch.Tensor) -> None:
        """The device part (no host read; a captured step records it): the loss sum, the first
        non-finite update, the non-finite count in `flag`. `update`: an int or a device scalar."""
        k = self.tasks.index(task)
        loss = loss.detach().float()
        self.loss[k] += loss * n
        bad = ~torch.isfinite(loss)
        self.first_bad[k] = torch.where(bad & (self.first_bad[k] < 0), update, self.first_bad[k])
        flag += bad

    def add_outputs(self, task: str, output: torch.Tensor, labels: np.ndarray) -> None:
        self.outputs[task].append(output)
        self.labels[task].append(labels)
        self.n[task] += len(labels)
