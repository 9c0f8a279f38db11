"""What every stage CLI shares: its arguments, its job and its settings.

    call = stage_call("finetune", __doc__, argv, settings=FinetuneSettings)
    call.settings.finetune.lr, call.job.reads["splits"], call.job.writes["model"]

An engine starts a stage with `--job results/jobs/<stage>/<name>.json`, the job file it depends on
(minbert.pipeline.job): the stage reads its settings, inputs and outputs from it, checked against
what the stage specs derive, and nothing else of the params. By hand, without `--job`, the
stage plans its own job from `--params` (minbert.pipeline.plan.job_for), with the same result. The
settings reach the stage as plain, frozen data (minbert.core.settings), read from the job's
description: what computes never runs the params' schema. How a stage's jobs are named on the
command line (--experiment E, --name N) is the stage specs'.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

from minbert.core.layout import Layout
from minbert.core.settings import read_settings
from minbert.pipeline.job import Job
from minbert.pipeline.plan import job_for
from minbert.pipeline.stage_specs import STAGES

NAMED = {"experiment": "the experiment's name in params.yaml", "name": "its name in params.yaml"}   # default help


@dataclass
class StageCall:
    args: argparse.Namespace
    job: Job
    layout: Layout
    settings: object = None     # the job's settings as the stage reads them (minbert.core.settings)

    @property
    def name(self) -> str | None:
        return self.job.name


def stage_parser(stage: str, doc: str) -> argparse.ArgumentParser:
    """--params, --results, --job, --force and, for a stage with one job per name, `--<named>`."""
    spec = STAGES[stage]
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--params", default="params.yaml", help="the parameter file (default: params.yaml)")
    p.add_argument("--results", default="results", help="the results folder (default: results)")
    p.add_argument("--job", default=None, help="the job file an engine wrote (results/jobs/<stage>/<name>.json); "
                                               "without it the job is planned from --params")
    p.add_argument("--force", action="store_true", help="run even when this job's outputs, as its last run wrote "
                                                         "them for the same settings, inputs and code, are in place")
    if spec.named:
        p.add_argument(f"--{spec.named}", required=True, help=spec.name_help or NAMED[spec.named])
    return p


def stage_call(stage: str, doc: str, argv: list[str] | None, *,
               arguments: Callable[[argparse.ArgumentParser], None] | None = None, reports: str | None = None,
               settings: type | None = None) -> StageCall:
    """Parse the stage's arguments (`arguments` adds its own) and find its job. `reports`: the name of
    an argument holding the reports folder (the report stage's --out); `settings`: the class the stage
    reads its settings as (minbert.core.settings)."""
    p = stage_parser(stage, doc)
    if arguments is not None:
        arguments(p)
    args = p.parse_args(argv)
    named = STAGES[stage].named
    name = getattr(args, named) if named else None
    if args.job:
        job = Job.read(args.job, stage, name)
        layout = Layout(job.results, job.reports)
    else:
        layout = Layout(args.results, getattr(args, reports) if reports else "reports")
        job = job_for(args.params, stage, name, layout)
    plain = read_settings(settings, job.settings, job.job_file) if settings is not None else None
    return StageCall(args, job, layout, plain)


def main_process() -> bool:
    """False in the other ranks of a torchrun launch (only rank 0 writes outputs)."""
    return int(os.environ.get("RANK", "0")) == 0


def folders_of(paths: list[str]) -> list[str]:
    """The folders holding `paths` (a job's named reads or writes), once each, in order."""
    return list(dict.fromkeys(str(os.path.dirname(p)) or "." for p in paths))


def folder_of(paths: list[str]) -> str:
    """The one folder holding all of `paths` (a predictions folder, the prepared data)."""
    folders = folders_of(paths)
    if len(folders) != 1:
        raise ValueError(f"expected the files of one folder, got {len(folders)} folders")
    return folders[0]
