"""dvc.yaml, generated from the pipeline's jobs (workflow/dag.py) for DVC: the `resolve` stage that
rewrites the job files, then one stage per job with the same command, inputs and outputs as the
Snakemake job; a job's dependencies listed as the folders it reads whole; DVC's plots. A test keeps
the committed dvc.yaml equal to the generated one (`python -m workflow.dag --write-dvc`). The tasks
it names are looked up in the params' own registry (minbert.core.registry)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from minbert.core.layout import TRAINING_STAGES, Layout
from minbert.core.tasks import TASKS
from minbert.params import LoadedParams
from minbert.pipeline.code import PROJECT_PACKAGES, module_files, project_root, user_roots
from minbert.pipeline.job import Job
from workflow.repo import LAYOUT, REPO, in_repo, jobs, load

RESOLVE_STAGE = "resolve"      # dvc.yaml's first stage: it rewrites the job files that changed


def dvc_stage_name(job: Job) -> str:
    return job.id.replace("@", "-")


def params_source(lp: LoadedParams, params_path: str | Path = "params.yaml", repo: Path = REPO) -> list[str]:
    """The params files DVC tracks: the params file, the catalogue file it takes sections from, and
    those its paper tables are transcribed in (`transcribed_in`)."""
    files = [str(params_path)]
    for other in [lp.source, *lp.transcribed] if lp.source is not None else lp.transcribed:
        source = (Path(repo) / other).resolve()             # a relative source is the repository's
        name = source.relative_to(Path(repo).resolve()).as_posix()
        if source != (Path(repo) / params_path).resolve() and name not in files:
            files.append(name)
    return files


def user_modules(all_jobs: list[Job], repo: Path) -> list[str]:
    """The files of the user's modules (params' `modules:`) some job runs, each module's helpers
    included (minbert.pipeline.code.module_files), those inside the project: the resolve stage
    depends on them as on the project's folders."""
    out = set()
    with in_repo(repo):
        for module in {m for j in all_jobs for m in user_roots(j.code_roots)}:
            for name in module_files(module):
                path = Path(name) if Path(name).is_absolute() else project_root() / name
                if path.resolve().is_relative_to(repo.resolve()):
                    out.add(path.resolve().relative_to(repo.resolve()).as_posix())
    return sorted(out)


def dvc_yaml(params_path: str | Path = "params.yaml", repo: Path = REPO, lp: LoadedParams | None = None,
             all_jobs: list[Job] | None = None, layout: Layout = LAYOUT) -> dict:
    """dvc.yaml as a dict: the resolve stage, one stage per job, metrics and plots for DVC's views
    (`lp`, `all_jobs`: the params and jobs of `params_path`, where already at hand; `layout`: where
    they write).

    A training stage's outputs are its folder (the model, its curve and, where `tracking` asks, the
    trackers' logs), so turning a tracker on changes what the stage writes, not the stage: DVC's
    graph stays the one `dvc exp run -S` started with, and the trackers' metrics and plots are
    top-level views (`resolve` rewrites them)."""
    repo = Path(repo)
    lp = lp or load(params_path, repo)
    all_jobs = all_jobs if all_jobs is not None else jobs(lp, repo, layout=layout)
    args = ("" if str(params_path) == "params.yaml" else f" --params {params_path}") + \
        ("" if layout.results == LAYOUT.results else f" --results {layout.results}") + \
        ("" if layout.reports in (LAYOUT.reports, f"{layout.results.rstrip('/')}/reports")
         else f" --reports {layout.reports}")
    folders = _DvcFolders(all_jobs)
    stages = {RESOLVE_STAGE: {
        "cmd": f"python -m workflow.dag --resolve{args}",
        "params": [{f: None} for f in params_source(lp, params_path, repo)],
        # what the job files it writes hold: the code (each file's hash: the project's folders are
        # enough to re-run it) and the sources' content hashes
        "deps": sorted({p for p in PROJECT_PACKAGES if (repo / p).is_dir()} | set(user_modules(all_jobs, repo)) |
                       set(folders.sources([s for j in all_jobs for s in j.sources]))),
        "outs": [{layout.job_files: {"persist": True, "cache": False}}],
    }}
    views: dict[str, list] = {"metrics": [], "plots": []}
    for job in all_jobs:
        stages[dvc_stage_name(job)] = _stage(job, folders, views)
    with lp.registry.active():
        plots = _dvc_plot_views(all_jobs) + views["plots"]
    return {"stages": stages, **({"metrics": views["metrics"]} if views["metrics"] else {}), "plots": plots}


def _stage(job: Job, folders: _DvcFolders, views: dict[str, list]) -> dict:
    """A job's dvc.yaml stage. The job file holds the content hash of the job's code closure: it
    changes when that code does, so the code files are not listed again here (the resolve stage
    reads them). DVC compares one metrics file, the report's summary (`dvc exp show` stays
    readable); each job's own metrics file is a cached output like the others. Metrics and curves
    are cached: DVC reads them for every commit and experiment (`dvc exp show`, `metrics diff`,
    `plots diff`), and a tracked run's DVCLive summary, which the user asked DVC to show
    (finetune.tracking), is a top-level metric."""
    st: dict = {"cmd": job.cmd, "deps": [job.job_file] + folders.deps(job)}
    if job.stage in TRAINING_STAGES:
        named = job.writes
        views["metrics"] += named.get("live_metrics", [])
        views["plots"] += named.get("live_plots", [])
        st["outs"] = [Layout(job.results).training(job.name, job.stage), job.run_record]
        return st
    metrics = [m for m in job.metrics if m == Layout(job.results).summary_metrics]
    st["outs"] = job.outs + [m for m in job.metrics if m not in metrics] + [job.run_record]
    if metrics:
        st["metrics"] = metrics
    if job.plots:
        st["plots"] = job.plots
    return st


def _ancestors(path: str, itself: bool = True) -> list[str]:
    """The folders above `path` (and `path` itself), as prefixes of its parts."""
    parts = path.split("/")
    return ["/".join(parts[:k]) for k in range(len(parts) if itself else len(parts) - 1, 0, -1)]


class _DvcFolders:
    """A job's dependencies as dvc.yaml lists them: the files it reads inside another job's output
    folder (the prepared splits of its tasks, as the Snakefile lists them: a task added to prepare
    re-runs only what reads its files); a folder where the job reads everything in it that any job
    writes (a predictions folder, every fine-tuning's run record), one line where the Snakefile needs
    a file each (Snakemake compares files by content, DVC folders by hash); raw files sharing a
    folder as that folder. Linear: each folder's count of outputs is counted once."""

    def __init__(self, all_jobs: list[Job]):
        self.outputs = {o for j in all_jobs for o in j.outputs}
        self.known = {o for j in all_jobs for o in j.files}      # output folders whose files are known
        # a training stage's folder is its output under DVC: what reads its curve or its trackers'
        # logs (the report) depends on the folder; its model is read on its own
        self.training = {Layout(j.results).training(j.name, j.stage): Layout(j.results).model(j.name, j.stage)
                         for j in all_jobs if j.stage in TRAINING_STAGES}
        self.total: dict[str, int] = {}
        for o in self.outputs:
            for folder in _ancestors(o):
                self.total[folder] = self.total.get(folder, 0) + 1

    def deps(self, job: Job) -> list[str]:
        sources = set(job.sources)
        deps = list(dict.fromkeys(self._training_folder(r) for d in job.deps if d not in sources
                                  for r in self._read_inside(job, d)))
        read: dict[str, int] = {}
        for d in (d for d in deps if d in self.outputs):
            for folder in _ancestors(d):
                read[folder] = read.get(folder, 0) + 1
        own = {f for o in job.outputs for f in _ancestors(o, itself=False)}
        out: list[str] = []
        for dep in deps:
            folder = self._widest(dep, read, own)
            if folder not in out:
                out.append(folder)
        return out + [s for s in self.sources(job.sources) if s not in out]

    def _training_folder(self, dep: str) -> str:
        """A training stage's folder for what lies in it but its model; anything else as it is."""
        folder = next((f for f in _ancestors(dep, itself=False) if f in self.training), None)
        return folder if folder is not None and self.training[folder] != dep else dep

    def _read_inside(self, job: Job, dep: str) -> list[str]:
        """What the job reads of `dep`: the files it names inside an output folder whose files are
        known, or `dep` itself (a job that reads the whole folder, as the report reads the data's)."""
        inside = [r for r in job.holders.get(dep, []) if r != dep] if dep in self.known else []
        return inside or [dep]

    def _widest(self, dep: str, read: dict[str, int], own: set[str]) -> str:
        """The widest folder above `dep` whose every output the job reads (and none of its own)."""
        best, parts = dep, dep.split("/")
        for k in range(len(parts) - 1, 1, -1):            # never the results folder itself
            folder = "/".join(parts[:k])
            if not self.total.get(folder) or folder in own or read.get(folder, 0) != self.total[folder]:
                break
            best = folder
        return best

    @staticmethod
    def sources(sources: list[str]) -> list[str]:
        """Raw files that share a folder with another raw file: that folder, once."""
        by_folder: dict[str, list[str]] = {}
        for s in sources:
            by_folder.setdefault(str(Path(s).parent.as_posix()), []).append(s)
        out = []
        for folder, files in by_folder.items():
            for item in ([folder] if len(set(files)) > 1 and folder not in (".", "") else files):
                if item not in out:
                    out.append(item)
        return sorted(out)


def _dvc_plot_views(all_jobs: list[Job]) -> list:
    """Top-level plots: the dev curves per experiment and the SST/Quora dev confusion matrices."""
    views = []
    for job in all_jobs:
        if job.stage == "finetune":
            cols = [f"dev_{t}_{TASKS[t].metric}" for t in job.settings["finetune"]["tasks"]]
            views.append({f"{job.name}-dev-curves": {"x": "epoch", "y": {job.plots[0]: cols},
                                                     "title": f"{job.name}: dev metrics per epoch"}})
        if job.stage in ("predict", "ensemble"):
            tasks = set(job.settings["predicts"])
            for task in (t for t in TASKS if t in tasks and TASKS[t].kind != "regression"):
                views.append({f"{job.name}-{task}-dev-confusion": {
                    "template": "confusion", "x": "prediction",
                    "y": {next(o for o in job.outs if o.endswith(f"/{task}-dev.csv")): "label"},
                    "title": f"{job.name}: {task} dev confusion"}})
    return views


HEADER = ("# Generated by `python -m workflow.dag --write-dvc` from the params file; do not edit by hand.\n"
          "# The Snakefile builds the same jobs from workflow/dag.py.\n")


def render_dvc(params_path: str | Path = "params.yaml", repo: Path = REPO, lp: LoadedParams | None = None,
               all_jobs: list[Job] | None = None, layout: Layout = LAYOUT) -> str:
    return HEADER + yaml.safe_dump(dvc_yaml(params_path, repo, lp, all_jobs, layout), sort_keys=False, width=120)


def stage_changes(have: str, want: str) -> str:
    """How the stages of dvc.yaml text `want` differ from those of `have`, in words ("" when alike)."""
    def stages(text: str) -> dict:
        try:
            return (yaml.safe_load(text) or {}).get("stages") or {}
        except yaml.YAMLError:
            return {}

    old, new = stages(have), stages(want)
    said = [(what, [n for n in names][:4], len(names)) for what, names in (
        ("added", [n for n in new if n not in old]), ("removed", [n for n in old if n not in new]),
        ("changed", [n for n in new if n in old and new[n] != old[n]]))]
    return "; ".join(f"{what}: {', '.join(names)}{f' and {n - 4} more' if n > 4 else ''}"
                     for what, names, n in said if n)


def built(all_jobs: list[Job], repo: Path = REPO) -> list[str]:
    """The dvc.yaml stages whose outputs are all there (what a run built): `dvc commit --force` of every
    stage stops at the first whose outputs are missing (an export the default target does not build)."""
    return [RESOLVE_STAGE] + [dvc_stage_name(j) for j in all_jobs if all((repo / o).exists() for o in j.outputs)]


def records_in_dvc(setting, repo: Path, params_path: str, layout: Layout, all_jobs: list[Job], overrides) -> bool:
    """Whether a Snakemake run records its outputs in dvc.lock: as `--config dvc_commit=` says, and by
    default where DVC would run the same jobs: a DVC repository (`.dvc/`, `dvc` installed) whose
    dvc.yaml is the one of these params and results folder, for a run without `--config set=`
    (outputs of settings params.yaml does not hold are not what DVC would make of it)."""
    if setting is not None and str(setting).strip():
        return str(setting).strip().lower() not in ("false", "0", "no")
    if overrides or not (Path(repo) / ".dvc").is_dir() or shutil.which("dvc") is None:
        return False
    try:
        have = (Path(repo) / "dvc.yaml").read_text(encoding="utf-8")
    except OSError:
        return False
    return have == render_dvc(params_path, repo, None, all_jobs, layout)


def dvc_commit(all_jobs: list[Job], repo: Path = REPO) -> bool:
    """Record the outputs of the stages that were built in dvc.lock (`dvc commit --force STAGE...`)
    without touching their dates, nor giving DVC's copies other dates.

    DVC re-links committed files into the workspace, which would make them look newer to
    Snakemake than the jobs that read them; restoring the times keeps a later Snakemake run a no-op.
    And it copies a folder's files into its cache: a run DVC restores later (a setting tried, then
    undone) links the workspace to those copies, with their dates. Each copy gets the date of the
    file it copies, so what DVC restores is dated as Snakemake made it, each job's outputs after
    its inputs."""
    times = {}
    for job in all_jobs:
        for out in job.outputs + [job.job_file]:
            path = repo / out
            for p in ([path] + sorted(path.rglob("*")) if path.is_dir() else [path]):
                if p.exists():
                    st = p.stat()
                    times[p] = (st.st_atime_ns, st.st_mtime_ns)
    stages = built(all_jobs, repo)
    ok = subprocess.run(["dvc", "commit", "--force", "--quiet", *stages], cwd=repo, check=False).returncode == 0
    for p in sorted(times, key=lambda q: len(q.parts), reverse=True):   # files before their folders
        if p.exists():
            os.utime(p, ns=times[p], follow_symlinks=False)
    if ok:
        _date_cache_copies(repo, stages, times)
    return ok


def _date_cache_copies(repo: Path, stages: list[str], times: dict) -> None:
    """Give the cache's copy of each recorded output file the date of the workspace file (dvc.lock
    names each file's hash; a folder's hash names a listing of its files' hashes)."""
    r = subprocess.run(["dvc", "cache", "dir"], cwd=repo, capture_output=True, text=True, check=False)
    try:
        cache = Path(r.stdout.strip()) / "files" / "md5"
        lock = yaml.safe_load((repo / "dvc.lock").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return
    for name in stages:
        for out in ((lock.get("stages") or {}).get(name) or {}).get("outs") or []:
            md5, path = str(out.get("md5", "")), repo / str(out.get("path", ""))
            if md5.endswith(".dir"):
                try:
                    listing = json.loads((cache / md5[:2] / md5[2:]).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                pairs = [(path / e["relpath"], e["md5"]) for e in listing if isinstance(e, dict)]
            else:
                pairs = [(path, md5)]
            for file, digest in pairs:
                copy = cache / digest[:2] / digest[2:]
                if file in times and copy.is_file():
                    os.utime(copy, ns=times[file])
