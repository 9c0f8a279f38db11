"""How a params file becomes each job's settings (minbert.params.settings): base merged into each
experiment, the catalogue applied, and only what the stage reads kept. The planner
(minbert.pipeline.plan) calls these; a job receives their result in its description and never
runs them, so an edit here that changes no job's settings re-runs nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from minbert.core.extensions import module_of
from minbert.core.tasks import TASKS, declarations
from minbert.params.catalogue import LoadedParams
from minbert.params.schema import EnsembleParams, ExperimentParams, NetworkSettings, TrainingSettings
from minbert.params.settings import (
    EnsembleSettings,
    EvaluateSettings,
    ExportSettings,
    FinetuneSettings,
    PredictSettings,
    PrepareSettings,
    PretrainSettings,
    RetrainSettings,
    TeachSettings,
    extras_off,
)
from minbert.params.validate import model_tasks, shared_tasks, teacher_members


def modules_of(heads, tasks) -> list[str]:
    """The user's modules that define the heads and losses of `tasks` under `heads`."""
    used = [module_of(kind, name) for t in tasks for kind, name in (("head", heads.head_of(t)),
                                                                     ("loss", heads.loss_of(t)))]
    return list(dict.fromkeys(m for m in used if m))


def declared(tasks, heads=None) -> dict:
    """What a job working with `tasks` (and, when it runs their model, `heads`) must know beyond the
    built-ins: the declarations of the user's tasks among them and the user's modules."""
    return {"tasks": declarations(tasks), "modules": modules_of(heads, tasks) if heads is not None else []}


def prepare_settings(lp: LoadedParams) -> PrepareSettings:
    """The data section and every task of the user's (prepare reads their files)."""
    return PrepareSettings(**lp.params.data.model_dump(), tasks=lp.params.tasks)


def evaluate_settings(exp: ExperimentParams) -> EvaluateSettings:
    return EvaluateSettings(**declared(model_tasks(exp)))


def pretrain_settings(lp: LoadedParams, name: str) -> PretrainSettings:
    """A pretraining reads its own section and, from `base`, the model, seed, run settings and
    max length; paraphrase-first also trains with base.finetune's heads, dropout and optimiser."""
    pre = lp.pretraining(name)
    base = lp.base
    first = pre.kind == "para_first"
    sources = [t for t in pre.mlm.tasks if t != "nli"] if pre.kind == "mlm" else ["para"] if first else []
    return PretrainSettings(model=pre.model or base.model, seed=base.seed, max_length=base.max_length,
                            pretraining=pre, finetune=base.finetune if first else None,
                            **declared(sources, base.finetune.heads if first else None),
                            **{**TrainingSettings.keys_of(base), "precision": pre.precision or base.precision})


def finetune_settings(exp: ExperimentParams) -> FinetuneSettings:
    return FinetuneSettings(model=None if exp.pretrain else exp.model, pretrain=exp.pretrain, seed=exp.seed,
                            max_length=exp.max_length, finetune=exp.finetune, **TrainingSettings.keys_of(exp),
                            **declared(exp.finetune.tasks, exp.finetune.heads))


def retrain_settings(exp: ExperimentParams) -> RetrainSettings:
    """Head retraining: the fine-tuned encoder frozen, fresh heads for its tasks (default: every
    fine-tuned task), its own schedule (largest task as the epoch), epochs, batch size, lr and
    downsampling."""
    rh, ft = exp.retrain_heads, exp.finetune
    train = ft.model_copy(update={
        "tasks": list(rh.tasks or ft.tasks), "schedule": rh.schedule, "epoch_unit": "largest", "epochs": rh.epochs,
        "batch_size": rh.batch_size, "lr": rh.lr, "head_lr": rh.lr, "freeze_encoder": True,
        "downsample": rh.downsample, **extras_off(),
        "task_weights": {t: w for t, w in ft.task_weights.items() if t in (rh.tasks or ft.tasks)}})
    return RetrainSettings(seed=exp.seed, train=train, **TrainingSettings.keys_of(exp),
                           **declared(model_tasks(exp), ft.heads))


def predict_settings(exp: ExperimentParams) -> PredictSettings:
    return PredictSettings(batch_size=exp.predict_batch_size,
                           model_stage="retrain_heads" if exp.retrain_heads.enabled else "finetune",
                           **NetworkSettings.keys_of(exp), **declared(model_tasks(exp), exp.finetune.heads))


def export_settings(lp: LoadedParams, exp: ExperimentParams) -> ExportSettings:
    """An export reads its model and the card's texts; the base model's Hub id when it has one."""
    model = exp.model
    hub = None if exp.pretrain or not model or model.startswith(("/", ".")) or Path(model).exists() else \
        {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}.get(model, model)
    ex = lp.params.export
    return ExportSettings(model_stage=predict_settings(exp).model_stage, description=exp.description or "",
                          license=ex.license, language=ex.language, base_model=hub,
                          data=str(lp.params.data.dir), **declared(model_tasks(exp), exp.finetune.heads))


def ensemble_settings(ens: EnsembleParams, tasks) -> EnsembleSettings:
    """`tasks`: those every member predicts (what the ensemble combines)."""
    return EnsembleSettings(members=ens.members, classification=ens.classification, similarity=ens.similarity,
                            **declared(tasks))


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
    modules = [m for member in members for m in predict_settings(lp.experiments[member]).modules]
    return TeachSettings(members={m: predict_settings(lp.experiments[m]).model_stage for m in members},
                         predicts=tasks, similarity=ens.similarity if ens else "mean",
                         **NetworkSettings.keys_of(lp.base), tasks=declarations(tasks),
                         modules=list(dict.fromkeys(modules)))


def report_settings(lp: LoadedParams) -> dict[str, Any]:
    """The report shows every section (descriptions, studies, params as used): all of it."""
    return lp.raw
