"""One job of the pipeline: its resolved description, its outputs, and the file both live in.

A job's description is
- `settings`: what its stage reads from the params (minbert.params.settings, resolved: base merged,
  catalogue applied; cosmetic keys are in no stage's settings but the report's);
- `reads`: the files and folders it reads, by name (`job.reads["splits"]`), as the stage specs
  (minbert.pipeline.stage_specs) derives them;
- `code`: the code it runs (minbert.pipeline.code), each file (named relative to the project's
  folder, never to the working folder) with the hash of what it does; `modules`: which of those
  files each of the user's modules its settings name holds (the module and its helpers);
- `sources`: the content hash of each input no job makes (raw data; a model, by the files it loads,
  whether a local folder, the packaged one or a Hub snapshot), so new bytes re-run the job and a new
  date alone does not.
Paths under the results folder (and the reports folder) are described relative to it
(`<results>/data/sst-train.tsv`), so one folder named two ways (`results`, `$PWD/results`) is one
job. The description's hash, with the content hashes of what the job reads, is its fingerprint
(minbert.pipeline.runinfo: the resume check, the run record, its kept outputs).

The job file, results/jobs/<stage>/<name>.json, holds the description and where the job writes.
The planner (minbert.pipeline.plan) writes it when it changes; both engines depend on it; a stage
started by an engine reads its job from it (`--job FILE`) and nothing else of the params, once the
file is checked against what the registry derives for its stage, name and settings.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.provenance import path_hash
from minbert.pipeline.stage_specs import STAGES, Stage

JOB_FORMAT = "minbert-job-2"
RESULTS_MARK, REPORTS_MARK = "<results>", "<reports>"


@dataclass
class Job:
    stage: str
    name: str | None
    settings: dict                                   # what the stage reads from the params (JSON types)
    reads: dict[str, list[str]]                      # what it reads, by name
    writes: dict[str, list[str]]                     # what it writes, by name
    run_record: str = ""
    results: str = "results"                         # the results folder it runs in (its state, its lock)
    reports: str = "reports"                         # the reports folder (the report's pages)
    # the files inside each output folder, where known (prepare's splits, a teacher's files):
    # Snakemake declares those files, which it can compare by content (minbert.pipeline.code)
    files: dict[str, list[str]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # reads no job makes (raw data, a model folder)
    models: list[str] = field(default_factory=list)   # the models it loads that no job makes (a folder or a name)
    code_roots: list[str] = field(default_factory=list)   # modules whose closure is its code
    deps: list[str] = field(default_factory=list)    # reads as the engines track them (set by the planner)
    holders: dict[str, list[str]] = field(default_factory=dict)   # dep -> the reads inside it (the planner's)
    recorded: dict | None = field(default=None, repr=False)   # the description as read from its job file
    _described: dict | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, stage: str, name: str | None, settings, layout: Layout) -> Job:
        """The job of `stage` named `name` with these settings (a model of minbert.params.settings,
        or JSON types), in `layout`: what it reads and writes, as the registry derives them."""
        spec = STAGES[stage]
        model = settings if spec.model is None or isinstance(settings, spec.model) else spec.model(**settings)
        io = spec.io(layout, name, model)
        dumped = model if spec.model is None else model.model_dump(mode="json")
        return cls(stage, name, dumped, io.reads, io.writes, layout.run_record(stage, name), layout.results,
                   layout.reports, io.files, io.sources, io.models, spec.code_roots(model))

    @property
    def spec(self) -> Stage:
        return STAGES[self.stage]

    @property
    def id(self) -> str:
        return self.stage if self.name is None else f"{self.stage}@{self.name}"

    @property
    def module(self) -> str:
        return self.spec.module

    @property
    def read_paths(self) -> list[str]:
        """Every path it reads, once each, in the order of its named reads."""
        return list(dict.fromkeys(p for paths in self.reads.values() for p in paths))

    def _named(self, names) -> list[str]:
        return [p for n, paths in self.writes.items() if n in names for p in paths]

    @property
    def outs(self) -> list[str]:
        """The outputs that are neither metrics nor plots (DVC caches these)."""
        return [p for n, paths in self.writes.items() if n not in self.spec.metrics + self.spec.plots for p in paths]

    @property
    def metrics(self) -> list[str]:
        return self._named(self.spec.metrics)

    @property
    def plots(self) -> list[str]:
        return self._named(self.spec.plots)

    @property
    def outputs(self) -> list[str]:
        """Every declared output: outs, metrics, plots and the run record."""
        return self.outs + self.metrics + self.plots + [self.run_record]

    @property
    def output_files(self) -> list[str]:
        """The outputs with each folder whose files are known listed file by file."""
        return [f for o in self.outputs for f in self.files.get(o, [o])]

    @property
    def job_file(self) -> str:
        return Layout(self.results).job_file(self.stage, self.name)

    @property
    def cmd(self) -> str:
        """The engines' command: the stage reads its job from the job file the engine depends on."""
        named = [f"--{self.spec.named}", self.name] if self.spec.named else []
        return " ".join(["python -m", self.module, *named, "--job", self.job_file])

    # ------------------------------------------------------------ the description

    def portable(self, path: str) -> str:
        """`path` as the description names it: relative to the results (or reports) folder when
        inside it, as given otherwise."""
        for root, mark in ((self.results, RESULTS_MARK), (self.reports, REPORTS_MARK)):
            root = root.rstrip("/") or "/"
            if path == root:
                return mark
            if path.startswith(root + "/"):
                return mark + path[len(root):]
        return path

    def _portable_reads(self) -> dict[str, list[str]]:
        return {k: [self.portable(p) for p in paths] for k, paths in self.reads.items()}

    def source_hashes(self) -> dict[str, str | None]:
        """The content hash of each source: a raw file's bytes, a model's files (minbert.core.models)."""
        return {self.portable(p): self.read_hash(p) for p in dict.fromkeys([*self.sources, *self.models])}

    def read_hash(self, path: str) -> str | None:
        """The content hash of one read as the job's fingerprint holds it: a model's by its files
        (minbert.core.models), anything else by its bytes (a folder by its files' names and bytes)."""
        from minbert.core.models import model_hash

        return model_hash(path) if path in self.models else path_hash(path)

    def description(self) -> dict:
        """The resolved description (settings, reads, the code with what each file does, and the
        content hash of each source). A job read from its file gives the description written there."""
        if self.recorded is not None:
            return self.recorded
        if self._described is None:       # computed once per job: the planner asks it more than once
            from minbert.pipeline.code import code_hashes, module_files, user_roots

            out = {"stage": self.stage, "name": self.name, "settings": self.settings,
                   "reads": self._portable_reads(), "code": code_hashes(*self.code_roots)}
            if user_roots(self.code_roots):     # which of its code files each module of the user's holds
                out["modules"] = {m: module_files(m) for m in user_roots(self.code_roots)}
            if self.sources or self.models:
                out["sources"] = self.source_hashes()
            self._described = out
        return self._described

    def runtime_description(self) -> dict:
        """The description with the content hash of everything it reads, as it is now (the sources
        hashed again): what the fingerprint of a running job covers."""
        hashes = self.source_hashes() if self.sources or self.models else {}
        sources = set(self.sources)
        hashes.update({self.portable(p): self.read_hash(p) for p in self.read_paths if p not in sources})
        return {**self.description(), "read_hashes": hashes}

    # ------------------------------------------------------------ the job file

    def file_text(self, stale: list[str] = ()) -> str:
        """The job file's content: the description and where the job writes; `stale`: the reads its
        outputs were not made from (minbert.pipeline.plan.write_job_file), which make the file new."""
        where = {"results": self.results, "reports": self.reports, "writes": self.writes,
                 "run_record": self.run_record, **({"stale": sorted(stale)} if stale else {})}
        return json.dumps({"format": JOB_FORMAT, "description": self.description(), "job": where},
                          sort_keys=True, default=str) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike, stage: str, name: str | None) -> Job:
        """The job of `stage`/`name` from its job file, checked against what the registry derives for
        that stage, name and settings (known settings only, the outputs the layout gives in its
        results folder, the file where the planner writes it); a one-line error otherwise."""
        from minbert.core.io import read_input

        path = Path(path)
        redo = "write it anew (python -m workflow.dag --resolve, or run the stage without --job)"
        try:
            info = json.loads(read_input(path, "job file", limit=64 << 20).decode("utf-8"))
            description, where = info["description"], info["job"]
            if info.get("format") != JOB_FORMAT:
                raise ValueError("another format")
            got = (description["stage"], description["name"])
            results, reports = where["results"], where["reports"]
            if not (isinstance(results, str) and isinstance(reports, str) and isinstance(description, dict)):
                raise TypeError("results, reports")
        except MinBertError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError, RecursionError) as e:
            raise MinBertError(f"{path}: not a job file of this version ({type(e).__name__}); {redo}") from None
        want = stage if name is None else f"{stage}@{name}"
        if got != (stage, name):
            raise MinBertError(f"{path}: holds job {_shown(got)}, not {want}; check --job")
        job = cls.build(stage, name, _checked_settings(path, stage, description.get("settings")),
                        Layout(results, reports))
        if job.spec.gathers is not None:    # the other jobs' outputs, as the planner listed them
            job.reads = job._local_reads(path, description.get("reads"), redo)
        job.recorded = description
        _check_against_derived(path, job, description, where, redo)
        return job

    def local(self, path: str) -> str:
        """A path as the description names it (`portable`) as a path again."""
        for root, mark in ((self.results, RESULTS_MARK), (self.reports, REPORTS_MARK)):
            if path == mark or path.startswith(mark + "/"):
                return root.rstrip("/") + path[len(mark):]
        return path

    def _local_reads(self, path: Path, reads, redo: str) -> dict[str, list[str]]:
        """A gathering job's reads from its job file: the outputs of other jobs, all in its results
        folder (what else it might name is no job's output); a one-line error otherwise."""
        ok = isinstance(reads, dict) and all(isinstance(v, list) and all(isinstance(p, str) and
                                                                         p.startswith(RESULTS_MARK + "/") for p in v)
                                             for v in reads.values())
        if not ok:
            raise MinBertError(f"{path}: its reads are not outputs in its results folder; {redo}")
        return {k: [self.local(p) for p in v] for k, v in reads.items()}


def _shown(got) -> str:
    stage, name = (str(x)[:80] for x in got)
    return stage if got[1] is None else f"{stage}@{name}"


def _checked_settings(path: Path, stage: str, settings):
    """A job file's settings as its stage's model reads them: a setting the stage does not know, or a
    value it refuses, is one line naming the key."""
    from pydantic import ValidationError

    model = STAGES[stage].model
    if model is None:
        if not isinstance(settings, dict):
            raise MinBertError(f"{path}: the report's settings are not a mapping; write it anew")
        return settings
    try:
        return model.model_validate(settings)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "settings"
        raise MinBertError(f"{path}: setting '{key}' of {stage}: {err['msg']}; a job file holds the settings the "
                           f"planner resolved: write it anew (python -m workflow.dag --resolve)") from None


def _check_against_derived(path: Path, job: Job, description: dict, where: dict, redo: str) -> None:
    """The job file is where the planner writes it and lists what the registry derives: the outputs
    in its results folder, and (but for a stage that gathers the other jobs' outputs, the report,
    whose reads are the planner's list of them) its reads."""
    planned_in = _planned_in(path, job)
    if planned_in is not None:
        raise MinBertError(f"{path}: its paths are relative to the folder it was planned in, {str(planned_in)[:200]}, "
                           f"not to this one; run the stage from there (cd {str(planned_in)[:200]})")
    if path.resolve() != Path(job.job_file).resolve():
        raise MinBertError(f"{path}: the job file of {job.id} for the results folder {job.results[:200]} is "
                           f"{job.job_file[:200]}, not this file; give --job that file, or {redo}")
    derived = {"writes": job.writes, "run_record": job.run_record}
    listed = {"writes": where.get("writes"), "run_record": where.get("run_record")}
    if job.spec.gathers is None:
        derived["reads"], listed["reads"] = job._portable_reads(), description.get("reads")
    for key, value in derived.items():
        if listed[key] != value:
            raise MinBertError(f"{path}: its {key} are not what the planner derives for {job.id} (a job file "
                               f"edited by hand, or of another version); {redo}")


def _planned_in(path: Path, job: Job) -> Path | None:
    """The folder a job file with relative paths was planned in, when the stage runs elsewhere: the
    file lies where the planner writes it, seen from that folder (its results and its inputs are
    that folder's, never this one's); None otherwise."""
    rel = Path(job.job_file)
    where = path.resolve()
    if rel.is_absolute() or where == rel.resolve() or where.parts[-len(rel.parts):] != rel.parts:
        return None
    return Path(*where.parts[:-len(rel.parts)])


def inside(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies under it (links followed)."""
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def refuse_inputs_inside_outputs(job: Job) -> None:
    """No input of the job that no job makes (raw data, the NLI file, a model folder) is, or lies
    inside, a path the job replaces (its outputs, its resumable state): the job would delete what it
    is about to read (raw CSVs fetched into results/data). Checked before anything is removed."""
    replaced = [Path(p) for p in [*job.outputs, Layout(job.results).state(job.stage, job.name)]]
    for read in job.sources:
        for out in replaced:
            if inside(Path(read), out):
                raise MinBertError(f"{read}: an input of {job.id} lies inside {out}, which {job.id} deletes and "
                                   f"writes anew; move the input out of {out} and point the setting that names it "
                                   f"(data.dir, data.nli_file, model) at the new place")
