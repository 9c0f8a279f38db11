"""What each stage reads from params.yaml: its settings, resolved (base merged, catalogue applied).

Every stage's library entry point takes one of these objects and nothing else from the params, so
a stage cannot read a setting that is not in its job's description (minbert.pipeline.plan): the settings
below *are* that part of the description. Cosmetic keys (`description`, the report's layout) are in
none of them but the report's; `predict_batch_size` only in the predictions'.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from minbert.core.tasks import TASKS
from minbert.params.catalogue import LoadedParams
from minbert.params.schema import (
    DataParams,
    Downsample,
    EnsembleParams,
    ExperimentParams,
    FinetuneParams,
    PretrainParams,
    SmartParams,
    Strict,
    deep_merge,
)
from minbert.params.validate import shared_tasks, teacher_members

Device = Literal["auto", "cpu", "cuda"]


class NetworkSettings(Strict):
    """How a stage that runs the network runs it."""
    device: Device = "auto"
    precision: Literal["auto", "bf16", "fp32"] = "auto"   # resolved per device by minbert.core.runtime
    deterministic: bool = False
    threads: int | None = None


class PretrainSettings(NetworkSettings):
    model: str                              # the model the pretraining starts from
    seed: int
    max_length: int
    pretraining: PretrainParams
    finetune: FinetuneParams | None = None  # para_first only: base.finetune, the training it shares


class FinetuneSettings(NetworkSettings):
    model: str | None                       # None: it starts from `pretrain`'s output (a job input)
    pretrain: str | None = None
    seed: int
    max_length: int
    finetune: FinetuneParams


class RetrainSettings(NetworkSettings):
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
    data: str = ""                          # data.dir, for the card


class EnsembleSettings(Strict):
    members: list[str]
    classification: str
    similarity: str


def _network(exp: ExperimentParams, precision: str | None = None) -> dict:
    return {"device": exp.device, "precision": precision or exp.precision, "deterministic": exp.deterministic,
            "threads": exp.threads}


def prepare_settings(lp: LoadedParams) -> DataParams:
    return lp.params.data


def pretrain_settings(lp: LoadedParams, name: str) -> PretrainSettings:
    """A pretraining reads its own section and, from `base`, the model, seed, run settings and
    max length; paraphrase-first also trains with base.finetune's heads, dropout and optimiser."""
    pre = lp.pretraining(name)
    base = lp.base
    return PretrainSettings(model=pre.model or base.model, seed=base.seed, max_length=base.max_length,
                            pretraining=pre, finetune=base.finetune if pre.kind == "para_first" else None,
                            **_network(base, pre.precision))


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
        "freeze_encoder": False, "distill": None, "walk_through": []})


def finetune_settings(exp: ExperimentParams) -> FinetuneSettings:
    return FinetuneSettings(model=None if exp.pretrain else exp.model, pretrain=exp.pretrain, seed=exp.seed,
                            max_length=exp.max_length, finetune=exp.finetune, **_network(exp))


def retrain_settings(exp: ExperimentParams) -> RetrainSettings:
    """Head retraining: the fine-tuned encoder frozen, fresh heads for its tasks (default: every
    fine-tuned task), its own schedule (largest task as the epoch), epochs, batch size, lr and
    downsampling."""
    rh, ft = exp.retrain_heads, exp.finetune
    train = ft.model_copy(update={
        "tasks": list(rh.tasks or ft.tasks), "schedule": rh.schedule, "epoch_unit": "largest", "epochs": rh.epochs,
        "batch_size": rh.batch_size, "lr": rh.lr, "head_lr": rh.lr, "freeze_encoder": True,
        "downsample": rh.downsample, "smart": SmartParams(), "pcgrad": False, "walk_through": [], "distill": None,
        "task_weights": {t: w for t, w in ft.task_weights.items() if t in (rh.tasks or ft.tasks)}})
    return RetrainSettings(seed=exp.seed, train=train, **_network(exp))


def predict_settings(exp: ExperimentParams) -> PredictSettings:
    return PredictSettings(batch_size=exp.predict_batch_size,
                           model_stage="retrain_heads" if exp.retrain_heads.enabled else "finetune", **_network(exp))


def export_settings(lp: LoadedParams, exp: ExperimentParams) -> ExportSettings:
    """An export reads its model and the card's texts; the base model's Hub id when it has one."""
    model = exp.model
    hub = None if exp.pretrain or not model or model.startswith(("/", ".")) or Path(model).exists() else \
        {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}.get(model, model)
    ex = lp.params.export
    return ExportSettings(model_stage=predict_settings(exp).model_stage, description=exp.description or "",
                          license=ex.license, language=ex.language, base_model=hub,
                          data=str(lp.params.data.dir))


def ensemble_settings(ens: EnsembleParams) -> EnsembleSettings:
    return EnsembleSettings(members=ens.members, classification=ens.classification, similarity=ens.similarity)


def teachers(lp: LoadedParams) -> dict[str, list[str]]:
    """Every teacher some experiment distils from -> the tasks it predicts: all those its models
    share, whatever its students take, so that a new student never changes what the others read."""
    out: dict[str, list[str]] = {}
    for exp in lp.experiments.values():
        d = exp.finetune.distill
        if d is not None and d.teacher not in out:
            members = teacher_members(d.teacher, lp.experiments, lp.groups, lp.params.ensembles)
            out[d.teacher] = sorted(shared_tasks(members, lp.experiments), key=list(TASKS).index)
    return out


def teach_settings(lp: LoadedParams, name: str, tasks: list[str]) -> TeachSettings:
    """A teacher predicts with the base's run settings (its batch size is fixed: the outputs are a
    student's training data, which a speed setting must not change); an ensemble teacher combines its
    members' probabilities by their mean (soft targets need probabilities) and scores as the
    ensemble does."""
    members = teacher_members(name, lp.experiments, lp.groups, lp.params.ensembles)
    ens = lp.params.ensembles.get(name)
    return TeachSettings(members={m: predict_settings(lp.experiments[m]).model_stage for m in members},
                         tasks=tasks, similarity=ens.similarity if ens else "mean", **_network(lp.base))


def report_settings(lp: LoadedParams) -> dict[str, Any]:
    """The report shows every section (descriptions, studies, params as used): all of it."""
    return lp.raw
