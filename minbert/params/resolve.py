"""How a params file becomes each job's settings (minbert.params.settings): base merged into each
experiment, the catalogue applied, and only what the stage reads kept. The planner
(minbert.pipeline.plan) calls these; a job receives their result in its description and never
runs them, so an edit here that changes no job's settings re-runs nothing.

"Only what the stage reads" holds for the values too: a setting the run never reads under the
others (a switched-off feature's, the encoder's learning rate with the encoder frozen, ...) is put
back to its default in the job's settings (`finetune_read`, `pretraining_read`), so changing it
re-runs nothing; minbert.params.unread tells the user at load, from these same settings."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from minbert.core.datasets import is_demo_data
from minbert.core.layout import PREDICTED_SPLITS
from minbert.core.nli_data import NLI_DATA
from minbert.core.registry import active
from minbert.core.tasks import TASKS, declarations
from minbert.params.catalogue import LoadedParams
from minbert.params.fields import Downsample
from minbert.params.finetune import FinetuneParams
from minbert.params.heads import HeadsParams
from minbert.params.plateau import UntilPlateau
from minbert.params.schema import (
    EnsembleParams,
    ExperimentParams,
    MlmParams,
    NetworkSettings,
    NliParams,
    PretrainParams,
    TrainingSettings,
    deep_merge,
)
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
from minbert.params.tasks import TaskParams
from minbert.params.validate import model_tasks, shared_tasks, teacher_members


def _switched_off(model: BaseModel) -> dict[str, tuple[Any, str]]:
    """The sections of `model` that an `enabled: false` switches off: back to their defaults."""
    out = {}
    for key, value in model:
        if isinstance(value, BaseModel) and getattr(value, "enabled", True) is False:
            out[key] = (type(value)(), f"`{key}.enabled` is false")
    return out


def unread_finetune(ft: FinetuneParams, head_tasks: list[str] | None = None) -> dict[str, tuple[Any, str]]:
    """The fine-tuning settings a run with `ft` never reads: {key: (the default it stands for, why)}.
    `head_tasks`: the tasks whose heads the model gets from these settings (default: the trained
    ones; head retraining may add heads built from the fine-tuning's head settings)."""
    tasks = set(ft.tasks)
    heads = set(head_tasks or ft.tasks) | tasks
    d, hd = FinetuneParams(), HeadsParams()
    out = _switched_off(ft)
    if ft.schedule != "temperature":
        out["temperature"] = (d.temperature, f"it belongs to `schedule: temperature` (this is `{ft.schedule}`)")
    if ft.schedule == "sequential":
        out["epoch_unit"] = (d.epoch_unit, "sequential fine-tuning passes over one task per phase")
    if ft.freeze_encoder and ft.head_lr is not None:
        out["lr"] = (d.lr, "the encoder is frozen (`freeze_encoder`) and `head_lr` sets every other rate")
    if ft.downsample.mode != "fixed":
        out["downsample.size"] = (Downsample().size, f"it belongs to `downsample.mode: fixed` (this is "
                                                     f"`{ft.downsample.mode}`)")
    head_settings = dict.fromkeys(s for h in active().heads.values() for s in h.settings)
    for key in head_settings:       # a setting of some heads only (their declarations say which)
        if not ft.heads.reads_setting(key, heads):
            readers = [n for n, h in active().heads.items() if key in h.settings]
            out[f"heads.{key}"] = (getattr(hd, key), f"no head of the run reads it (only {', '.join(readers)})")
    return {k: v for k, v in out.items() if _get(ft, k) != v[0]}


def finetune_read(ft: FinetuneParams, head_tasks: list[str] | None = None) -> FinetuneParams:
    """`ft` as the run reads it: every setting it never reads (`unread_finetune`) at its default."""
    unread = unread_finetune(ft, head_tasks)
    if not unread:
        return ft
    data = ft.model_dump()
    for key, (default, _) in unread.items():
        _set(data, key, default.model_dump() if isinstance(default, BaseModel) else default)
    return FinetuneParams.model_validate(data)


def unread_pretraining(pre: PretrainParams) -> dict[str, tuple[Any, str]]:
    """A pretraining's settings its kind never reads: {key: (default, why)}."""
    out = {}
    if pre.kind != "mlm" and pre.mlm != MlmParams():
        out["mlm"] = (MlmParams(), f"it is the `mlm` kind's section (this is `{pre.kind}`)")
    if pre.kind != "nli" and pre.nli != NliParams():
        out["nli"] = (NliParams(), f"it is the `nli` kind's section (this is `{pre.kind}`)")
    if pre.kind == "para_first" and pre.dev_size is not None:
        out["dev_size"] = (None, "paraphrase-first evaluates on all of Quora's dev split")
    if pre.kind == "para_first" and pre.evals_per_epoch != 1:
        out["evals_per_epoch"] = (1, "paraphrase-first evaluates as its fine-tuning settings say "
                                     "(finetune.evals_per_epoch)")
    return out


def pretraining_read(pre: PretrainParams) -> PretrainParams:
    unread = unread_pretraining(pre)
    return pre.model_copy(update={k: v for k, (v, _) in unread.items()}) if unread else pre


def _get(model: BaseModel, key: str):
    for part in key.split("."):
        model = getattr(model, part)
    return model


def _set(data: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def model_heads(heads, tasks) -> list[str]:
    """The heads a model of `tasks` under `heads` holds, by name (their code is the code of the jobs
    that load it)."""
    return sorted({heads.head_of(t) for t in tasks})


def modules_of(heads, tasks) -> list[str]:
    """The user's modules whose heads and losses `tasks` use under `heads`: every one, whether it
    adds a name or (said so) replaces a built-in one."""
    return active().user_modules([heads.head_of(t) for t in tasks], [heads.loss_of(t) for t in tasks])


def without_presentation(declared: dict) -> dict:
    """Task declarations without what only people read (title, short): a job that shows them to
    nobody does not re-run when they change."""
    return {name: {k: v for k, v in d.items() if k not in TaskParams.PRESENTATION} for name, d in declared.items()}


def declared(tasks, heads=None, presentation: bool = False) -> dict:
    """What a job working with `tasks` (and, when it runs their model, `heads`) must know beyond the
    built-ins: the declarations of the user's tasks among them (`presentation`: with their titles) and
    the user's modules."""
    own = declarations(tasks)
    return {"tasks": own if presentation else without_presentation(own),
            "modules": modules_of(heads, tasks) if heads is not None else []}


def prepare_settings(lp: LoadedParams) -> PrepareSettings:
    """The data section and every task of the user's (prepare reads their files)."""
    return PrepareSettings(**lp.params.data.model_dump(),
                           tasks={n: t.declaration(presentation=False) for n, t in lp.params.tasks.items()})


def predicted_splits(exp: ExperimentParams) -> list[str]:
    """The splits an experiment predicts: dev, and test unless `predict_test` is off."""
    return [s for s in PREDICTED_SPLITS if s == "dev" or exp.predict_test]


def evaluate_settings(exp: ExperimentParams) -> EvaluateSettings:
    return EvaluateSettings(predicts=model_tasks(exp), splits=predicted_splits(exp), **declared(model_tasks(exp)))


def pretrain_settings(lp: LoadedParams, name: str) -> PretrainSettings:
    """A pretraining reads its own section and, from `base`, the model, seed, run settings and
    max length; paraphrase-first also trains with base.finetune's heads, dropout and optimiser."""
    return pretraining_from(lp.pretraining(name), lp.base)


def pretraining_from(pre: PretrainParams, base: ExperimentParams) -> PretrainSettings:
    """`pretrain_settings` from the pretraining's section and the base."""
    first = para_first_config(pre, base.finetune) if pre.kind == "para_first" else None
    sources = [t for t in pre.mlm.tasks if not NLI_DATA.names(t)] if pre.kind == "mlm" else ["para"] if first else []
    if first is not None:                        # it runs its own epochs, never to a plateau
        first = first.model_copy(update={"until_plateau": UntilPlateau()})
    return PretrainSettings(model=pre.model or base.model, seed=base.seed, max_length=base.max_length,
                            pretraining=pretraining_read(pre), finetune=first,
                            **declared(sources, first.heads if first else None),
                            **{**TrainingSettings.keys_of(base), "precision": pre.precision or base.precision})


def para_first_config(pre: PretrainParams, base: FinetuneParams) -> FinetuneParams:
    """Paraphrase-first pretraining trains the paraphrase task alone on all its data, with the
    pretraining's optimiser settings and base.finetune's heads, dropout and clipping (changed by
    the pretraining's own `finetune` section)."""
    ft = FinetuneParams.model_validate(deep_merge(base.model_dump(), pre.finetune))
    return ft.model_copy(update={
        "tasks": ["para"], "schedule": "round_robin", "epochs": pre.epochs, "batch_size": pre.batch_size,
        "lr": pre.lr, "weight_decay": pre.weight_decay, "warmup_ratio": pre.warmup_ratio,
        "lr_schedule": pre.lr_schedule, "grad_clip": pre.grad_clip,
        "downsample": Downsample(mode="none"),
        "max_steps_per_epoch": pre.max_steps_per_epoch, "freeze_encoder": False, "early_stopping": None,
        "tracking": [], **extras_off(),
        # one task: its own epoch unit, its own weight (what base.finetune says of the others is not read)
        "epoch_unit": "smallest", "task_weights": {t: w for t, w in ft.task_weights.items() if t == "para"}})


def finetune_settings(exp: ExperimentParams) -> FinetuneSettings:
    """A fine-tune reads its model (or pretraining), seed, max length, run settings and the
    `finetune` section it runs with (`finetune_read`; head retraining may add heads built from it)."""
    added = (exp.retrain_heads.tasks or []) if exp.retrain_heads.enabled else []
    return FinetuneSettings(model=None if exp.pretrain else exp.model, pretrain=exp.pretrain, seed=exp.seed,
                            max_length=exp.max_length, finetune=finetune_read(exp.finetune, exp.finetune.tasks + added),
                            **TrainingSettings.keys_of(exp), **declared(exp.finetune.tasks, exp.finetune.heads))


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
    return RetrainSettings(seed=exp.seed, train=finetune_read(train), **TrainingSettings.keys_of(exp),
                           heads=model_heads(ft.heads, model_tasks(exp)), **declared(model_tasks(exp), ft.heads))


def predict_settings(exp: ExperimentParams) -> PredictSettings:
    return PredictSettings(batch_size=exp.predict_batch_size, predicts=model_tasks(exp), splits=predicted_splits(exp),
                           model_stage="retrain_heads" if exp.retrain_heads.enabled else "finetune",
                           heads=model_heads(exp.finetune.heads, model_tasks(exp)),
                           **NetworkSettings.keys_of(exp), **declared(model_tasks(exp), exp.finetune.heads))


HUB_IDS = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}   # the packaged model's Hub id


def export_settings(lp: LoadedParams, exp: ExperimentParams) -> ExportSettings:
    """An export reads its model and the card's texts: the model it started from (through its
    pretraining, if any; its Hub id when it has one), and whether the data is the synthetic demo's."""
    pre = lp.pretraining(exp.pretrain) if exp.pretrain else None
    start = (pre.model or lp.base.model) if pre is not None else exp.model
    local = not start or start.startswith(("/", ".")) or Path(start).exists()
    ex = lp.params.export
    return ExportSettings(model_stage=predict_settings(exp).model_stage, predicts=model_tasks(exp),
                          splits=predicted_splits(exp),
                          description=exp.description or "",
                          license=ex.license, language=ex.language,
                          base_model=None if local else HUB_IDS.get(start, start),
                          start_model=start if local else HUB_IDS.get(start, start),
                          pretraining=f"{exp.pretrain} ({pre.kind})" if pre is not None else None,
                          data=str(lp.params.data.dir), demo_data=is_demo_data(lp.params.data.dir),
                          heads=model_heads(exp.finetune.heads, model_tasks(exp)),
                          **declared(model_tasks(exp), exp.finetune.heads, presentation=True))


def ensemble_settings(ens: EnsembleParams, tasks: list[str], splits: list[str]) -> EnsembleSettings:
    """An ensemble combines its members' predictions of `tasks` on `splits` (those every member predicts)."""
    return EnsembleSettings(members=ens.members, classification=ens.classification, similarity=ens.similarity,
                            predicts=tasks, splits=splits, **declared(tasks))


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
    predicts = {m: predict_settings(lp.experiments[m]) for m in members}
    modules = [m for p in predicts.values() for m in p.modules]
    return TeachSettings(members={m: p.model_stage for m, p in predicts.items()},
                         predicts=tasks, similarity=ens.similarity if ens else "mean",
                         heads=sorted({h for p in predicts.values() for h in p.heads}),
                         **NetworkSettings.keys_of(lp.base), tasks=without_presentation(declarations(tasks)),
                         modules=list(dict.fromkeys(modules)))


def report_settings(lp: LoadedParams) -> dict[str, Any]:
    """The report shows every section (descriptions, studies, params as used): all of it."""
    return lp.raw
