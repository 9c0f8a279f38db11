"""The pipeline's jobs and each job's resolved description, computed once for everything that
needs to know what a job depends on.

A job's description is
- `settings`: what its stage reads from the params (minbert.params.settings, resolved: base merged,
  catalogue applied; cosmetic keys are in no stage's settings but the report's);
- `reads`: the files and folders it reads (prepared splits, upstream models, raw data);
- `code`: the import closure of its stage module within the project (computed from the source,
  `import` statements anywhere in a module, with package `__init__` files and the data files a
  module declares in `CODE_DATA`), each with the hash of its content; the planner (this module)
  is not followed, since what it decides is the description itself. Imports point down the layers
  (core, params, model, data, train, scoring, share, pipeline, report), so a job's closure holds
  the layers its stage runs and nothing above: prepare's no training module, a report edit only
  the report's.
Its hash, together with the content hashes of what it reads, is the job's fingerprint.

Who uses it:
- Snakemake and DVC (workflow/dag.py): each job depends on its description file
  (results/jobs/<stage>/<name>.json, rewritten only when the description changes) and on the
  outputs it reads; so a job re-runs exactly when its settings, inputs or code change;
- the training stages: a resumable state is used only when saved under the same fingerprint;
- run records (results/runs/...): the description and fingerprint of what ran.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.layout import MODEL_FILE, PREDICTED_SPLITS, Layout, prediction_file
from minbert.core.provenance import canonical, file_hash, path_hash
from minbert.core.tasks import TASKS
from minbert.params import LoadedParams, load_params, model_tasks, shared_tasks
from minbert.params import settings as S

PROJECT_PACKAGES = ("minbert", "stages", "workflow")
# The planner (this module) is in no job's code: what it decides for a job is the job's description
# itself (settings, reads), which the fingerprint covers; a planner edit that changes no
# description changes nothing a job runs. A stage imports it only to look up its job.
PLANNER = frozenset({__name__})


# ---------------------------------------------------------------- the job

@dataclass
class Job:
    stage: str
    name: str | None
    settings: dict                                   # what the stage reads from the params (JSON types)
    reads: list[str]                                 # files and folders it reads
    outs: list[str]                                  # outputs (DVC caches these)
    metrics: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    run_record: str = ""
    cmd: str = ""
    deps: list[str] = field(default_factory=list)    # `reads` as the engines see them: whole upstream outputs
    sources: list[str] = field(default_factory=list)  # the deps no job makes (raw data): hashed in the description
    results: str = "results"                         # the results folder it runs in (its state, its lock)

    @property
    def id(self) -> str:
        return self.stage if self.name is None else f"{self.stage}@{self.name}"

    @property
    def module(self) -> str:
        return f"stages.{self.stage}"

    @property
    def outputs(self) -> list[str]:
        """Every declared output: outs, metrics, plots and the run record."""
        return self.outs + self.metrics + self.plots + [self.run_record]

    def description(self) -> dict:
        """The resolved description (settings, reads, code with content hashes, and the content hash
        of each source: a raw data file changes the description when its bytes change, not when
        only its date does, as after a copy or a fresh checkout)."""
        out = {"stage": self.stage, "name": self.name, "settings": self.settings, "reads": self.reads,
               "code": {p: file_hash(p) for p in code_closure(self.module)}}
        if self.sources:
            out["sources"] = {p: path_hash(p) for p in self.sources}
        return out

    def runtime_description(self, extra_reads: list[str | os.PathLike] = ()) -> dict:
        """The description with the content hash of every read (and `extra_reads`, e.g. a model
        folder outside the repository): what the fingerprint of a running job covers."""
        description = self.description()
        hashed = description.get("sources", {})          # a source's hash is in the description already
        return {**description, "read_hashes": {p: hashed[p] if p in hashed else path_hash(p)
                                               for p in [*self.reads, *map(str, extra_reads)]}}



# ---------------------------------------------------------------- the jobs of a params file

def _cmd(stage: str, params_arg: str, layout: Layout, *args: str) -> str:
    extra = ([] if params_arg == "params.yaml" else ["--params", params_arg]) + \
        ([] if layout.results == "results" else ["--results", layout.results])
    return " ".join(["python -m", f"stages.{stage}", *args, *extra])


def _dump(model) -> dict:
    return model.model_dump(mode="json")


def _local(path: str | None) -> list[str]:
    """A params path as something the job reads, when it names a local folder (not a Hub id or
    the packaged model)."""
    if not path:
        return []
    return [path] if Path(path).exists() or path.startswith(("/", ".")) or os.sep in path else []


def _splits(layout: Layout, tasks, splits) -> list[str]:
    return [layout.split(t, s) for t in tasks for s in splits]


def _predictions(folder: str, tasks) -> list[str]:
    return [prediction_file(folder, t, s) for t in tasks for s in PREDICTED_SPLITS]


def pipeline(params: str | Path | LoadedParams = "params.yaml", layout: Layout = Layout(),
             pretrainings=None) -> list[Job]:
    """Every job, in an order where each comes after the jobs whose outputs it reads. `pretrainings`:
    the pretrainings to include (default: those some experiment starts from)."""
    lp = params if isinstance(params, LoadedParams) else load_params(params)
    params_arg = str(params if not isinstance(params, LoadedParams) else (lp.path or "params.yaml"))
    L = layout
    out: list[Job] = []

    def add(stage, name, settings, reads, outs, metrics=(), plots=(), args=()):
        out.append(Job(stage, name, settings, list(reads), list(outs), list(metrics), list(plots),
                       L.run_record(stage, name), _cmd(stage, params_arg, L, *args), results=L.results))

    from minbert.data.prepare import raw_inputs

    data = S.prepare_settings(lp)
    add("prepare", None, _dump(data), raw_inputs(data), [L.data])

    used = {e.pretrain for e in lp.experiments.values() if e.pretrain}
    for name in sorted(used if pretrainings is None else set(pretrainings)):
        s = S.pretrain_settings(lp, name)
        add("pretrain", name, _dump(s), [L.split(t, sp) for t, sp in S.pretrain_splits(s)] + _local(s.model),
            [L.pretrain_model(name)], [L.pretrain_metrics(name)], [L.pretrain_history(name)], ["--name", name])

    taught = S.teachers(lp)
    for name, exp in lp.experiments.items():
        ft = S.finetune_settings(exp)
        start = [L.pretrain_model(exp.pretrain)] if exp.pretrain else _local(exp.model)
        tasks = exp.finetune.tasks
        teacher = [L.teacher(exp.finetune.distill.teacher)] if exp.finetune.distill else []
        add("finetune", name, _dump(ft), _splits(L, tasks, ("train", "dev")) + start + teacher,
            [L.model(name, "finetune")], plots=[L.history(name, "finetune")], args=["--experiment", name])
        if exp.retrain_heads.enabled:
            rh = S.retrain_settings(exp)
            add("retrain_heads", name, _dump(rh),
                _splits(L, rh.train.tasks, ("train", "dev")) + [L.model(name, "finetune")],
                [L.model(name, "retrain_heads")], plots=[L.history(name, "retrain_heads")], args=["--experiment", name])
        # each predictions file is an output of its own, so a deleted file re-runs predict
        predicted = _predictions(L.predictions(name), model_tasks(exp))
        add("predict", name, _dump(S.predict_settings(exp)),
            _splits(L, model_tasks(exp), PREDICTED_SPLITS) + [L.model(name, S.predict_settings(exp).model_stage)],
            predicted, args=["--experiment", name])
        add("evaluate", name, {}, predicted + _splits(L, model_tasks(exp), PREDICTED_SPLITS), [], [L.metrics(name)],
            args=["--experiment", name])

    for name, tasks in taught.items():
        s = S.teach_settings(lp, name, tasks)
        add("teach", name, _dump(s), _splits(L, tasks, ("train",)) +
            [L.model(m, stage) for m, stage in s.members.items()],
            [L.teacher(name)], args=["--name", name])

    for name, ens in lp.params.ensembles.items():
        tasks = [t for t in TASKS if t in shared_tasks(ens.members, lp.experiments)]
        add("ensemble", name, _dump(S.ensemble_settings(ens)),
            [p for m in ens.members for p in _predictions(L.predictions(m), tasks)] + _splits(L, tasks, PREDICTED_SPLITS),
            _predictions(L.ensemble_predictions(name), tasks), [L.ensemble_metrics(name)], args=["--name", name])

    # the report reads every earlier output but the models (minbert.report.data loads them by the layout)
    reads = [o for j in out for o in j.outputs if not o.endswith((f"/{MODEL_FILE}", "/model"))]
    add("report", None, S.report_settings(lp), reads, [L.final_report, L.experiment_reports], [L.summary_metrics])

    for name in lp.params.export.experiments:   # after the report, which never reads them
        s = S.export_settings(lp, lp.experiments[name])
        tasks = model_tasks(lp.experiments[name])
        add("export", name, _dump(s), [L.model(name, s.model_stage), L.run_record(s.model_stage, name)] +
            _predictions(L.predictions(name), tasks) + _splits(L, tasks, ("train",)),
            [L.export(name)], args=["--experiment", name])
    return _link(out)


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


# ---------------------------------------------------------------- code closure and hashes

def _package_roots() -> dict[str, Path]:
    roots = {}
    for pkg in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:   # a package, or a folder of modules
            roots[pkg] = Path(list(spec.submodule_search_locations)[0])
    return roots


def _module_file(module: str, roots: dict[str, Path]) -> Path | None:
    top, *rest = module.split(".")
    if top not in roots:
        return None
    base = roots[top].joinpath(*rest)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Modules named by the import statements anywhere in a module (functions included)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)   # `from pkg import submodule`
    return found


def _code_data(tree: ast.AST, folder: Path) -> list[Path]:
    """Files a module declares as part of its code: `CODE_DATA = ("templates",)` (folders or files,
    relative to the module)."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CODE_DATA" for t in node.targets):
            out = []
            for rel in ast.literal_eval(node.value):
                p = folder / rel
                out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            return out
    return []


_CLOSURES: dict[str, list[Path]] = {}


def code_closure(module: str) -> list[str]:
    """The project files `module` runs: its import closure within the project packages, package
    `__init__` files included, plus declared code data. Sorted paths, relative to the working
    directory when inside it."""
    if module not in _CLOSURES:
        _CLOSURES[module] = _closure(module)
    return sorted(_display(p) for p in _CLOSURES[module])


def _closure(module: str) -> list[Path]:
    roots = _package_roots()
    files: set[Path] = set()
    todo, seen = [module], set()
    while todo:
        name = todo.pop()
        if name in seen or name in PLANNER:
            continue
        seen.add(name)
        path = _module_file(name, roots)
        if path is None:
            continue
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]   # parent packages run first
        files.add(path)
        tree = ast.parse(path.read_bytes(), filename=str(path))
        files.update(_code_data(tree, path.parent))
        todo += sorted(_imports(tree, name, path.name == "__init__.py"))
    return sorted(p.resolve() for p in files)


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()



# ---------------------------------------------------------------- description files

def write_description(job: Job, layout: Layout) -> bool:
    """Write the job's description file when its content changed; returns whether it was written.

    Snakemake compares the file's date with the job's outputs. A description that is the one the
    outputs were made from (their run record says so: an edit undone, or outputs made by DVC) gets
    the date the run started, so it counts as older than them; any other new content is newer."""
    from minbert.core.io import write_text

    path = Path(layout.job_file(job.stage, job.name))
    description = job.description()
    text = json.dumps(description, indent=1, sort_keys=True, default=str) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    write_text(path, text)
    started = _made_from(job, description)
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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, MinBertError):
        return None


__all__ = ["Job", "pipeline", "job_for", "code_closure", "write_description"]
