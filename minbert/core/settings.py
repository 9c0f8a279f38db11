"""What each stage computes with: its job's settings as plain, frozen data (dataclasses).

The planner resolves a job's settings with the params' models (minbert.params.settings: base
merged, catalogue applied, every value checked) and writes them into the job's description; a
stage reads them back from its job file into the classes below (`read_settings`), which hold the
same keys and nothing of the schema: no validators, no defaults to keep in step. So the params'
schema and checks are no job's code (minbert.pipeline.code), and a change of a default re-runs
exactly the jobs whose resolved settings it changes, as their descriptions hold them.

The library reads settings by attribute, so it works as well with the params' models (the API and
the tests build models from them): what both must answer alike, the choice of a task's head and
loss (`HeadChoices`), is written once here and shared by the params' `HeadsParams`.

Each class has the fields of its params model of the same name (a test keeps them in step).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property, wraps
from typing import Any

from minbert.core.errors import MinBertError
from minbert.core.nli_data import NLI_DATA
from minbert.core.plain import FrozenMap, SettingsProblem, as_json, read
from minbert.core.registry import Registry, active
from minbert.core.tasks import TASKS, Task

frozen = dataclass(frozen=True, kw_only=True)


class HeadChoices:
    """A task's head, loss, pooling and depth under heads settings (`heads.<task>`, `losses`,
    `task_pooling`, `hidden_layers`), else what the task declares."""

    def heads_named(self) -> dict[str, str]:
        raise NotImplementedError

    def head_of(self, task: str, tasks: Mapping[str, Task] | None = None) -> str:
        """The name of `task`'s head: `heads.<task>`, else its declared head (in `tasks`, the tasks of
        the registry its settings were read with; default: the registry in use)."""
        return self.heads_named().get(task) or (TASKS if tasks is None else tasks)[task].head

    def loss_of(self, task: str, tasks: Mapping[str, Task] | None = None) -> str:
        """The name of `task`'s loss: `heads.losses.<task>`, else its declared loss (`tasks`: as `head_of`)."""
        return self.losses.get(task) or (TASKS if tasks is None else tasks)[task].loss

    def pooling_of(self, task: str) -> str:
        return self.task_pooling.get(task, self.pooling)

    def depth(self, task: str) -> int:
        """Hidden layers of `task`'s head."""
        return self.hidden_layers.get(task, 0) if isinstance(self.hidden_layers, Mapping) else self.hidden_layers

    def reads_setting(self, key: str, tasks) -> bool:
        """Whether the head of one of `tasks` reads the heads setting `key` (its declaration says so)."""
        heads = active().heads
        return any(key in heads[self.head_of(t)].settings for t in tasks)


def batch_statistic_tasks(heads: HeadChoices, tasks) -> list[tuple[str, str]]:
    """The (task, loss) pairs among `tasks` whose loss is a statistic of the whole batch (its
    declaration says so, whatever its name and wherever it is chosen)."""
    losses = active().losses
    return [(t, heads.loss_of(t)) for t in tasks if losses[heads.loss_of(t)].batch_statistic]


# ---------------------------------------------------------------- the sections

@frozen
class Downsample:
    mode: str
    size: int | None
    caps: Mapping[str, int | None]


@frozen
class Shared:
    tasks: tuple[str, ...]
    sizes: tuple[int | str, ...]          # units, `encoder` or `encoder/N` (minbert.model.blocks.shared_widths)
    activation: str


@frozen
class Heads(HeadChoices):
    EXTRA = "named_heads"                    # the `<task>: <head>` keys beside the settings
    pooling: str
    task_pooling: Mapping[str, str]
    prototypes_per_label: int
    losses: Mapping[str, str]
    cosine_target: str
    cosine_affine: bool
    shared: Shared | None
    hidden_layers: int | Mapping[str, int]
    extra_layers: Mapping[str, int]
    dropout: float
    symmetric_pairs: bool
    hybrid: tuple[str, ...]
    named_heads: Mapping[str, str] = field(default_factory=lambda: FrozenMap({}))   # the keys that are tasks

    def heads_named(self) -> dict[str, str]:
        return dict(self.named_heads)


@frozen
class Smart:
    enabled: bool
    lambda_s: float
    mu: float
    beta: float
    steps: int
    step_size: float
    epsilon: float
    noise_var: float
    tasks: tuple[str, ...] | None


@frozen
class Distill:
    teacher: str
    weight: float
    temperature: float
    tasks: tuple[str, ...] | None


@frozen
class EarlyStopping:
    patience: int
    min_delta: float


@frozen
class NoiseParts:
    jitter: float
    rows: float


@frozen
class EvaluationNoise:
    classification: NoiseParts
    binary: NoiseParts
    regression: NoiseParts


@frozen
class UntilPlateau:
    enabled: bool
    tolerance: float | None
    window: float | None
    fit: float | None
    window_evaluations: int | None
    min_evaluations: int | None
    noise: EvaluationNoise | None


@frozen
class Finetune:
    tasks: tuple[str, ...]
    schedule: str
    epoch_unit: str
    temperature: float
    task_weights: Mapping[str, float]
    epochs: int
    batch_size: int
    lr: float
    head_lr: float | None
    weight_decay: float
    warmup_ratio: float
    lr_schedule: str
    grad_clip: float | None
    hidden_dropout: float | None
    attention_dropout: float | None
    freeze_encoder: bool
    frozen_encoder_dropout: bool
    gradient_checkpointing: bool
    heads: Heads
    smart: Smart
    pcgrad: bool
    downsample: Downsample
    walk_through: tuple[str, ...]
    distill: Distill | None
    evals_per_epoch: int
    dev_size: int | None
    early_stopping: EarlyStopping | None
    until_plateau: UntilPlateau
    gradient_accumulation_steps: int
    tracking: tuple[str, ...]
    max_steps_per_epoch: int | None
    checkpoint_every: int
    compile: bool


@frozen
class Mlm:
    tasks: tuple[str, ...]
    mask_prob: float
    downsample: Downsample


@frozen
class Nli:
    objective: str
    temperature: float
    margin: float
    pooling: str


@frozen
class Pretraining:
    kind: str
    model: str | None
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_ratio: float
    lr_schedule: str
    grad_clip: float | None
    max_steps_per_epoch: int | None
    dev_size: int | None
    evals_per_epoch: int
    precision: str | None
    finetune: Any
    mlm: Mlm
    nli: Nli


# ---------------------------------------------------------------- what every stage's settings start from

@frozen
class Declarations:
    """The user's modules and declared tasks (empty: left out of a job file)."""
    OMIT_EMPTY = ("modules", "tasks")
    modules: tuple[str, ...] = ()
    tasks: Mapping[str, Any] = field(default_factory=lambda: FrozenMap({}))

    @cached_property
    def registry(self) -> Registry:
        """The built-in tasks, losses and heads with these declarations."""
        return Registry.of(list(self.modules), as_json(self.tasks))


def in_own_registry(run: Callable) -> Callable:
    """A library entry point whose first argument carries a registry (a job's settings: train,
    predict, teach, export; the loaded params: the report) runs in it, its declared tasks and the
    user's losses and heads, whoever calls it: a stage, a test, a script of the user's."""
    @wraps(run)
    def in_registry(s, *args, **kwargs):
        with s.registry.active():
            return run(s, *args, **kwargs)
    return in_registry


@frozen
class Network:
    device: str
    precision: str
    deterministic: bool
    threads: int | None


@frozen
class Training(Network):
    cuda_graphs: bool


def network_keys(settings, kind: type = Network) -> dict:
    """The keys of `kind` (`Network`, `Training`) with their values in `settings`."""
    return {f.name: getattr(settings, f.name) for f in fields(kind)}


# ---------------------------------------------------------------- each stage's settings

@frozen
class PrepareSettings(Declarations):
    dir: str
    nli_file: str | None
    include_cfimdb: bool
    on_bad_rows: str
    nli_dev_fraction: float
    seed: int


@frozen
class EvaluateSettings(Declarations):
    predicts: tuple[str, ...]
    splits: tuple[str, ...]


@frozen
class PretrainSettings(Training, Declarations):
    model: str
    seed: int
    max_length: int
    pretraining: Pretraining
    finetune: Finetune | None = None        # para_first only: the fine-tuning of the paraphrase task it runs


@frozen
class FinetuneSettings(Training, Declarations):
    model: str | None
    pretrain: str | None
    seed: int
    max_length: int
    finetune: Finetune


@frozen
class RetrainSettings(Training, Declarations):
    seed: int
    train: Finetune
    heads: tuple[str, ...]                  # the heads of the fine-tuned model it loads


@frozen
class PredictSettings(Network, Declarations):
    batch_size: int
    model_stage: str
    predicts: tuple[str, ...]
    splits: tuple[str, ...]
    heads: tuple[str, ...]                  # the heads its model holds (their code is the job's)


@frozen
class TeachSettings(Network, Declarations):
    members: Mapping[str, str]
    predicts: tuple[str, ...]
    similarity: str
    heads: tuple[str, ...]


@frozen
class ExportSettings(Declarations):
    model_stage: str
    predicts: tuple[str, ...]
    splits: tuple[str, ...]
    description: str
    license: str
    language: str
    base_model: str | None
    start_model: str
    pretraining: str | None
    data: str
    demo_data: bool
    heads: tuple[str, ...]


@frozen
class EnsembleSettings(Declarations):
    members: tuple[str, ...]
    classification: str
    similarity: str
    predicts: tuple[str, ...]
    splits: tuple[str, ...]


def read_settings(cls: type, data: dict, where: str):
    """A job's settings (JSON, as its job file holds them) as `cls`; a one-line error naming the
    key that is unknown, missing or of the wrong type."""
    try:
        return read(cls, data)
    except SettingsProblem as e:
        raise MinBertError(f"{where}: setting '{e.key}': {e}; a job file holds the settings the planner resolved: "
                           f"write it anew (python -m workflow.dag --resolve)") from None


def pretrain_splits(s) -> list[tuple[str, str]]:
    """The prepared (task, split) files a pretraining reads: what it trains on and its dev set."""
    kind = s.pretraining.kind
    tasks = s.pretraining.mlm.tasks if kind == "mlm" else [NLI_DATA.name] if kind == "nli" else ["para"]
    return [(t, split) for t in tasks for split in ("train", "dev")]
