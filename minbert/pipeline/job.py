"""One job of the pipeline: its resolved description, its outputs, and the file both live in.

A job's description is
- `settings`: what its stage reads from the params (minbert.params.settings, resolved: base merged,
  catalogue applied; cosmetic keys are in no stage's settings but the report's);
- `reads`: the files and folders it reads (prepared splits, upstream models, raw data);
- `code`: the code it runs (minbert.pipeline.code), each file with the hash of what it does;
- `sources`: the content hash of each raw input no job makes (raw data), so new bytes re-run the
  job and a new date alone does not.
Its hash, with the content hashes of what it reads, is the job's fingerprint (the resume check,
the run record).

The job file, results/jobs/<stage>/<name>.json, holds the description and where the job writes.
The planner (minbert.pipeline.plan) writes it when it changes; both engines depend on it; a stage
started by an engine reads its job from it (`--job FILE`) and nothing else of the params.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.provenance import path_hash

JOB_FORMAT = "minbert-job-1"


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
    reports: str = "reports"                         # the reports folder (the report's pages)
    code_roots: list[str] = field(default_factory=list)   # modules whose closure is its code (default: the stage's)
    # the files inside each output folder, where the planner knows them (prepare's splits, a teacher's
    # files): Snakemake declares those files, which it can compare by content (minbert.pipeline.code)
    files: dict[str, list[str]] = field(default_factory=dict)
    recorded: dict | None = field(default=None, repr=False)   # the description as read from its job file

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

    @property
    def output_files(self) -> list[str]:
        """The outputs with each folder whose files are known listed file by file."""
        return [f for o in self.outputs for f in self.files.get(o, [o])]

    def description(self) -> dict:
        """The resolved description (settings, reads, the code with what each file does, and the
        content hash of each source). A job read from its file gives the description written there."""
        if self.recorded is not None:
            return self.recorded
        from minbert.pipeline.code import code_closure, code_hash

        out = {"stage": self.stage, "name": self.name, "settings": self.settings, "reads": self.reads,
               "code": {p: code_hash(p) for p in code_closure(*(self.code_roots or [self.module]))}}
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

    # ------------------------------------------------------------ the job file

    def file_text(self) -> str:
        """The job file's content: the description and where the job writes."""
        where = {k: v for k, v in asdict(self).items() if k not in ("settings", "reads", "recorded", "stage", "name")}
        return json.dumps({"format": JOB_FORMAT, "description": self.description(), "job": where}, indent=1,
                          sort_keys=True, default=str) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike, stage: str, name: str | None) -> Job:
        """The job of `stage`/`name` from its job file; a one-line error for a file that is missing,
        unreadable, or another job's."""
        from minbert.core.io import read_input

        path = Path(path)
        redo = "write it anew (python -m workflow.dag --resolve, or run the stage without --job)"
        try:
            info = json.loads(read_input(path, "job file", limit=64 << 20).decode("utf-8"))
            description, where = info["description"], info["job"]
            if info.get("format") != JOB_FORMAT:
                raise ValueError("another format")
            job = cls(stage=description["stage"], name=description["name"], settings=description["settings"],
                      reads=description["reads"], recorded=description, **where)
        except MinBertError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError, RecursionError) as e:
            raise MinBertError(f"{path}: not a job file of this version ({type(e).__name__}); {redo}") from None
        if (job.stage, job.name) != (stage, name):
            got = job.id
            want = stage if name is None else f"{stage}@{name}"
            raise MinBertError(f"{path}: holds job {got}, not {want}; check --job")
        return job


def inside(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies under it (links followed)."""
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def refuse_inputs_inside_outputs(job: Job, extra_reads=()) -> None:
    """No input of the job (raw data, the NLI file, a model folder) is, or lies inside, a path the job
    replaces (its outputs, its resumable state): the job would delete what it is about to read (raw
    CSVs fetched into results/data). Checked before anything is removed."""
    replaced = [Path(p) for p in [*job.outputs, Layout(job.results).state(job.stage, job.name)]]
    for read in [*job.reads, *job.sources, *map(str, extra_reads)]:
        for out in replaced:
            if inside(Path(read), out):
                raise MinBertError(f"{read}: an input of {job.id} lies inside {out}, which {job.id} deletes and "
                                   f"writes anew; move the input out of {out} and point the setting that names it "
                                   f"(data.dir, data.nli_file, model) at the new place")
