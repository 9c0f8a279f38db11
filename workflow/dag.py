"""The pipeline's DAG for both engines, rendered from the library's jobs (minbert.pipeline.plan) and
the stage specs (minbert.pipeline.stage_specs: each stage's message, resources and paths).

Every job has a resolved description (its settings, what it reads, the code it runs) written to
results/jobs/<stage>/<name>.json, and rewritten only when it changes (workflow/jobfiles.py). Both
engines depend on that file and on the files the job reads:
- the Snakefile builds one rule per stage (per output shape); the description file is an input, so
  a job re-runs when its description is newer than its outputs (the Snakefile rewrites changed
  descriptions each time it is read; a dry run reads copies of them in a temporary folder);
- dvc.yaml has a `resolve` stage that rewrites the description files from the params (its params:
  the whole params file), and dvc.yaml itself where the params change it, then one stage per job
  depending on its description file (by hash; it holds the hash of the job's code) and its inputs.
A test keeps the committed dvc.yaml equal to the generated one. Everything here is linear in the
number of jobs (a grid of 10,000 experiments plans in seconds).

    python -m workflow.dag                       # print the jobs
    python -m workflow.dag --write-dvc           # (re)generate dvc.yaml from params.yaml
    python -m workflow.dag --check               # exit 1 when dvc.yaml is out of date
    python -m workflow.dag --resolve             # DVC's first stage: job files, dvc.yaml, params.yaml's layout
    python -m workflow.dag --dvc-commit          # record in dvc.lock what a run built
    python -m workflow.dag --params params/minilm.yaml --results results-minilm --write-dvc   # another params file

The repository, its params and its jobs as both engines take them are workflow/repo.py; dvc.yaml is
rendered by workflow/dvc.py.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import shlex
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from workflow.repo import LAYOUT, REPO, in_repo, jobs, layout_for, load  # the repository's folder first on sys.path

from minbert.core.errors import MinBertError  # noqa: E402
from minbert.core.layout import Layout  # noqa: E402
from minbert.params import CATALOGUE_SECTIONS, LoadedParams  # noqa: E402
from minbert.params.overrides import split_set  # noqa: E402
from minbert.pipeline.job import Job  # noqa: E402
from minbert.pipeline.runinfo import UpToDate  # noqa: E402
from minbert.pipeline.stage_specs import STAGES  # noqa: E402
from workflow import params_text  # noqa: E402
from workflow.dvc import built, dvc_commit, params_source, render_dvc, stage_changes  # noqa: E402
from workflow.dvc_plots import write_template  # noqa: E402
from workflow.gpu_slot import visible_gpus  # noqa: E402
from workflow.jobfiles import plan_only, resolve, settle_dates  # noqa: E402

# What each stage asks of the machine is the stage specs' (minbert.pipeline.stage_specs): Snakemake
# caps `threads` at --cores on one machine; on a cluster they become the job's CPUs (capped by
# --max-threads). The stages that run the network ask for `gpu` GPUs each (`--config gpu=0` on a
# CPU-only cluster); mem_mb in MB, runtime in minutes.
STAGE_RESOURCES = {name: spec.resources for name, spec in STAGES.items()}


def check_sources(all_jobs: list[Job], params_path: str | Path, repo: Path = REPO) -> None:
    """Every source a job reads (raw data, the NLI file, a model folder: what no job makes) is there;
    a one-line error naming the first missing one otherwise. Snakemake would silently skip a job
    whose inputs are missing while its outputs exist (prepare's, from another data folder), and run
    what follows on them."""
    with in_repo(repo):
        for job in all_jobs:
            missing = [s for s in job.sources if not os.path.exists(s)]
            if missing:
                raise MinBertError(
                    f"{missing[0]}: not found, and {job.id} reads it ({len(missing)} such path(s); set in "
                    f"{params_path}: data.dir, data.nli_file or a model); point the params at it (python -m "
                    f"stages.fetch_data fetches the CS224N files) and run again")


# what a Snakemake command that runs no job asks for (the plan, the graph, a summary, the lint, ...)
PLANS_ONLY = ("dryrun", "dag", "rulegraph", "filegraph", "d3dag", "summary", "detailed_summary", "lint", "list_rules",
              "list_target_rules", "list_changes", "unlock", "cleanup_metadata", "print_compilation", "containerize",
              "export_cwl", "report")


def plans_only(workflow) -> bool:
    """Whether this Snakemake command runs no job (`-n`, `--dag`, `--summary`, `--lint`, ...): it then
    plans without writing what a real run reads (`plan_only`). Snakemake reads the Snakefile before it
    sets its executor, so its command line says it."""
    if workflow.dryrun:
        return True
    from snakemake.cli import get_argument_parser

    try:
        args, _ = get_argument_parser().parse_known_args(sys.argv[1:])
    except (SystemExit, Exception):       # noqa: BLE001 (not Snakemake's command line: a real run)
        return False
    return any(getattr(args, k, None) for k in PLANS_ONLY)


def stage_resources(stage: str, gpus: int = 1) -> dict:
    """A stage's Snakemake resources (threads apart): GPUs only for the network stages and only when
    `gpus` > 0."""
    res = {k: v for k, v in STAGES[stage].resources.items() if k != "threads"}
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
    threads = STAGES[stage].resources["threads"]
    if not local or "gpu" not in stage_resources(stage, gpus):
        return threads

    visible = len(visible_gpus())
    if not visible:
        return threads
    return max(1, (cores or os.cpu_count() or 1) // (visible * jobs_per_gpu))


# ---------------------------------------------------------------- Snakemake

def stage_message(stage: str) -> str:
    """The one line Snakemake prints for a job of `stage` (the stage specs', its name a wildcard)."""
    return STAGES[stage].message.replace("{name}", "{wildcards.name}")


def pattern_job(job: Job) -> Job:
    """The job as Snakemake's patterns: its paths from the layout with the name "{name}" (the
    stage specs derive them for that name and the job's settings)."""
    if job.name is None:
        return job
    return Job.build(job.stage, "{name}", job.settings, Layout(job.results, job.reports))


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


def rule_groups(all_jobs: list[Job]) -> list[tuple[str, str, Job, str]]:
    """The Snakemake rules: (rule name, stage, pattern job, pattern of its {name} wildcard). One rule
    per stage, whose {name} is any name (a constraint listing thousands of names would make every
    match Snakemake does as long as the list: quadratic work); a target naming no job (an unknown
    experiment, an export not listed in export.experiments) then lacks its first input, the job file
    of that name (`SnakemakeDag.inputs_after`), which is Snakemake's own one-line "missing input"
    error. A stage whose jobs declare outputs of different shapes (each predictions file is an
    output, and experiments predict different tasks) has one rule per shape, the first named after
    the stage, the others `<stage>_2`, `<stage>_3`, ..., each {name} matching exactly its jobs' names."""
    return [(rule, stage, sample, pattern) for rule, stage, sample, pattern, _ in _rules(all_jobs)]


def _rules(all_jobs: list[Job]) -> list[tuple[str, str, Job, str, list[Job]]]:
    shapes: dict = {}
    for job in all_jobs:
        sample = pattern_job(job)
        shapes.setdefault(job.stage, {}).setdefault(tuple(sample.output_files), (sample, []))[1].append(job)
    out = []
    for stage, by_shape in shapes.items():
        for k, (sample, group) in enumerate(by_shape.values()):
            exact = len(by_shape) > 1 and group[0].name is not None
            name = "|".join(re.escape(j.name) for j in group) if exact else NAME_PATTERN
            out.append((stage if k == 0 else f"{stage}_{k + 1}", stage, sample, name, group))
    return out


class SnakemakeDag:
    """The jobs as the Snakefile declares them: one rule per stage and output shape, a checkpoint
    where other jobs read the outputs (Snakemake then judges those jobs again once it has run: an
    output that came out with the same content re-runs nothing after it), and each job's inputs
    (`stand_ins`: a dry run's job files, `plan_only`, in place of those of the results folder)."""

    def __init__(self, all_jobs: list[Job], layout: Layout = LAYOUT, stand_ins: dict[str, str] | None = None):
        self.layout, self.stand_ins = layout, stand_ins or {}
        self.jobs = {j.id: j for j in all_jobs}
        rules = _rules(all_jobs)
        self.groups = [(rule, stage, sample, pattern) for rule, stage, sample, pattern, _ in rules]
        self.rule_of = {j.id: rule for rule, _, _, _, group in rules for j in group}
        self.maker = {o: j for j in all_jobs for o in j.outputs}
        read = {self.maker[d].id for j in all_jobs for d in j.deps if d in self.maker}
        self.checkpoint_rules = {self.rule_of[i] for i in read}
        self.heights = chain_heights(all_jobs, self.maker)

    def job(self, stage: str, wildcards) -> Job | None:
        """The job of `stage` the wildcards name; None for a name the params do not have."""
        return self.jobs.get(stage if "name" not in wildcards.keys() else f"{stage}@{wildcards.name}")

    def priority(self, stage: str, wildcards) -> int:
        """A job's Snakemake priority: how many jobs that run the network its longest chain still holds
        (`chain_heights`), so that among the jobs ready to run the head of a long chain (a pretraining,
        then its fine-tuning, head re-training and predictions) starts first, not last."""
        job = self.job(stage, wildcards)
        return 0 if job is None else self.heights.get(job.id, 0)

    def cmd(self, stage: str, wildcards) -> str:
        job = self.job(stage, wildcards)
        return job.cmd if job is not None else ""

    def upstream(self, job: Job) -> list[tuple[str, dict]]:
        """The checkpoint rules (and their wildcards) of the jobs whose outputs `job` reads, but those
        whose run record it reads (the report, an export): a run record is new at every run, so the
        job runs again whenever they do, and Snakemake knows that without judging it again."""
        deps = set(job.deps)
        makers = {self.maker[d].id: self.maker[d] for d in job.deps if d in self.maker}
        return [(self.rule_of[m.id], {} if m.name is None else {"name": m.name}) for m in makers.values()
                if m.run_record not in deps]

    def inputs_after(self, checkpoints, stage: str, wildcards, dry_run: bool = False) -> list:
        """A job's inputs, once the checkpoints it reads from have run (Snakemake's `checkpoints`
        object: asking it for a checkpoint that has still to run defers the job until it has). A
        dry run asks for none: its plan then holds every job a target needs (deferred jobs would
        be missing from it), each planned as reading what the jobs before it write."""
        job = self.job(stage, wildcards)
        if job is None:          # no such job: its job file is missing, Snakemake's own one-line error
            return [self.layout.job_file(stage, wildcards.name)]
        for rule_name, names in [] if dry_run else self.upstream(job):
            getattr(checkpoints, rule_name).get(**names)
        return self.inputs(job)

    def inputs(self, job: Job) -> list:
        """The job file and the deps, each file of a listed folder that the job reads on its own (so
        Snakemake compares it by content). A source (raw data, made by no job) counts as old: its
        content hash is in the description, so new bytes re-run the job through the job file, and a
        new date alone (a copy, a fresh checkout, a re-mounted data folder) re-runs nothing, as under
        DVC."""
        from snakemake.io import ancient

        out = [self.stand_ins.get(job.job_file, job.job_file)]
        sources = set(job.sources)
        for dep in job.deps:
            maker = self.maker.get(dep)
            if dep in sources:
                out.append(ancient(dep))
            elif maker is not None and dep in maker.files:
                # the files of the folder the job reads: those it names, or all the maker lists when
                # it reads the whole folder (a teacher's outputs); each links the job to its maker
                inside = [r for r in job.holders.get(dep, []) if r != dep]
                out += inside or maker.files[dep]
            else:
                out.append(dep)
        return out


def chain_heights(all_jobs: list[Job], maker: dict) -> dict[str, int]:
    """Per job, the most jobs that run the network (the stages with a `gpu` resource) on one path from
    it to the end of the graph, itself included: the critical-path order that list scheduling starts
    jobs in, counted in jobs rather than seconds (each such job costs minutes, the others seconds)."""
    readers: dict[str, list[Job]] = {j.id: [] for j in all_jobs}
    for j in all_jobs:
        for d in set(j.deps):
            if d in maker and maker[d].id != j.id:
                readers[maker[d].id].append(j)
    heights: dict[str, int] = {}

    def height(job: Job) -> int:
        if job.id not in heights:
            own = 1 if "gpu" in STAGES[job.stage].resources else 0
            heights[job.id] = own + max((height(r) for r in readers[job.id]), default=0)
        return heights[job.id]

    for j in all_jobs:
        height(j)
    return heights


def snakemake_outputs(sample: Job) -> list:
    """The output patterns of a rule (its pattern job, `pattern_job`), folders marked as such (a
    folder whose files are known is listed file by file); the HTML reports and the metrics go into
    `snakemake --report`."""
    from snakemake.io import directory, report

    out = []
    metrics = set(sample.metrics)
    for pattern in sample.output_files:
        if pattern == Layout(sample.results, sample.reports).experiment_reports:       # the pages final.html links to: in the report too
            out.append(report(directory(pattern), patterns=["{page}.html"], category="Reports",
                              labels={"page": "{page}"}))
        elif "." not in Path(pattern).name:            # folders have no suffix
            out.append(directory(pattern))
        elif pattern in metrics:
            out.append(report(pattern, category="Metrics", subcategory=sample.stage,
                              labels={"job": sample.stage, "name": "{name}" if sample.name else "-"}))
        elif pattern.endswith(".html"):
            out.append(report(pattern, category="Reports", labels={"page": "final"}))
        else:
            out.append(pattern)
    return out


def all_outputs(all_jobs: list[Job]) -> list[str]:
    """Every declared output of every job, the exports that params' `export.experiments` lists
    included: what `rule all` asks for (Snakemake would otherwise take a deleted intermediate output
    for a temporary one and re-run nothing), and what `dvc repro` builds, so that after either engine
    the other has nothing to do."""
    return [o for job in all_jobs for o in job.output_files]


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
    return Layout(sample.results).log(sample.stage, sample.name)


def snakemake_benchmark(sample: Job) -> str:
    return Layout(sample.results).benchmark(sample.stage, sample.name)


def run_in_process(job: Job, log: str) -> None:
    """Run a job's stage in this process (its `main` with the job's arguments), its log to `log`:
    how `--config in_process=true` runs many tiny jobs without a Python start-up each."""
    argv = shlex.split(job.cmd)[3:]                 # python -m stages.X <args>
    module = importlib.import_module(job.module)
    Path(log).parent.mkdir(parents=True, exist_ok=True)

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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="List the pipeline's jobs; generate dvc.yaml; write job descriptions")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--results", default=None, help="the results folder (default: results)")
    ap.add_argument("--reports", default=None, help="the reports folder (default: reports, or RESULTS/reports)")
    ap.add_argument("--write-dvc", action="store_true", help="write dvc.yaml")
    ap.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml differs from the generated one")
    ap.add_argument("--resolve", action="store_true", help="rewrite the job description files that changed, and "
                                                           "dvc.yaml where it changed (DVC's first stage)")
    ap.add_argument("--dvc-commit", action="store_true", help="record in dvc.lock the outputs of every stage "
                                                              "whose outputs are there (after a Snakemake run)")
    a = ap.parse_args(argv)
    layout = layout_for(a.results, a.reports)
    if a.write_dvc or a.resolve:          # `dvc plots show` offline: its page template, scripts inlined
        write_template(REPO)
    if a.resolve:                         # params.yaml as the user wrote it, after `dvc exp run -S`
        _restore_params_text(a.params, layout)
    lp = load(a.params, REPO)
    all_jobs = jobs(lp, layout=layout)
    if a.dvc_commit:
        if not dvc_commit(all_jobs, REPO):
            raise MinBertError("dvc commit --force failed (its message above); is this a DVC repository (dvc init)?")
        print(f"recorded {len(built(all_jobs, REPO)) - 1} of {len(all_jobs)} stages in dvc.lock (those whose "
              f"outputs are there)")
    elif a.write_dvc:
        DVC_YAML.write_text(render_dvc(a.params, REPO, lp, all_jobs, layout), encoding="utf-8")
        print(f"wrote {DVC_YAML.relative_to(REPO)} ({len(all_jobs)} jobs)")
    elif a.check or a.resolve:
        _check_or_resolve(a, lp, all_jobs, layout)
    else:
        for job in all_jobs:
            print(f"{job.id:40s} {job.cmd}")


DVC_YAML = REPO / "dvc.yaml"


def _restore_params_text(params: str, layout: Layout) -> None:
    """Put each params file back as the user wrote it where DVC's writer rewrote it (workflow.params_text)."""
    files = [params]
    try:
        files += [f for f in params_source(load(params, REPO), params, REPO) if f != params]
    except MinBertError:
        pass                              # the load below says what is wrong
    for f in files:
        said = params_text.restore(f, REPO, layout.job_files)
        if said:
            print(said, file=sys.stderr)


def _check_or_resolve(a, lp: LoadedParams, all_jobs: list[Job], layout: Layout) -> None:
    """`--check`: dvc.yaml is the one the params give, or exit 1. `--resolve` (DVC's first stage): the
    job files written, and dvc.yaml rewritten where the params changed it. DVC planned the run from
    the dvc.yaml it read when it started: a change of its metrics and plots alone goes on; a change of
    its stages (jobs added or removed, a job reading other files) stops the run with one line saying
    to run it again, as it now stands."""
    want = render_dvc(a.params, REPO, lp, all_jobs, layout)
    have = DVC_YAML.read_text(encoding="utf-8") if DVC_YAML.is_file() else ""
    if a.check:
        if have != want:
            other = "" if a.params == "params.yaml" else f" --params {a.params}"
            raise MinBertError(f"dvc.yaml is out of date with {a.params} ({stage_changes(have, want) or 'its views'}):"
                               f" run `python -m workflow.dag --write-dvc{other}`")
        print("dvc.yaml is up to date")
        return
    changes = stage_changes(have, want) if have != want else ""
    if have != want:
        DVC_YAML.write_text(want, encoding="utf-8")
        print(f"dvc.yaml: rewritten for {a.params} ({changes or 'its metrics and plots'})", file=sys.stderr)
    resolve(lp, layout=layout)
    if changes and os.environ.get("DVC_STAGE"):
        raise MinBertError(f"dvc.yaml: rewritten for {a.params} ({changes}); DVC planned this run from the "
                           "dvc.yaml before: run the same command again (dvc exp run, dvc repro)")
    print("dvc.yaml is up to date")


if __name__ == "__main__":
    from minbert.entry import run

    run(main)

__all__ = ["CATALOGUE_SECTIONS", "LAYOUT", "REPO", "in_repo", "jobs", "layout_for", "load", "plan_only", "settle_dates", "split_set"]
