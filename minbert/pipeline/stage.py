"""What every stage CLI shares: its arguments and its job.

    call = stage_call("finetune", __doc__, argv, named="experiment")
    s = FinetuneSettings(**call.job.settings)

An engine starts a stage with `--job results/jobs/<stage>/<name>.json`, the job file it depends on
(minbert.pipeline.job): the stage reads its settings, inputs and outputs from it and nothing else
of the params. By hand, without `--job`, the stage looks its job up in `--params` (the planner,
minbert.pipeline.plan), with the same result.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

from minbert.core.layout import Layout
from minbert.pipeline.job import Job

NAMED = {"experiment": "the experiment's name in params.yaml", "name": "its name in params.yaml"}


@dataclass
class StageCall:
    args: argparse.Namespace
    job: Job
    layout: Layout

    @property
    def name(self) -> str | None:
        return self.job.name


def stage_parser(doc: str, named: str | None = None, name_help: str | None = None) -> argparse.ArgumentParser:
    """--params, --results, --job and, for a stage with one job per name, `--<named>`."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--params", default="params.yaml", help="the parameter file (default: params.yaml)")
    p.add_argument("--results", default="results", help="the results folder (default: results)")
    p.add_argument("--job", default=None, help="the job file an engine wrote (results/jobs/<stage>/<name>.json); "
                                               "without it the job is looked up in --params")
    p.add_argument("--force", action="store_true", help="run even when this job's outputs for the same settings, "
                                                         "inputs and code are in place (kept from a finished run)")
    if named:
        p.add_argument(f"--{named}", required=True, help=name_help or NAMED[named])
    return p


def stage_call(stage: str, doc: str, argv: list[str] | None, *, named: str | None = None, name_help: str | None = None,
               arguments: Callable[[argparse.ArgumentParser], None] | None = None, reports: str | None = None
               ) -> StageCall:
    """Parse the stage's arguments (`arguments` adds its own) and find its job. `reports`: the name of
    an argument holding the reports folder (the report stage's --out)."""
    p = stage_parser(doc, named, name_help)
    if arguments is not None:
        arguments(p)
    args = p.parse_args(argv)
    name = getattr(args, named) if named else None
    if args.job:
        job = Job.read(args.job, stage, name)
        layout = Layout(job.results, job.reports)
    else:
        from minbert.pipeline.plan import job_for

        layout = Layout(args.results, getattr(args, reports) if reports else "reports")
        job = job_for(args.params, stage, name, layout)
    return StageCall(args, job, layout)


def main_process() -> bool:
    """False in the other ranks of a torchrun launch (only rank 0 writes outputs)."""
    return int(os.environ.get("RANK", "0")) == 0
