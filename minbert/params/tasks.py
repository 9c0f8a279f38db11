"""A task of the user's, declared in params.yaml's `tasks:` section the way the built-in tasks are
declared (minbert/core/tasks.yaml): one text or a pair, classes or a label range, its files and
their columns, its metric, its default head and loss (docs/extending.md).

    tasks:
      snli:
        title: inference (SNLI)
        classes: [entailment, neutral, contradiction]
        files: {format: jsonl, train: ../shared/data/nli/snli-sample.jsonl, dev_fraction: 0.2,
                group: captionID, texts: [sentence1, sentence2], label: gold_label, id: pairID}

`Declarations` (the user's `modules` and `tasks`) is what every settings model starts from: they are
read first, into a registry of their own (minbert.core.registry), in which the rest of the model is
checked, and which the model then carries (`registry`). Everything that can be known of a declared
task when the params are read is checked then: its name is none the pipeline's own files or keys use,
its range is one float32 can hold, its metric fits its kind, its files resolve. A task's presentation
(`title`, `short`) is in no job's settings but the export's and the report's: changing it re-trains
nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import AfterValidator, Field, ValidationError, model_serializer, model_validator

from minbert.core.extensions import is_path
from minbert.core.nli_data import NLI_DATA
from minbert.core.registry import Registry, RegistryProblem
from minbert.core.tasks import BUILTIN_TASKS, KINDS, Task
from minbert.params.fields import NAME_MAX, NAME_RE, Strict, refuse
from minbert.params.heads import DECLARED_HEAD, DECLARED_LOSS, HeadsParams

FLOAT32_MAX = float(np.finfo(np.float32).max)    # labels, targets and outputs are float32
FileFormat = Literal["csv", "tsv", "jsonl", "cs224n"]


class TaskFilesParams(Strict):
    """Where a task's rows are and which columns (or JSON keys) hold what."""
    format: FileFormat = Field("csv", description="`csv` (comma-separated, a header row), `tsv` (tab-separated, a "
                                                  "header row), `jsonl` (one JSON object per line) or `cs224n` (the "
                                                  "course's layout in `data.dir`, named by `prefix`)")
    train: str | None = Field(None, description="the training file (a path from the project's folder)")
    dev: str | None = Field(None, description="the dev file; none: `dev_fraction` of the training rows")
    test: str | None = Field(None, description="a test file, predicted but not scored (a label column is not read); "
                                               "none: the task's test split is empty")
    prefix: str | None = Field(None, description="`cs224n` only: the files are `<prefix>-{train,dev,test-student}.csv` "
                                                 "in `data.dir`")
    texts: list[str] = Field(min_length=1, max_length=2, description="the text column (one text) or the two "
                                                                     "columns of a pair, in order")
    label: str = Field(description="the label column: a class name or its number (0, 1, ...), or a number in the "
                                   "range")
    id: str | None = Field(None, description="a column of unique row ids; none: the row's line number")
    group: str | None = Field(None, description="with `dev_fraction`: a column whose groups stay on one side of the "
                                                "split (SNLI's captionID: every hypothesis of one premise)")
    dev_fraction: float | None = Field(None, gt=0, lt=1, description="without a dev file: this share of the "
                                                                     "training rows (seeded by `data.seed`) is the dev "
                                                                     "split")

    @model_validator(mode="after")
    def _where(self):
        if self.format == "cs224n":
            if not self.prefix or self.train or self.dev or self.test:
                raise ValueError("format cs224n reads <prefix>-{train,dev,test-student}.csv in data.dir: give "
                                 "'prefix' and no file names")
            return self
        if self.prefix:
            raise ValueError(f"'prefix' is for format cs224n; a {self.format} task names its files")
        if not self.train:
            raise ValueError("give the 'train' file")
        if (self.dev is None) == (self.dev_fraction is None):
            raise ValueError("give either a 'dev' file or 'dev_fraction' (a share of the training rows held out)")
        if self.group and self.dev_fraction is None:
            raise ValueError("'group' keeps groups apart in a dev split made with 'dev_fraction'; give it, or drop "
                             "'group'")
        for split in ("train", "dev", "test"):
            problem = _unresolvable(getattr(self, split))
            if problem:
                raise refuse(split, problem)
        return self


def _unresolvable(path: str | None) -> str | None:
    """Why a task's file can never be read (a symlink loop, a folder), or None; a file not there
    yet is prepare's to report."""
    if path is None:
        return None
    try:
        Path(path).resolve()
    except (RuntimeError, OSError) as e:
        reason = "a symlink loop" if isinstance(e, RuntimeError) else type(e).__name__
        return f"{path} cannot be resolved ({reason}); point it at the file itself"
    return f"{path} is a folder; name the file" if os.path.isdir(path) else None


class TaskParams(Strict):
    """One task of the user's (docs/extending.md): a task to train, predict, evaluate and report like
    the built-in ones."""
    title: str = Field("", description="its name for people (\"inference (SNLI)\"); empty: the task's key. Shown by "
                                       "the report and the export; changing it re-trains nothing")
    short: str = Field("", description="in table headers (\"SNLI\"); empty: the key in capitals")
    classes: list[str] | None = Field(None, description="its classes' names, in label order (two: a binary task "
                                                        "with one logit; more: a softmax)")
    range: tuple[float, float] | None = Field(None, description="instead of classes: a regression task's label range "
                                                                "`[lo, hi]` (float32 numbers, lo below hi)")
    metric: Literal["acc", "pearson"] | None = Field(None, description="`acc` for classes, `pearson` for a range; "
                                                                       "none: the one its kind has")
    head: str | None = Field(None, description=f"its default head (docs/finetuning.md); none: {DECLARED_HEAD}")
    loss: str | None = Field(None, description=f"its default loss by name; none: {DECLARED_LOSS}")
    files: TaskFilesParams = Field(description="its files and columns")
    PRESENTATION: ClassVar[tuple[str, ...]] = ("title", "short")    # what only people read

    @model_validator(mode="after")
    def _labels(self):
        if (self.classes is None) == (self.range is None):
            raise ValueError("give either 'classes' (their names) or 'range' ([lo, hi] of a regression label)")
        if self.classes is not None and (len(self.classes) < 2 or len(set(self.classes)) != len(self.classes)):
            raise ValueError("'classes' names two or more classes, each once")
        if self.range is not None:
            lo, hi = self.range
            if max(abs(lo), abs(hi), hi - lo) > FLOAT32_MAX:
                raise refuse("range", f"{list(self.range)} is beyond what a float32 label holds (about 3.4e38 "
                                      f"across); give the labels' real range")
            if not np.float32(lo) < np.float32(hi):
                raise refuse("range", f"{list(self.range)}: the low end must be below the high end (as float32)")
        if self.metric == "pearson" and self.classes is not None:
            raise refuse("metric", "pearson is for a regression task ('range'); a classification task's is acc")
        if self.metric == "acc" and self.range is not None:
            raise refuse("metric", "acc is for a task with classes; a regression task's ('range') is pearson")
        return self

    def declaration(self, presentation: bool = True) -> dict:
        """The task as a job's settings carry it; without its `presentation` (title, short) for a job
        that shows it to nobody."""
        out = self.model_dump(exclude_none=True)
        return out if presentation else {k: v for k, v in out.items() if k not in self.PRESENTATION}

    def task(self, name: str) -> Task:
        return Task.declared(name, self.declaration())

    @property
    def kind(self) -> str:
        return KINDS[2] if self.range else KINDS[1] if len(self.classes) == 2 else KINDS[0]


def reserved_task_names() -> dict[str, str]:
    """Names no declared task may take, each with what uses it: the built-in tasks, the NLI
    pretraining's prepared files (results/data/nli-*.tsv), and the heads settings' keys (a task's head
    is `heads.<task>`)."""
    out = {name: "a built-in task" for name in BUILTIN_TASKS}
    out[NLI_DATA.name] = NLI_DATA.what
    out.update({key: f"a key of the heads settings (heads.{key})" for key in HeadsParams.model_fields})
    return out


def _task_key(name: str) -> str:
    if not NAME_RE.match(name) or len(name) > NAME_MAX or "-" in name or "." in name:
        raise ValueError(f"task name {name!r} must be letters, digits and '_' (it names files and metrics)")
    reserved = {taken.casefold(): (taken, what) for taken, what in reserved_task_names().items()}
    if name.casefold() in reserved:          # compared without case: on a case-insensitive disk NLI's files are nli's
        taken, what = reserved[name.casefold()]
        same = "" if taken == name else f" (as '{taken}': names are compared without case, as the files they name)"
        advice = "; declare yours under another name"
        raise ValueError(f"'{name}' is a built-in task{same}{advice}" if taken in BUILTIN_TASKS else
                         f"'{name}' is taken: it is {what}{same}{advice}")
    return name


def _task_names(tasks: dict) -> dict:
    seen: dict[str, str] = {}
    for name in tasks:
        _task_key(name)
        if seen.setdefault(name.casefold(), name) != name:
            raise ValueError(f"'{name}' and '{seen[name.casefold()]}' differ only in case: their files would be one "
                             f"file on a case-insensitive disk; name them otherwise")
    return tasks


def _normal_modules(modules: list[str]) -> list[str]:
    """Each module as one spelling: a path without `./`, doubled or trailing separators or `..` steps
    (`./ext/heads.py` is `ext/heads.py`, the same file, so the same job), each named once."""
    out = [Path(os.path.normpath(m)).as_posix() if is_path(m) and m else m for m in modules]
    return list(dict.fromkeys(out))


Modules = Annotated[list[str], AfterValidator(_normal_modules)]
DeclaredTasks = Annotated[dict[str, TaskParams], AfterValidator(_task_names)]


class Declarations(Strict):
    """What a settings model starts from: the user's `modules` (imported: their losses and heads
    become choosable by name) and `tasks`, read first into a registry of their own, in which the
    rest of the model is checked (every task, head and loss it names is looked up there) and which
    the model carries (`registry`). Empty, they are left out of a model's dump, so a job that uses
    none has the description it had before they existed."""
    modules: Modules = Field([], description="modules of your own, each a path in the project (`ext/heads.py`) or an "
                                             "importable name, whose losses and heads the params then name "
                                             "(docs/extending.md)")
    tasks: DeclaredTasks = Field({}, description="tasks of your own, by name (docs/extending.md)")

    @model_validator(mode="wrap")
    @classmethod
    def _registry_first(cls, data, handler):
        if not isinstance(data, dict):
            return handler(data)
        try:
            modules, tasks = _declared(data)
        except ValidationError:
            return handler(data)       # the model reports the declaration at fault, at its key
        with registry_of(modules, tasks).active():
            return handler(data)

    @property
    def registry(self) -> Registry:
        """The built-in tasks, losses and heads with this model's declarations."""
        return registry_of(self.modules, self.tasks)

    @model_serializer(mode="wrap")
    def _without_empty(self, handler):
        out = handler(self)
        for key in ("modules", "tasks"):
            if isinstance(out, dict) and not out.get(key):
                out.pop(key, None)
        return out


class _Declared(Strict):
    modules: Modules = []
    tasks: DeclaredTasks = {}


def _declared(data: dict) -> tuple[list[str], dict[str, TaskParams]]:
    declared = _Declared.model_validate({k: data[k] for k in ("modules", "tasks") if k in data})
    return declared.modules, declared.tasks


def registry_of(modules: list[str], tasks: dict[str, TaskParams]) -> Registry:
    """The registry of these declarations (minbert.core.registry.Registry.of); a problem with one is
    a validation error at its key."""
    declared = {name: t.declaration() if isinstance(t, TaskParams) else t for name, t in tasks.items()}
    try:
        registry = Registry.of(modules, declared)
    except RegistryProblem as e:
        raise refuse(e.key, str(e)) from None
    for head in registry.heads.values():
        unknown = [s for s in head.settings if s not in HeadsParams.model_fields]
        if unknown:
            raise refuse("modules", f"{head.where}: `settings` names '{unknown[0]}', which is no heads setting "
                                    f"({', '.join(HeadsParams.model_fields)}) (docs/extending.md)")
    return registry
