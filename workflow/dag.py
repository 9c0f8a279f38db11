"""The pipeline's DAG for both engines, rendered from the library's jobs (minbert.pipeline.plan).

Every job has a resolved description (its settings, what it reads, the code it runs) written to
results/jobs/<stage>/<name>.json, and rewritten only when it changes. Both engines depend on that
file and on the outputs the job reads:
- the Snakefile builds one rule per stage; the description file is an input, so a job re-runs when
  its description is newer than its outputs (the Snakefile rewrites changed descriptions each
  time it is read);
- dvc.yaml (`python -m workflow.dag --write-dvc`) has a `resolve` stage that rewrites the
  description files from the params (its params: the whole params file), then one stage per job
  depending on its description file (by hash), its inputs and its code files.
A test keeps the committed dvc.yaml equal to the generated one.

    python -m workflow.dag                       # print the jobs
    python -m workflow.dag --write-dvc           # (re)generate dvc.yaml from params.yaml
    python -m workflow.dag --check               # exit 1 when dvc.yaml is out of date
    python -m workflow.dag --resolve             # rewrite the changed description files (DVC's first stage)
    python -m workflow.dag --params params/minilm.yaml --write-dvc   # dvc.yaml for another params file
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from minbert.core.errors import MinBertError  # noqa: E402
from minbert.core.layout import Layout  # noqa: E402
from minbert.params import CATALOGUE_SECTIONS, load_params, model_tasks  # noqa: E402
from minbert.pipeline.code import PROJECT_PACKAGES, user_module_file  # noqa: E402
from minbert.pipeline.job import Job  # noqa: E402
from minbert.pipeline.plan import pipeline, write_job_file  # noqa: E402

LAYOUT = Layout()
# What each stage asks of the machine. Snakemake caps `threads` at --cores on one machine; on a
# cluster they become the job's CPUs (capped by --max-threads). The stages that run the network ask for `gpu` GPUs each
# (`--config gpu=0` on a CPU-only cluster); mem_mb in MB, runtime in minutes.
STAGE_RESOURCES = {
    "prepare": {"threads": 1, "mem_mb": 4000, "runtime": 30},
    "pretrain": {"threads": 8, "mem_mb": 32000, "runtime": 600, "gpu": 1},
    "finetune": {"threads": 8, "mem_mb": 32000, "runtime": 480, "gpu": 1},
    "retrain_heads": {"threads": 8, "mem_mb": 16000, "runtime": 120, "gpu": 1},
    "predict": {"threads": 8, "mem_mb": 16000, "runtime": 60, "gpu": 1},
    "teach": {"threads": 8, "mem_mb": 16000, "runtime": 120, "gpu": 1},
    "evaluate": {"threads": 1, "mem_mb": 2000, "runtime": 10},
    "ensemble": {"threads": 1, "mem_mb": 4000, "runtime": 10},
    "report": {"threads": 1, "mem_mb": 8000, "runtime": 30},
    "export": {"threads": 1, "mem_mb": 8000, "runtime": 20},
}
RESOLVE_STAGE = "resolve"


@contextlib.contextmanager
def _in(repo: Path):
    old = Path.cwd()
    os.chdir(repo)
    try:
        yield
    finally:
        os.chdir(old)


def jobs(params_path: str | Path = "params.yaml", repo: Path = REPO) -> list[Job]:
    """Every job of the pipeline, each after the jobs whose outputs it reads (paths relative to repo)."""
    with _in(repo):
        return pipeline(str(params_path), LAYOUT)


def resolve(params_path: str | Path = "params.yaml", repo: Path = REPO) -> list[Job]:
    """Write every job's description file whose content changed; returns the jobs."""
    all_jobs = jobs(params_path, repo)
    with _in(repo):
        for job in all_jobs:
            write_job_file(job, LAYOUT)
    return all_jobs


def check_sources(all_jobs: list[Job], params_path: str | Path, repo: Path = REPO) -> None:
    """Every source a job reads (raw data, the NLI file, a model folder: what no job makes) is there;
    a one-line error naming the first missing one otherwise. Snakemake would silently skip a job
    whose inputs are missing while its outputs exist (prepare's, from another data folder), and run
    what follows on them."""
    with _in(repo):
        for job in all_jobs:
            missing = [s for s in job.sources if not os.path.exists(s)]
            if missing:
                raise MinBertError(
                    f"{missing[0]}: not found, and {job.id} reads it ({len(missing)} such path(s); set in "
                    f"{params_path}: data.dir, data.nli_file or a model); point the params at it (python -m "
                    f"stages.fetch_data fetches the CS224N files) and run again")


def stage_resources(stage: str, gpus: int = 1) -> dict:
    """A stage's Snakemake resources (threads apart): GPUs only for the network stages and only when
    `gpus` > 0."""
    res = {k: v for k, v in STAGE_RESOURCES[stage].items() if k != "threads"}
    if "gpu" in res:
        res["gpu"] = int(gpus)
        if not res["gpu"]:
            del res["gpu"]
    return res


def stage_threads(stage: str, gpus: int, jobs_per_gpu: int, cores: int | None, local: bool = True) -> int:
    """A stage's threads. A job that runs the network on a GPU of this machine needs a few CPU
    threads, not the 8 it takes on a CPU: the machine's cores are shared by the jobs its GPUs hold
    at once (`jobs_per_gpu` per GPU), so that many run side by side. Jobs sent to a cluster
    (`local` false) ask for the stage's own threads: the submitting machine's GPUs say nothing of
    the nodes'."""
    threads = STAGE_RESOURCES[stage]["threads"]
    if not local or "gpu" not in stage_resources(stage, gpus):
        return threads
    from workflow.gpu_slot import visible_gpus

    visible = len(visible_gpus())
    if not visible:
        return threads
    return max(1, (cores or os.cpu_count() or 1) // (visible * jobs_per_gpu))


# ---------------------------------------------------------------- Snakemake

STAGE_MESSAGES = {
    "prepare": "prepare: read and check the raw files, write the prepared splits",
    "pretrain": "pretrain {wildcards.name}",
    "finetune": "fine-tune {wildcards.name}",
    "retrain_heads": "retrain the heads of {wildcards.name} over its frozen encoder",
    "predict": "predict the dev and test splits with {wildcards.name}",
    "evaluate": "score the predictions of {wildcards.name}",
    "teach": "teacher {wildcards.name}: its outputs on the training data",
    "ensemble": "ensemble {wildcards.name}: combine its members' predictions",
    "report": "report: the HTML pages",
    "export": "export {wildcards.name} in the Hugging Face format",
}


def _pattern(path: str, sample: Job) -> str:
    """A job's path with its name replaced by the {name} wildcard."""
    if sample.name is None:
        return path
    name = sample.name
    return "/".join("{name}" + part[len(name):] if part == name or part.startswith(name + ".") else part
                    for part in path.split("/"))


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


def rule_groups(all_jobs: list[Job]) -> list[tuple[str, str, Job, str]]:
    """The Snakemake rules: (rule name, stage, sample job, pattern of its {name} wildcard). One rule
    per stage, unless its jobs declare outputs of different shapes (each predictions file is an
    output, and experiments predict different tasks): then one rule per shape, the first named
    after the stage, the others `<stage>_2`, `<stage>_3`, .... Each rule's {name} matches exactly
    its jobs' names, so a target naming no job (an unknown experiment, an export not listed in
    export.experiments) is Snakemake's own "no rule to produce" error."""
    shapes: dict = {}
    for job in all_jobs:
        key = tuple(_pattern(p, job) for p in job.output_files)
        shapes.setdefault(job.stage, {}).setdefault(key, []).append(job)
    out = []
    for stage, by_shape in shapes.items():
        for k, group in enumerate(by_shape.values()):
            name = "|".join(re.escape(j.name) for j in group) if group[0].name is not None else NAME_PATTERN
            out.append((stage if k == 0 else f"{stage}_{k + 1}", stage, group[0], name))
    return out


class SnakemakeDag:
    """The jobs as the Snakefile declares them: one rule per stage and output shape, a checkpoint
    where other jobs read the outputs (Snakemake then judges those jobs again once it has run: an
    output that came out with the same content re-runs nothing after it), and each job's inputs."""

    def __init__(self, all_jobs: list[Job]):
        self.jobs = {j.id: j for j in all_jobs}
        self.groups = rule_groups(all_jobs)
        self.rule_of = {}
        for rule, stage, sample, pattern in self.groups:
            for job in all_jobs:
                if job.stage == stage and (job.name is None or re.fullmatch(pattern, job.name)) and \
                        job.id not in self.rule_of:
                    self.rule_of[job.id] = rule
        self.maker = {o: j for j in all_jobs for o in j.outputs}
        read = {self.maker[d].id for j in all_jobs for d in j.deps if d in self.maker}
        self.checkpoint_rules = {self.rule_of[i] for i in read}

    def job(self, stage: str, wildcards) -> Job:
        return self.jobs[stage if "name" not in wildcards.keys() else f"{stage}@{wildcards.name}"]

    def upstream(self, job: Job) -> list[tuple[str, dict]]:
        """The checkpoint rules (and their wildcards) of the jobs whose outputs `job` reads, but those
        whose run record it reads (the report, an export): a run record is new at every run, so the
        job runs again whenever they do, and Snakemake knows that without judging it again."""
        makers = {self.maker[d].id: self.maker[d] for d in job.deps if d in self.maker}
        return [(self.rule_of[m.id], {} if m.name is None else {"name": m.name}) for m in makers.values()
                if m.run_record not in job.deps]

    def inputs_after(self, checkpoints, stage: str, wildcards) -> list:
        """A job's inputs, once the checkpoints it reads from have run (Snakemake's `checkpoints`
        object: asking it for a checkpoint that has still to run defers the job until it has)."""
        job = self.job(stage, wildcards)
        for rule_name, names in self.upstream(job):
            getattr(checkpoints, rule_name).get(**names)
        return self.inputs(job)

    def inputs(self, job: Job) -> list:
        """The job file and the deps, each file of a listed folder that the job reads on its own (so
        Snakemake compares it by content). A source (raw data, made by no job) counts as old: its
        content hash is in the description, so new bytes re-run the job through the job file, and a
        new date alone (a copy, a fresh checkout, a re-mounted data folder) re-runs nothing, as under
        DVC."""
        from snakemake.io import ancient

        out = [LAYOUT.job_file(job.stage, job.name)]
        for dep in job.deps:
            maker = self.maker.get(dep)
            if dep in job.sources:
                out.append(ancient(dep))
            elif maker is not None and dep in maker.files:
                # the files of the folder the job reads: those it names, or all the maker lists when
                # it reads the whole folder (a teacher's outputs); each links the job to its maker
                inside = [r for r in job.reads if r.startswith(dep.rstrip("/") + "/")]
                out += maker.files[dep] if dep in job.reads or not inside else inside
            else:
                out.append(dep)
        return out


def snakemake_outputs(sample: Job) -> list:
    """The stage's output patterns, folders marked as such (a folder whose files are known is listed
    file by file); the HTML reports and the metrics go into `snakemake --report`."""
    from snakemake.io import directory, report

    out = []
    for path in sample.output_files:
        pattern = _pattern(path, sample)
        if "." not in Path(path).name:              # folders have no suffix
            out.append(directory(pattern))
        elif path in sample.metrics:
            out.append(report(pattern, category="Metrics", subcategory=sample.stage,
                              labels={"job": sample.stage, "name": "{name}" if sample.name else "-"}))
        elif path.endswith(".html"):
            out.append(report(pattern, category="Reports", labels={"page": "final"}))
        else:
            out.append(pattern)
    return out


def all_outputs(all_jobs: list[Job]) -> list[str]:
    """Every declared output of every job but the exports (their own targets): what `rule all` asks
    for (Snakemake would otherwise take a deleted intermediate output for a temporary one and re-run
    nothing)."""
    return [o for job in all_jobs if job.stage != "export" for o in job.output_files]


def whole_number(config: dict, key: str, default: int, what: str) -> int:
    """A `--config key=N` setting as a whole number >= 0; a one-line error naming it otherwise."""
    value = config.get(key, default)
    try:
        number = int(str(value))
        if number < 0:
            raise ValueError
    except ValueError:
        raise MinBertError(f"--config {key}={value}: expected a whole number (0 or more) of {what}") from None
    return number


def snakemake_log(sample: Job) -> str:
    return _pattern(LAYOUT.log(sample.stage, sample.name), sample)


def snakemake_benchmark(sample: Job) -> str:
    return _pattern(LAYOUT.benchmark(sample.stage, sample.name), sample)


def run_in_process(job: Job, log: str) -> None:
    """Run a job's stage in this process (its `main` with the job's arguments), its log to `log`:
    how `--config in_process=true` runs many tiny jobs without a Python start-up each."""
    import importlib
    import logging
    import shlex
    from contextlib import redirect_stderr, redirect_stdout

    argv = shlex.split(job.cmd)[3:]                 # python -m stages.X <args>
    module = importlib.import_module(job.module)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    from minbert.pipeline.runinfo import UpToDate

    with open(log, "w", encoding="utf-8") as out, redirect_stdout(out), redirect_stderr(out):
        try:
            module.main(argv)
        except UpToDate as e:
            print(e)
        except MinBertError as e:
            raise RuntimeError(f"{job.id}: {e}") from None
        finally:
            for h in list(logging.getLogger().handlers):   # the stage's handlers wrote to this log
                logging.getLogger().removeHandler(h)


# ---------------------------------------------------------------- dvc.yaml

def _dvc_stage_name(job: Job) -> str:
    return job.id.replace("@", "-")


def params_source(params_path: str | Path = "params.yaml", repo: Path = REPO) -> list[str]:
    """The params files DVC tracks: the params file, and the catalogue file it takes sections from."""
    lp = load_params(repo / params_path)
    files = [str(params_path)]
    if lp.source is not None and Path(lp.source).resolve() != (repo / params_path).resolve():
        files.append(Path(lp.source).resolve().relative_to(repo.resolve()).as_posix())
    return files


def user_modules(all_jobs: list[Job], repo: Path) -> list[str]:
    """The files of the user's modules (params' `modules:`) some job runs, those inside the project:
    the resolve stage depends on them as on the project's folders."""
    out = []
    with _in(repo):
        for module in {m for j in all_jobs for m in j.code_roots if not m.startswith(PROJECT_PACKAGES)}:
            path = user_module_file(module)
            if path is not None and path.resolve().is_relative_to(repo.resolve()):
                out.append(path.resolve().relative_to(repo.resolve()).as_posix())
    return out


def dvc_yaml(params_path: str | Path = "params.yaml", repo: Path = REPO) -> dict:
    """dvc.yaml as a dict: the resolve stage, one stage per job, metrics and plots for DVC's views."""
    all_jobs = jobs(params_path, repo)
    params_arg = "" if str(params_path) == "params.yaml" else f" --params {params_path}"
    folders = _DvcFolders(all_jobs)
    stages = {RESOLVE_STAGE: {
        "cmd": f"python -m workflow.dag --resolve{params_arg}",
        "params": [{f: None} for f in params_source(params_path, repo)],
        # what the job files it writes hold: the code (each file's hash: the project's folders are
        # enough to re-run it) and the sources' content hashes
        "deps": sorted({p for p in PROJECT_PACKAGES if (repo / p).is_dir()} | set(user_modules(all_jobs, repo)) |
                       set(folders.sources([s for j in all_jobs for s in j.sources]))),
        "outs": [{LAYOUT.job_files: {"persist": True, "cache": False}}],
    }}
    for job in all_jobs:
        # the job file holds the content hash of the job's code closure: it changes when that code
        # does, so the code files are not listed again here (the resolve stage reads them).
        # DVC compares one metrics file, the report's summary (`dvc exp show` stays readable); each
        # job's own metrics file is a cached output like the others. Metrics and curves are cached:
        # DVC reads them for every commit and experiment (`dvc exp show`, `metrics diff`, `plots diff`)
        metrics = [m for m in job.metrics if m == LAYOUT.summary_metrics]
        st: dict = {"cmd": job.cmd, "deps": [LAYOUT.job_file(job.stage, job.name)] + folders.deps(job),
                    "outs": job.outs + [m for m in job.metrics if m not in metrics] + [job.run_record]}
        if metrics:
            st["metrics"] = metrics
        if job.plots:
            st["plots"] = job.plots
        stages[_dvc_stage_name(job)] = st
    return {"stages": stages, "plots": _dvc_plot_views(all_jobs, params_path, repo)}


class _DvcFolders:
    """A job's dependencies as dvc.yaml lists them: a folder where the job reads everything in it
    that any job writes (a predictions folder, every fine-tuning's run record), one line where the
    Snakefile needs a file each (Snakemake compares files by content, DVC folders by hash); raw
    files sharing a folder as that folder."""

    def __init__(self, all_jobs: list[Job]):
        self.outputs = [o for j in all_jobs for o in j.outputs]
        self.own = {j.id: j.outputs for j in all_jobs}

    @staticmethod
    def _under(path: str, folder: str) -> bool:
        return path.startswith(folder.rstrip("/") + "/")

    def deps(self, job: Job) -> list[str]:
        deps = [d for d in job.deps if d not in job.sources]
        out: list[str] = []
        for dep in deps:
            folder = self._widest(dep, set(deps), job)
            if folder not in out:
                out.append(folder)
        return out + [s for s in self.sources(job.sources) if s not in out]

    def _widest(self, dep: str, deps: set[str], job: Job) -> str:
        """The widest folder above `dep` whose every output the job reads (and none of its own)."""
        best, parts = dep, dep.split("/")
        for k in range(len(parts) - 1, 1, -1):            # never the results folder itself
            folder = "/".join(parts[:k])
            inside = [o for o in self.outputs if self._under(o, folder) or o == folder]
            if not inside or any(self._under(o, folder) for o in self.own[job.id]) or not set(inside) <= deps:
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


def _dvc_plot_views(all_jobs: list[Job], params_path, repo: Path) -> list:
    """Top-level plots: the dev curves per experiment and the SST/Quora dev confusion matrices."""
    from minbert.core.tasks import TASKS

    lp = load_params(repo / params_path)
    views = []
    for job in all_jobs:
        if job.stage == "finetune":
            tasks = lp.experiment(job.name).finetune.tasks
            cols = [f"dev_{t}_{TASKS[t].metric}" for t in tasks]
            views.append({f"{job.name}-dev-curves": {"x": "epoch", "y": {job.plots[0]: cols},
                                                     "title": f"{job.name}: dev metrics per epoch"}})
        if job.stage in ("predict", "ensemble"):
            members = [job.name] if job.stage == "predict" else lp.params.ensembles[job.name].members
            tasks = set.intersection(*(set(model_tasks(lp.experiment(m))) for m in members))
            for task in (t for t in TASKS if t in tasks and TASKS[t].kind != "regression"):
                views.append({f"{job.name}-{task}-dev-confusion": {
                    "template": "confusion", "x": "prediction",
                    "y": {next(o for o in job.outs if o.endswith(f"/{task}-dev.csv")): "label"},
                    "title": f"{job.name}: {task} dev confusion"}})
    return views


HEADER = ("# Generated by `python -m workflow.dag --write-dvc` from the params file; do not edit by hand.\n"
          "# The Snakefile builds the same jobs from workflow/dag.py.\n")


def render_dvc(params_path: str | Path = "params.yaml", repo: Path = REPO) -> str:
    return HEADER + yaml.safe_dump(dvc_yaml(params_path, repo), sort_keys=False, width=120)


def dvc_commit(all_jobs: list[Job], repo: Path = REPO) -> bool:
    """Record the outputs in dvc.lock (`dvc commit --force`) without touching their timestamps.

    DVC re-links committed files into the workspace, which would make them look newer to
    Snakemake than the jobs that read them; restoring the times keeps a later Snakemake run a no-op.
    """
    import subprocess

    times = {}
    for job in all_jobs:
        for out in job.outputs + [LAYOUT.job_file(job.stage, job.name)]:
            path = repo / out
            for p in ([path] + sorted(path.rglob("*")) if path.is_dir() else [path]):
                if p.exists():
                    st = p.stat()
                    times[p] = (st.st_atime_ns, st.st_mtime_ns)
    ok = subprocess.run(["dvc", "commit", "--force", "--quiet"], cwd=repo).returncode == 0
    for p in sorted(times, key=lambda q: len(q.parts), reverse=True):   # files before their folders
        if p.exists():
            os.utime(p, ns=times[p], follow_symlinks=False)
    return ok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="List the pipeline's jobs; generate dvc.yaml; write job descriptions")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--write-dvc", action="store_true", help="write dvc.yaml")
    ap.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml differs from the generated one")
    ap.add_argument("--resolve", action="store_true", help="rewrite the job description files that changed "
                                                           "(dvc.yaml must be up to date)")
    a = ap.parse_args(argv)
    dvc_path = REPO / "dvc.yaml"
    if a.write_dvc:
        dvc_path.write_text(render_dvc(a.params), encoding="utf-8")
        print(f"wrote {dvc_path.relative_to(REPO)} ({len(jobs(a.params))} jobs)")
    elif a.check or a.resolve:
        if not dvc_path.is_file() or dvc_path.read_text(encoding="utf-8") != render_dvc(a.params):
            raise MinBertError(f"dvc.yaml is out of date with {a.params} (jobs added, removed or moved): run "
                               f"`python -m workflow.dag --write-dvc{'' if a.params == 'params.yaml' else ' --params ' + a.params}`")
        if a.resolve:
            resolve(a.params)
        print("dvc.yaml is up to date")
    else:
        for job in jobs(a.params):
            print(f"{job.id:40s} {job.cmd}")


if __name__ == "__main__":
    from minbert.entry import run

    run(main)

__all__ = ["CATALOGUE_SECTIONS"]
