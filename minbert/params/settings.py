"""What each stage reads from params.yaml: its settings, resolved (base merged, catalogue applied).

Every stage's library entry point takes one of these objects and nothing else from the params, so
a stage cannot read a setting that is not in its job's description (minbert.pipeline.plan): the settings
below *are* that part of the description. Cosmetic keys (`description`, the report's layout) are in
none of them but the report's; `predict_batch_size` only in the predictions'. How each is computed
from a params file is minbert.params.resolve, the planner's side: a job receives its settings
resolved and never runs the loader.
"""
from __future__ import annotations

from typing import Literal

from minbert.params.schema import (
    Downsample,
    FinetuneParams,
    PretrainParams,
    SmartParams,
    Strict,
    deep_merge,
)

Device = Literal["auto", "cpu", "cuda"]


class NetworkSettings(Strict):
    """How a stage that runs the network runs it."""
    device: Device = "auto"
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"   # resolved per device by minbert.core.runtime
    deterministic: bool = False
    threads: int | None = None


class TrainingSettings(NetworkSettings):
    """How a stage that trains runs its steps."""
    cuda_graphs: bool = True                # training steps captured on CUDA (minbert.train.step)


class PretrainSettings(TrainingSettings):
    model: str                              # the model the pretraining starts from
    seed: int
    max_length: int
    pretraining: PretrainParams
    finetune: FinetuneParams | None = None  # para_first only: base.finetune, the training it shares


class FinetuneSettings(TrainingSettings):
    model: str | None                       # None: it starts from `pretrain`'s output (a job input)
    pretrain: str | None = None
    seed: int
    max_length: int
    finetune: FinetuneParams


class RetrainSettings(TrainingSettings):
    seed: int
    train: FinetuneParams                   # head retraining's effective training settings


class PredictSettings(NetworkSettings):
    batch_size: int
    model_stage: Literal["finetune", "retrain_heads"]   # which training stage's model predicts


class TeachSettings(NetworkSettings):
    members: dict[str, Literal["finetune", "retrain_heads"]]   # the experiments it averages -> which model
    tasks: list[str]                        # the tasks it predicts (the ones its students distil)
    similarity: Literal["mean", "median"] = "mean"   # how a regression task's scores are combined


class ExportSettings(Strict):
    model_stage: Literal["finetune", "retrain_heads"]   # which training stage's model is exported
    description: str = ""                   # the experiment's, for the model card
    license: str
    language: str
    base_model: str | None = None           # the Hub id it was fine-tuned from, for the card's metadata
    start_model: str = ""                   # what it started from, as the card says it (a Hub id or a folder)
    pretraining: str | None = None          # the further pretraining between the two (name and kind)
    data: str = ""                          # data.dir, for the card
    demo_data: bool = False                 # data.dir holds the synthetic demo data (minbert.core.datasets)


class EnsembleSettings(Strict):
    members: list[str]
    classification: str
    similarity: str


def pretrain_splits(s: PretrainSettings) -> list[tuple[str, str]]:
    """The prepared (task, split) files a pretraining reads: what it trains on and its dev set."""
    kind = s.pretraining.kind
    tasks = s.pretraining.mlm.tasks if kind == "mlm" else ["nli"] if kind == "nli" else ["para"]
    return [(t, split) for t in tasks for split in ("train", "dev")]


def para_first_config(s: PretrainSettings) -> FinetuneParams:
    """Paraphrase-first pretraining trains the paraphrase task alone on all its data, with the
    pretraining's optimiser settings and base.finetune's heads, dropout and clipping (changed by
    the pretraining's own `finetune` section)."""
    pre = s.pretraining
    ft = FinetuneParams.model_validate(deep_merge(s.finetune.model_dump(), pre.finetune))
    return ft.model_copy(update={
        "tasks": ["para"], "schedule": "round_robin", "epochs": pre.epochs, "batch_size": pre.batch_size,
        "lr": pre.lr, "weight_decay": pre.weight_decay, "warmup_ratio": pre.warmup_ratio,
        "lr_schedule": pre.lr_schedule, "grad_clip": pre.grad_clip,
        "downsample": Downsample(mode="none"),
        "max_steps_per_epoch": pre.max_steps_per_epoch, "smart": SmartParams(), "pcgrad": False,
        "freeze_encoder": False, "distill": None, "walk_through": [], "early_stopping": None,
        "tracking": []})
