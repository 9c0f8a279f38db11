"""The pipeline's jobs (minbert.pipeline.job) and their resolved descriptions, computed once for
everything that needs to know what a job depends on.

Who uses it:
- Snakemake and DVC (workflow/dag.py): each job depends on its job file
  (results/jobs/<stage>/<name>.json, rewritten only when it changes: `write_job_file`) and on the
  outputs it reads; so a job re-runs exactly when its settings, inputs or code change;
- a stage run by hand (without `--job`) looks its job up here (`job_for`);
- the training stages: a resumable state is used only when saved under the same fingerprint;
- run records (results/runs/...): the description and fingerprint of what ran.
The planner is in no job's code (minbert.pipeline.code.NOT_JOB_CODE): what it decides for a job is
the job's description itself, which its fingerprint covers.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from minbert.core.layout import MODEL_FILE, PREDICTED_SPLITS, Layout, prediction_file
from minbert.core.provenance import canonical
from minbert.core.tasks import TASKS
from minbert.params import resolve as S
from minbert.params.catalogue import LoadedParams
from minbert.params.load import load_params
from minbert.params.settings import pretrain_splits
from minbert.params.validate import model_tasks, shared_tasks
from minbert.pipeline.code import PARAMS_LOADER
from minbert.pipeline.job import Job, refuse_inputs_inside_outputs
from minbert.train import PRETRAINING_MODULES

# ---------------------------------------------------------------- the jobs of a params file

def _cmd(stage: str, name: str | None, layout: Layout, *args: str) -> str:
    """The engines' command: the stage reads its job from the job file the engine depends on."""
    return " ".join(["python -m", f"stages.{stage}", *args, "--job", layout.job_file(stage, name)])


def _dump(model) -> dict:
    return model.model_dump(mode="json")


def _local(path: str | None) -> list[str]:
    """A params path as something the job reads, when it names a local folder (not a Hub id or
    the packaged model)."""
    if not path:
        return []
    return [path] if Path(path).exists() or path.startswith(("/", ".")) or os.sep in path else []


def _splits(layout: Layout, tasks, splits) -> list[str]:
    return [layout.split(t, s) for t in tasks for s in splits if s in TASKS[t].splits]   # a task may have no test


def _predictions(folder: str, tasks) -> list[str]:
    return [prediction_file(folder, t, s) for t in tasks for s in PREDICTED_SPLITS if s in TASKS[t].splits]


class _Jobs(list):
    """The jobs as the planner adds them (each with its command and run record from the layout)."""

    def __init__(self, layout: Layout):
        super().__init__()
        self.L = layout

    def add(self, stage, name, settings, reads, outs, metrics=(), plots=(), args=()) -> Job:
        L = self.L
        self.append(Job(stage, name, settings, list(reads), list(outs), list(metrics), list(plots),
                        L.run_record(stage, name), _cmd(stage, name, L, *args), results=L.results,
                        reports=L.reports))
        if settings.get("modules"):     # the user's modules its settings name are code it runs
            self[-1].code_roots = [self[-1].module, *settings["modules"]]
        return self[-1]


def pipeline(params: str | Path | LoadedParams = "params.yaml", layout: Layout = Layout(),
             pretrainings=None) -> list[Job]:
    """Every job, in an order where each comes after the jobs whose outputs it reads. `pretrainings`:
    the pretrainings to include (default: those some experiment starts from)."""
    from minbert.data.prepare import prepared_files, raw_inputs

    lp = params if isinstance(params, LoadedParams) else load_params(params)
    L, out = layout, _Jobs(layout)
    data = S.prepare_settings(lp)
    out.add("prepare", None, _dump(data), raw_inputs(data), [L.data]).files = \
        {L.data: [f"{L.data}/{name}" for name in prepared_files(data)]}
    used = {e.pretrain for e in lp.experiments.values() if e.pretrain}
    for name in sorted(used if pretrainings is None else set(pretrainings)):
        s = S.pretrain_settings(lp, name)
        out.add("pretrain", name, _dump(s), [L.split(t, sp) for t, sp in pretrain_splits(s)] + _local(s.model),
                [L.pretrain_model(name)], [L.pretrain_metrics(name)], [L.pretrain_history(name)],
                ["--name", name]).code_roots = ["stages.pretrain", PRETRAINING_MODULES[s.pretraining.kind], *s.modules]
    for name, exp in lp.experiments.items():
        _experiment_jobs(out, name, exp)
    for name, tasks in S.teachers(lp).items():
        s = S.teach_settings(lp, name, tasks)
        out.add("teach", name, _dump(s), _splits(L, tasks, ("train",)) +
                [L.model(m, stage) for m, stage in s.members.items()], [L.teacher(name)], args=["--name", name]
                ).files = {L.teacher(name): [L.teacher_file(name, t) for t in tasks]}
    for name, ens in lp.params.ensembles.items():
        tasks = [t for t in TASKS if t in shared_tasks(ens.members, lp.experiments)]
        out.add("ensemble", name, _dump(S.ensemble_settings(ens, tasks)),
                [p for m in ens.members for p in _predictions(L.predictions(m), tasks)] +
                _splits(L, tasks, PREDICTED_SPLITS),
                _predictions(L.ensemble_predictions(name), tasks), [L.ensemble_metrics(name)], args=["--name", name])
    # the report reads every earlier output but the models (minbert.report.data loads them by the layout)
    reads = [o for j in out for o in j.outputs if not o.endswith((f"/{MODEL_FILE}", "/model"))]
    out.add("report", None, S.report_settings(lp), reads, [L.final_report, L.experiment_reports],
            [L.summary_metrics]).code_roots = ["stages.report", *PARAMS_LOADER]     # it reads the params itself
    for name in lp.params.export.experiments:   # after the report, which never reads them
        s = S.export_settings(lp, lp.experiments[name])
        tasks = model_tasks(lp.experiments[name])
        out.add("export", name, _dump(s), [L.model(name, s.model_stage), L.run_record(s.model_stage, name)] +
                _predictions(L.predictions(name), tasks) + _splits(L, tasks, ("train",)),
                [L.export(name)], args=["--experiment", name])
    jobs = _link(list(out))
    for job in jobs:    # an engine deletes a job's outputs before it runs: refuse before any engine starts
        refuse_inputs_inside_outputs(job)
    return jobs


def _experiment_jobs(out: _Jobs, name: str, exp) -> None:
    """An experiment's jobs: fine-tuning, head retraining when enabled, predictions, evaluation."""
    L = out.L
    start = [L.pretrain_model(exp.pretrain)] if exp.pretrain else _local(exp.model)
    tasks = exp.finetune.tasks
    teacher = [L.teacher(exp.finetune.distill.teacher)] if exp.finetune.distill else []
    out.add("finetune", name, _dump(S.finetune_settings(exp)), _splits(L, tasks, ("train", "dev")) + start + teacher,
            [L.model(name, "finetune")], plots=[L.history(name, "finetune")], args=["--experiment", name])
    if exp.retrain_heads.enabled:
        rh = S.retrain_settings(exp)
        out.add("retrain_heads", name, _dump(rh),
                _splits(L, rh.train.tasks, ("train", "dev")) + [L.model(name, "finetune")],
                [L.model(name, "retrain_heads")], plots=[L.history(name, "retrain_heads")],
                args=["--experiment", name])
    # each predictions file is an output of its own, so a deleted file re-runs predict
    predicted = _predictions(L.predictions(name), model_tasks(exp))
    settings = S.predict_settings(exp)
    out.add("predict", name, _dump(settings),
            _splits(L, model_tasks(exp), PREDICTED_SPLITS) + [L.model(name, settings.model_stage)],
            predicted, args=["--experiment", name])
    out.add("evaluate", name, _dump(S.evaluate_settings(exp)),
            predicted + _splits(L, model_tasks(exp), PREDICTED_SPLITS), [], [L.metrics(name)],
            args=["--experiment", name])


def _link(jobs: list[Job]) -> list[Job]:
    """Each job's `deps`: what it reads, as the engines track it (the upstream output holding each
    path, or the path itself when no job makes it); the jobs in an order where every job comes
    after the jobs it reads from (a student's teacher before the student)."""
    maker = {o: j for j in jobs for o in j.outputs}
    for job in jobs:
        deps = []
        for path in job.reads:
            holder = next((o for o in maker if path == o or path.startswith(o.rstrip("/") + "/")), path)
            if holder not in deps:
                deps.append(holder)
        job.deps = deps
        job.sources = [d for d in deps if d not in maker]
    ordered, placed = [], set()

    def place(job: Job, path: tuple = ()) -> None:
        if job.id in placed:
            return
        for d in job.deps:
            if d in maker and maker[d].id not in path:
                place(maker[d], path + (job.id,))
        placed.add(job.id)
        ordered.append(job)

    for job in jobs:
        place(job)
    return ordered


WHAT_IS_NAMED = {"pretrain": "pretraining", "ensemble": "ensemble", "teach": "teacher"}   # the others name experiments


_PIPELINES: dict = {}


def _stats(params_path: Path) -> tuple:
    """What a params file's content depends on: it and the catalogue files beside it."""
    files = [params_path] + sorted((params_path.parent / "params").glob("*.yaml"))
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())


def _pipeline_of(params_path: str | Path, layout: Layout, extra_pretraining: str | None):
    """The params and jobs of a params file (with a pretraining no experiment uses, when asked),
    kept while the files they come from are unchanged: a process running many stages, as
    `--config in_process=true` does, builds them once."""
    path = Path(params_path)
    key = (str(path.resolve()), str(Path.cwd()), layout, extra_pretraining, _stats(path))
    if key not in _PIPELINES:
        lp = load_params(path)
        used = {e.pretrain for e in lp.experiments.values() if e.pretrain}
        extra = {extra_pretraining} if extra_pretraining in lp.params.pretrainings else set()
        _PIPELINES.clear()
        _PIPELINES[key] = (lp, pipeline(lp, layout, sorted(used | extra)))
    return _PIPELINES[key]


def job_for(params_path: str | Path, stage: str, name: str | None, layout: Layout = Layout()) -> Job:
    """One job of the pipeline (what a stage CLI runs); a one-line error for a name it lacks."""
    import copy

    from minbert.core.errors import MinBertError
    from minbert.params.messages import close

    lp, jobs = _pipeline_of(params_path, layout, name if stage == "pretrain" else None)
    for job in jobs:
        if job.stage == stage and job.name == name:
            return copy.deepcopy(job)
    what = WHAT_IS_NAMED.get(stage, "experiment")
    names = {"pretraining": lp.params.pretrainings, "ensemble": lp.params.ensembles,
             "teacher": S.teachers(lp)}.get(what, lp.experiments)
    if what == "experiment" and name in lp.groups:
        raise MinBertError(f"{params_path}: experiment '{name}' runs as {len(lp.groups[name])} seeds; name one of "
                           f"them ({', '.join(lp.groups[name])})")
    if name in names:   # it exists, but this stage does not apply to it
        hint = "set retrain_heads.enabled: true" if stage == "retrain_heads" else ""
        raise MinBertError(f"{params_path}: {what} '{name}' has no {stage} job{'; ' + hint if hint else ''}")
    raise MinBertError(f"{params_path}: unknown {what} '{name}'{close(name, names)}")


# ---------------------------------------------------------------- job files

def write_job_file(job: Job, layout: Layout) -> bool:
    """Write the job's file (minbert.pipeline.job) when its content changed; returns whether it was
    written.

    Snakemake compares the file's date with the job's outputs (and, the date being newer, its
    content with the one it recorded). A description that is the one the outputs were made from
    (their run record says so: an edit undone, or outputs made by DVC) gets the date the run
    started, so it counts as older than them; any other new content is newer."""
    from minbert.core.io import write_text

    path = Path(layout.job_file(job.stage, job.name))
    text = job.file_text()
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    write_text(path, text)
    started = _made_from(job, job.description())
    if started is not None:
        os.utime(path, (started, started))
    return True


def _made_from(job: Job, description: dict) -> float | None:
    """When the job's recorded run started, if that run had this description; else None."""
    import datetime as dt

    from minbert.core.errors import MinBertError
    from minbert.core.io import read_input

    record = Path(job.run_record)
    try:
        if not record.is_file():
            return None
        info = json.loads(read_input(record, "run record", limit=64 << 20).decode("utf-8"))
        recorded = {k: v for k, v in info["description"].items() if k != "read_hashes"}
        if canonical(recorded) != canonical(description):
            return None
        return dt.datetime.fromisoformat(info["started"]).timestamp() - 1.0
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MinBertError):
        return None


__all__ = ["Job", "pipeline", "job_for", "write_job_file"]
