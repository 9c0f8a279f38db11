"""The stage specs: each stage's facts, in one place.

A stage is its spec here, its library function and its thin CLI (stages/<name>.py). Its spec says:
- what the engines show and ask for: the one-line `message` of a job and its `resources` (threads,
  memory in MB, minutes, GPUs for the stages that run the network);
- how a job is named on the command line (`named`: --experiment or --name, and what a name names);
- which jobs a params file has (`names`) and each job's `settings` (minbert.params.resolve), whose
  model (`model`) the planner checks them with (the stage reads them as plain data:
  minbert.core.settings);
- what a job reads and writes, by name (`io`): a function of the layout, the job's name and its
  settings alone, so the planner (minbert.pipeline.plan), the Snakemake patterns (the name set to
  "{name}": workflow/dag.py), dvc.yaml and the check of a job file an engine hands the stage
  (minbert.pipeline.job) all derive the same paths;
- which named outputs DVC reads as metrics and plots, the code a job runs beside its stage
  module (`code`: a pretraining's kind, the heads and losses a training or a loaded model runs),
  and, for a stage that reads the other jobs' outputs (the report), which (`gathers`).

The stage specs decide what is in each job's description (its reads) and job file (its outputs), so
like the planner it is in no job's code (minbert.pipeline.code.NOT_JOB_CODE): an edit here re-runs
the jobs whose description it changes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import wraps
from pathlib import Path
from typing import Any, Callable, Iterable

from minbert.core.layout import PREDICTED_SPLITS, Layout, prediction_file
from minbert.core.settings import pretrain_splits
from minbert.core.tasks import TASKS
from minbert.params import resolve as S
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
)
from minbert.params.validate import shared_tasks
from minbert.pipeline.code import PARAMS_LOADER
from minbert.train import PRETRAINING_MODULES


@dataclass
class StageIO:
    """What one job reads and writes, each path under a name (a list: one or more paths)."""
    reads: dict[str, list[str]]
    writes: dict[str, list[str]]
    files: dict[str, list[str]] = field(default_factory=dict)   # the files inside a folder output, where known
    sources: list[str] = field(default_factory=list)           # reads no job makes (raw data, a model folder)
    models: list[str] = field(default_factory=list)            # models it loads that no job makes: hashed by their files


@dataclass(frozen=True)
class Stage:
    name: str
    message: str                                  # one line per job; {name}: the job's name
    resources: dict                               # threads, mem_mb, runtime (minutes), gpu (network stages)
    io: Callable[[Layout, Any, Any], StageIO]     # (layout, name, settings) -> what the job reads and writes
    names: Callable[[Any], Iterable]              # the params -> the names of its jobs ([None]: one job)
    settings: Callable[[Any, Any], Any]           # (params, name) -> the job's settings (a model, or a dict)
    model: type | None = None                     # what the planner checks its settings with (None: a dict)
    named: str | None = None                      # its jobs' command-line argument: experiment | name
    what: str = "experiment"                      # what a name names, in messages
    name_help: str = ""
    by_hand: Callable[[Any], Iterable] | None = None   # the names a job may be run for by hand (default: `names`)
    named_in: Callable[[Any], Iterable] | None = None  # every name of its kind, for messages (default: by_hand)
    hint: str = ""                                # how to get a job for a name that has none
    metrics: tuple[str, ...] = ()                 # named outputs DVC reads as metrics
    plots: tuple[str, ...] = ()                   # named outputs DVC draws as plots
    code: Callable[[Any], list[str]] = lambda settings: []   # code roots beside its stage module
    reported: bool = True                         # the report reads its outputs (but models)
    # a stage that reads the outputs of the other jobs (the report): which, by stage and output name;
    # the planner names each read `<job id>:<output name>` (`run_record` for the run record)
    gathers: Callable[[Any, str], bool] | None = None

    @property
    def module(self) -> str:
        return f"stages.{self.name}"

    def runnable(self, lp) -> Iterable:
        """The names a job of this stage may be run for by hand."""
        return (self.by_hand or self.names)(lp)

    def known(self, lp) -> Iterable:
        """Every name of the kind this stage's jobs are named by (for a one-line error)."""
        return self.named_in(lp) if self.named_in is not None else self.runnable(lp)

    def code_roots(self, settings) -> list[str]:
        """The modules whose closure is a job's code (minbert.pipeline.code): its stage, `code` and the
        user's modules its settings name (params' `modules:`)."""
        return [self.module, *self.code(settings), *getattr(settings, "modules", [])]


# ---------------------------------------------------------------- helpers

def is_local(model: str | None) -> bool:
    """A model setting that names a local folder (not the packaged model or a Hub id)."""
    return bool(model) and (Path(model).exists() or model.startswith(("/", ".", "~")) or os.sep in model)


def _model_reads(model: str | None) -> tuple[list[str], list[str], list[str]]:
    """(reads, sources, models) of a model setting: a local folder is read (a source no job makes);
    either way its files are hashed into the description (minbert.core.models)."""
    if not model:
        return [], [], []
    return ([model], [model], [model]) if is_local(model) else ([], [], [model])


def _splits(L: Layout, tasks, splits) -> list[str]:
    return [L.split(t, s) for t in tasks for s in splits if s in TASKS[t].splits]    # a task may have no test


def _predictions(folder: str, tasks, splits) -> list[str]:
    return [prediction_file(folder, t, s) for t in tasks for s in splits if s in TASKS[t].splits]


def _dump(model) -> dict:
    return model.model_dump(mode="json")


# ---------------------------------------------------------------- each stage's reads and writes

def _prepare_io(L: Layout, name, s) -> StageIO:
    from minbert.data.prepare import prepared_files, raw_inputs

    raw = raw_inputs(s)
    return StageIO({"raw": raw}, {"data": [L.data]}, files={L.data: [f"{L.data}/{f}" for f in prepared_files(s)]},
                   sources=raw)


def _pretrain_io(L: Layout, name, s) -> StageIO:
    reads, sources, models = _model_reads(s.model)
    return StageIO({"splits": [L.split(t, sp) for t, sp in pretrain_splits(s)], "model": reads},
                   {"model": [L.pretrain_model(name)], "metrics": [L.pretrain_metrics(name)],
                    "history": [L.pretrain_history(name)]}, sources=sources, models=models)


def _finetune_io(L: Layout, name, s) -> StageIO:
    reads, sources, models = _model_reads(None if s.pretrain else s.model)
    start = [L.pretrain_model(s.pretrain)] if s.pretrain else reads
    teacher = [L.teacher(s.finetune.distill.teacher)] if s.finetune.distill else []
    return StageIO({"splits": _splits(L, s.finetune.tasks, ("train", "dev")), "start": start, "teacher": teacher},
                   {"model": [L.model(name, "finetune")], "history": [L.history(name, "finetune")],
                    **_tracked(L, name, "finetune", s.finetune.tracking)},
                   sources=sources, models=models)


def _retrain_io(L: Layout, name, s) -> StageIO:
    return StageIO({"splits": _splits(L, s.train.tasks, ("train", "dev")), "model": [L.model(name, "finetune")]},
                   {"model": [L.model(name, "retrain_heads")], "history": [L.history(name, "retrain_heads")],
                    **_tracked(L, name, "retrain_heads", s.train.tracking)})


def _tracked(L: Layout, name, stage: str, tools) -> dict[str, list[str]]:
    """A training stage's trackers' outputs (finetune.tracking): TensorBoard's folder, DVCLive's
    summary (a DVC metrics file) and its history (DVC plots)."""
    folders, metrics, plots = L.tracking_outputs(name, stage, tools)
    return {"tracking": folders, "live_metrics": metrics, "live_plots": plots}


def _predict_io(L: Layout, name, s) -> StageIO:
    return StageIO({"splits": _splits(L, s.predicts, s.splits), "model": [L.model(name, s.model_stage)]},
                   {"predictions": _predictions(L.predictions(name), s.predicts, s.splits)})


def _evaluate_io(L: Layout, name, s) -> StageIO:
    return StageIO({"predictions": _predictions(L.predictions(name), s.predicts, s.splits),
                    "splits": _splits(L, s.predicts, s.splits)}, {"metrics": [L.metrics(name)]})


def _teach_io(L: Layout, name, s) -> StageIO:
    models = [L.model(m, stage) for m, stage in sorted(s.members.items())]     # by name, as a job file holds them
    return StageIO({"splits": _splits(L, s.predicts, ("train",)), "models": models}, {"outputs": [L.teacher(name)]},
                   files={L.teacher(name): [L.teacher_file(name, t) for t in s.predicts]})


def _ensemble_io(L: Layout, name, s) -> StageIO:
    return StageIO({"predictions": [p for m in s.members for p in _predictions(L.predictions(m), s.predicts, s.splits)],
                    "splits": _splits(L, s.predicts, s.splits)},
                   {"predictions": _predictions(L.ensemble_predictions(name), s.predicts, s.splits),
                    "metrics": [L.ensemble_metrics(name)]})


def _report_io(L: Layout, name, s) -> StageIO:
    # what it reads (`gathers`: every output of the other jobs it shows) is the planner's to list
    return StageIO({}, {"final": [L.final_report], "pages": [L.experiment_reports], "summary": [L.summary_metrics]})


def _shown(spec: Stage, output: str) -> bool:
    """What the report shows: every output of a reported stage (its run record too) but its model."""
    return spec.reported and output != "model"


def _export_io(L: Layout, name, s) -> StageIO:
    return StageIO({"model": [L.model(name, s.model_stage)], "record": [L.run_record(s.model_stage, name)],
                    "predictions": _predictions(L.predictions(name), s.predicts, s.splits),
                    "splits": _splits(L, s.predicts, ("train",))}, {"export": [L.export(name)]})


# ---------------------------------------------------------------- each stage's jobs in a params file

def _used_pretrainings(lp) -> list[str]:
    return sorted({e.pretrain for e in lp.experiments.values() if e.pretrain})


def _runs_heads_and_losses(s, train) -> list[str]:
    """The code of the heads and losses a training with `train` (its tasks, its heads settings) runs:
    each built-in one's module (minbert/model/heads/, minbert/model/losses/; the user's modules are
    the settings' `modules`), so an edit to one re-runs exactly the trainings that use it."""
    tasks = s.registry.tasks
    return s.registry.code_modules([train.heads.head_of(t, tasks) for t in train.tasks],
                                   [train.heads.loss_of(t, tasks) for t in train.tasks])


def _loads_models(s) -> list[str]:
    """A stage that loads a trained model runs the heads its model holds (its settings name them: the
    experiment's, known when the job is planned); no loss runs there."""
    return s.registry.code_modules(heads=s.heads)


def _pretrain_code(s) -> list[str]:
    first = _runs_heads_and_losses(s, s.finetune) if s.pretraining.kind == "para_first" else []
    return [PRETRAINING_MODULES[s.pretraining.kind], *first]


def _ensemble_settings(lp, name):
    ens = lp.params.ensembles[name]
    splits = [s for s in PREDICTED_SPLITS if all(s in S.predicted_splits(lp.experiments[m]) for m in ens.members)]
    return S.ensemble_settings(ens, [t for t in TASKS if t in shared_tasks(ens.members, lp.experiments)], splits)


def _report_code(settings) -> list[str]:
    return list(PARAMS_LOADER)       # the report reads the params itself


def _in_own_registry(io: Callable) -> Callable:
    """A stage's `io`, derived in the registry of the job's own settings (its tasks' splits), whoever
    asks: the planner, an engine's rules, a stage reading its job file."""
    @wraps(io)
    def derive(layout: Layout, name, settings) -> StageIO:
        registry = getattr(settings, "registry", None)
        if registry is None:
            return io(layout, name, settings)
        with registry.active():
            return io(layout, name, settings)
    return derive


NETWORK = {"threads": 8, "gpu": 1}      # what a stage that runs the network asks of a machine, beside memory and time
STAGES: dict[str, Stage] = {s.name: replace(s, io=_in_own_registry(s.io)) for s in [
    Stage("prepare", "prepare: read and check the raw files, write the prepared splits",
          {"threads": 1, "mem_mb": 4000, "runtime": 30}, _prepare_io, names=lambda lp: [None],
          settings=lambda lp, name: S.prepare_settings(lp), model=PrepareSettings),
    Stage("pretrain", "pretrain {name}", {**NETWORK, "mem_mb": 32000, "runtime": 600}, _pretrain_io,
          names=lambda lp: sorted({e.pretrain for e in lp.experiments.values() if e.pretrain}),
          settings=S.pretrain_settings, model=PretrainSettings, named="name", what="pretraining",
          name_help="pretraining name in params.yaml `pretrainings:`", by_hand=lambda lp: lp.params.pretrainings,
          metrics=("metrics",), plots=("history",), code=_pretrain_code),
    Stage("finetune", "fine-tune {name}", {**NETWORK, "mem_mb": 32000, "runtime": 480}, _finetune_io,
          names=lambda lp: lp.experiments, settings=lambda lp, n: S.finetune_settings(lp.experiments[n]),
          model=FinetuneSettings, named="experiment", metrics=("live_metrics",), plots=("history", "live_plots"),
          code=lambda s: _runs_heads_and_losses(s, s.finetune)),
    Stage("retrain_heads", "retrain the heads of {name} over its frozen encoder",
          {**NETWORK, "mem_mb": 16000, "runtime": 120}, _retrain_io,
          names=lambda lp: [n for n, e in lp.experiments.items() if e.retrain_heads.enabled],
          settings=lambda lp, n: S.retrain_settings(lp.experiments[n]), model=RetrainSettings, named="experiment",
          named_in=lambda lp: lp.experiments, hint="set retrain_heads.enabled: true", metrics=("live_metrics",),
          plots=("history", "live_plots"), code=lambda s: _loads_models(s) + _runs_heads_and_losses(s, s.train)),
    Stage("predict", "predict the dev and test splits with {name}", {**NETWORK, "mem_mb": 16000, "runtime": 60},
          _predict_io, names=lambda lp: lp.experiments, settings=lambda lp, n: S.predict_settings(lp.experiments[n]),
          model=PredictSettings, named="experiment", code=_loads_models),
    Stage("evaluate", "score the predictions of {name}", {"threads": 1, "mem_mb": 2000, "runtime": 10}, _evaluate_io,
          names=lambda lp: lp.experiments,
          settings=lambda lp, n: S.evaluate_settings(lp.experiments[n]),
          model=EvaluateSettings, named="experiment", metrics=("metrics",)),
    Stage("teach", "teacher {name}: its outputs on the training data", {**NETWORK, "mem_mb": 16000, "runtime": 120},
          _teach_io, names=S.teachers, settings=lambda lp, n: S.teach_settings(lp, n, S.teachers(lp)[n]),
          model=TeachSettings, named="name", what="teacher",
          name_help="the teacher: an experiment or ensemble a student distils from", code=_loads_models),
    Stage("ensemble", "ensemble {name}: combine its members' predictions",
          {"threads": 1, "mem_mb": 4000, "runtime": 10}, _ensemble_io, names=lambda lp: lp.params.ensembles,
          settings=_ensemble_settings, model=EnsembleSettings, named="name", what="ensemble",
          name_help="the ensemble name in params.yaml", metrics=("metrics",)),
    Stage("report", "report: the HTML pages", {"threads": 1, "mem_mb": 8000, "runtime": 30}, _report_io,
          names=lambda lp: [None], settings=lambda lp, name: S.report_settings(lp), metrics=("summary",),
          code=_report_code, gathers=_shown),
    Stage("export", "export {name} in the Hugging Face format", {"threads": 1, "mem_mb": 8000, "runtime": 20},
          _export_io, names=lambda lp: lp.params.export.experiments,
          settings=lambda lp, n: S.export_settings(lp, lp.experiments[n]), model=ExportSettings, named="experiment",
          by_hand=lambda lp: lp.experiments, reported=False,   # by hand (minbert export): any experiment
          code=_loads_models),
]}


def stage(name: str) -> Stage:
    """The spec of stage `name`."""
    return STAGES[name]
