"""The job files both engines depend on (results/jobs/<stage>[/<name>].json), as a plan of the params
writes them (`resolve`: Snakemake each time it reads the Snakefile, DVC's first stage), and as a dry
run plans them without writing where a real run reads (`plan_only`)."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from minbert.core.layout import Layout
from minbert.core.provenance import one_pass
from minbert.params import LoadedParams
from minbert.params.overrides import dvc_rewrite_problems
from minbert.params.unread import unread_settings
from minbert.pipeline import finished
from minbert.pipeline.job import Job
from minbert.pipeline.plan import made_from, planned_file, write_job_file
from workflow import params_text
from workflow.repo import LAYOUT, REPO, in_repo, jobs, load


def resolve(params: str | Path | LoadedParams = "params.yaml", repo: Path = REPO, overrides=(),
            layout: Layout = LAYOUT) -> list[Job]:
    """Write every job's description file whose content changed, and remove the records of finished
    work of jobs the params no longer have (minbert.pipeline.finished.prune); returns the jobs. A
    setting no job reads (minbert.params.unread), and what would break `dvc exp run -S` in the
    params files, are said on stderr, once per load."""
    lp, all_jobs = _planned(params, repo, overrides, layout)
    with in_repo(repo), one_pass():
        for job in all_jobs:
            write_job_file(job)
        for f in (lp.path, lp.source):    # the text a later `dvc exp run -S` is compared with (params_text)
            if f is not None and Path(f).is_file():
                params_text.keep(layout.job_files, _in_repo(f, repo), Path(f).read_text(encoding="utf-8"))
        finished.prune(layout.results, all_jobs)
        _prune_job_files(all_jobs, layout)
        date_job_files(all_jobs)
        date_outputs(all_jobs)
    return all_jobs


def settle_dates(all_jobs: list[Job], repo: Path = REPO) -> None:
    """After a run: the dates `resolve` would give, given now (a job file whose job kept its outputs
    as they were, an output older than what its job read), so that a dry run after it, which
    writes nothing, plans nothing."""
    with in_repo(repo), one_pass():
        date_job_files(all_jobs)
        date_outputs(all_jobs)


def date_job_files(all_jobs: list[Job]) -> None:
    """Give each job file whose description made the outputs in place an earlier date where it needs
    one (`_earlier_date`)."""
    for job in all_jobs:
        date = _earlier_date(job)
        if date is not None:
            os.utime(job.job_file, (date, date))


def date_outputs(all_jobs: list[Job]) -> None:
    """Give each output of a finished job that is older than what the job read (its run record says
    it read what is in place now) the date its run started: Snakemake, which compares dates, then
    finds nothing to do over a run it did not make. DVC makes such dates: it stores files of the
    same content once, and a workspace file it links to its cache shares that copy's date, which may
    be another job's file's, made earlier (two experiments' identical predictions). A file so shared
    becomes a copy of its own first, so the date of no other file changes. Jobs in the planner's
    order, each after the jobs it reads."""
    for job in all_jobs:
        newest = max((t for p in job.read_paths for t in _mtimes(Path(p))), default=None)
        made = [Path(f) for f in job.output_files] + [Path(Layout(job.results).benchmark(job.stage, job.name))]
        stale = [p for p in made if newest is not None and any(t < newest for t in _mtimes(p))]
        started = made_from(job, job.description()) if stale else None
        if started is None:
            continue
        when = max(started, newest)
        for path in stale:
            for p in [q for q in path.rglob("*") if q.is_file()] if path.is_dir() else [path]:
                _date_own_copy(p, when)
            if path.is_dir():
                os.utime(path, (when, when))


def _date_own_copy(path: Path, when: float) -> None:
    """Date `path`, made first a file of its own where it shares its content with other names (a hard
    link to DVC's cache): a copy beside it, renamed over it."""
    try:
        if path.stat().st_mtime >= when:
            return
        if path.stat().st_nlink > 1:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            os.close(fd)
            shutil.copy2(path, tmp)
            os.replace(tmp, path)
        os.utime(path, (when, when))
    except OSError:
        return


def plan_only(params: str | Path | LoadedParams = "params.yaml", repo: Path = REPO, overrides=(),
              layout: Layout = LAYOUT) -> tuple[list[Job], dict[str, str]]:
    """The jobs as `resolve` plans them, for a dry run: nothing is written where a real run reads it
    (the job files of the results folder, its records), so a plan of other params or settings
    changes nothing another run relies on. Only an output DVC left older than what its job read
    (restored from its cache) gets the date its run started, as a run gives it first (`date_outputs`:
    its run record says it was made from what is in place), so that the dry run plans what the run
    will do. A job file `resolve` would write or date anew is written
    to a folder of its own, removed when the process ends, with the content and date it would get
    there: (jobs, {job file: its stand-in}), the stand-ins being what a dry run's rules read."""
    _, all_jobs = _planned(params, repo, overrides, layout)
    stand_ins: dict[str, str] = {}
    with in_repo(repo), one_pass():
        date_outputs(all_jobs)         # as a run does first: no content changes, a date its run record attests
        for job in all_jobs:
            path, (text, date) = Path(job.job_file), planned_file(job)
            try:
                same = path.read_text(encoding="utf-8") == text
            except (OSError, UnicodeDecodeError):
                same = False
            if same:
                date = _earlier_date(job)
            else:                              # what write_job_file, then resolve, would date it
                date = date if date is None else (_earlier_date(job, date) or date)
            if same and date is None:
                continue
            stand_in = Path(_dry_run_folder()) / path.relative_to(path.anchor) if path.is_absolute() \
                else Path(_dry_run_folder()) / path
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text(text, encoding="utf-8")
            if date is not None:
                os.utime(stand_in, (date, date))
            stand_ins[job.job_file] = str(stand_in)
    return all_jobs, stand_ins


def _planned(params, repo: Path, overrides, layout: Layout) -> tuple[LoadedParams, list[Job]]:
    """The params and their jobs, after saying on stderr what a load says (unread settings, what
    would break `dvc exp run -S`)."""
    lp = load(params, repo, overrides)
    with in_repo(repo):
        problems = [p for f in dict.fromkeys([lp.path, lp.source]) if f is not None for p in dvc_rewrite_problems(f)]
    for line in problems + unread_settings(lp):
        print(f"warning: {line}", file=sys.stderr)
    return lp, jobs(lp, repo, layout=layout)


def _in_repo(path: str | Path, repo: Path) -> str:
    """`path` relative to the repository where it lies inside it (as DVC names params files)."""
    try:
        return Path(path).resolve().relative_to(Path(repo).resolve()).as_posix()
    except ValueError:
        return Path(path).name


_DRY_RUN: list[str] = []


def _dry_run_folder() -> str:
    """A folder of this process's own for a dry run's job files, removed when it ends."""
    if not _DRY_RUN:
        _DRY_RUN.append(tempfile.mkdtemp(prefix="minbert-dry-run-"))
        atexit.register(shutil.rmtree, _DRY_RUN[0], True)
    return _DRY_RUN[0]


def _earlier_date(job: Job, mtime: float | None = None) -> float | None:
    """The date to give a job file whose description made the job's outputs now in place (its run
    record says so), when it is later than the oldest of them, Snakemake's benchmark included, as a
    rewritten one gets (minbert.pipeline.plan.write_job_file); None when its date may stay.
    Snakemake, which compares dates, then runs nothing after a run it did not make. DVC makes such
    runs: it runs a job again after a Snakemake run (Snakemake's benchmark stays, older than the job
    file DVC's `resolve` rewrote), or restores a job's outputs from its cache, with the dates the
    cache's copies have."""
    path = Path(job.job_file)
    made = [Path(o) for o in job.outputs] + [Path(Layout(job.results).benchmark(job.stage, job.name))]
    try:
        oldest = min((t for p in made for t in _mtimes(p)), default=None)
        if oldest is None or (path.stat().st_mtime if mtime is None else mtime) <= oldest:
            return None
    except OSError:
        return None
    started = made_from(job, job.description())
    return None if started is None else min(started, oldest)


def _mtimes(path: Path):
    """The dates of a file, or of a folder and everything in it; none for a path that is not there."""
    if path.is_dir():
        yield path.stat().st_mtime
        for root, _, names in os.walk(path):
            yield from (os.stat(os.path.join(root, n)).st_mtime for n in names)
    elif path.exists():
        yield path.stat().st_mtime


def _prune_job_files(all_jobs: list[Job], layout: Layout) -> None:
    """Remove the job files of jobs the params no longer have: a target naming one finds no job file,
    as for a name the params never had."""
    wanted = {Path(j.job_file) for j in all_jobs}
    folder = Path(layout.job_files)
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        if path not in wanted and not path.is_symlink():
            path.unlink()
