"""The task registry: everything the pipeline knows about a task, declared once, as data.

| task   | data (CS224N files)            | input         | output                  | metric    |
|--------|--------------------------------|---------------|-------------------------|-----------|
| sst    | ids-sst-*.csv: sentence, 0-4   | one sentence  | 5 logits (softmax)      | accuracy  |
| para   | quora-*.csv: two questions, 0/1| sentence pair | 1 logit (sigmoid)       | accuracy  |
| sts    | sts-*.csv: two sentences, 0-5  | sentence pair | a score, 0-5            | Pearson r |
| cfimdb | ids-cfimdb-*.csv: review, 0/1  | one text      | 1 logit (sigmoid)       | accuracy  |

The built-in tasks are declared in tasks.yaml beside this module, with the keys a params file
declares its own tasks with (its `tasks:` section, minbert.params.tasks; docs/extending.md): one
text or a pair, classes (with their names) or a label range, the files and their columns, the
metric, the default head and loss. A params file's own tasks join them in its registry
(minbert.core.registry: a value each loaded params file, job or checkpoint carries); `TASKS` is the
tasks of the registry in use (`ACTIVE`, which the code working from one set of settings makes
active: a stage, the planner, a loaded model), the built-in ones where none is. The readers, heads,
predictions files, metrics, ensembles and the report look every task up there. The course
leaderboard's overall score uses sst, para and sts.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

CODE_DATA = ("tasks.yaml",)             # the built-in tasks' declarations are part of this module's code
KINDS = ("classification", "binary", "regression")
METRICS = ("acc", "pearson")
FORMATS = ("cs224n", "csv", "tsv", "jsonl")
# a task's default head and loss by its shape and kind (a declaration or params may name others)
DEFAULT_HEAD = {False: "classifier", True: "cross"}             # one text / a pair
DEFAULT_LOSS = {"classification": "cross_entropy", "binary": "bce", "regression": "mse"}


@dataclass(frozen=True)
class Task:
    name: str                   # as in params.yaml, results/data/<name>-<split>.tsv, predictions
    title: str                  # for people: "sentiment (SST-5)"
    short: str                  # in table headers: "SST"
    file_prefix: str            # CS224N files: <prefix>-{train,dev,test-student}.csv ("" for other formats)
    raw_text_columns: tuple     # the text columns of the raw files; renamed to `text_columns`
    raw_label_column: str       # the raw label column (absent in the test files)
    kind: str                   # classification (softmax) | binary (one logit) | regression (a score)
    classes: tuple = ()         # class names of classification / binary tasks
    label_range: tuple = ()     # (lo, hi) of a regression task's labels
    metric: str = "acc"         # acc | pearson
    format: str = "cs224n"      # how its raw files are read: cs224n | csv | tsv | jsonl
    files: dict = field(default_factory=dict, hash=False)   # split -> file (formats other than cs224n)
    id_column: str | None = "id"    # the raw id column; None: the row's line number
    group_column: str | None = None  # a dev split held out of train keeps each group on one side
    dev_fraction: float | None = None  # no dev file: this share of the training rows is held out as dev
    head: str = ""              # its default head (params may choose another per experiment)
    loss: str = ""              # its default loss
    builtin: bool = False       # declared in tasks.yaml (not by a params file)
    declaration: dict = field(default_factory=dict, hash=False, compare=False, repr=False)   # as declared

    @classmethod
    def declared(cls, name: str, decl: dict, builtin: bool = False) -> Task:
        """A task from its declaration: the keys of tasks.yaml and of a params file's `tasks:`
        section (title, short, classes or range, metric, head, loss, files)."""
        files = dict(decl["files"])
        texts, classes, span = tuple(files["texts"]), tuple(decl.get("classes") or ()), decl.get("range")
        kind = "regression" if span else "binary" if len(classes) == 2 else "classification"
        return cls(name=name, title=decl.get("title") or name, short=decl.get("short") or name.upper(),
                   file_prefix=files.get("prefix") or "", raw_text_columns=texts, raw_label_column=files["label"],
                   kind=kind, classes=classes, label_range=tuple(float(x) for x in span) if span else (),
                   metric=decl.get("metric") or ("pearson" if span else "acc"),
                   format=files.get("format") or "cs224n",
                   files={s: files[s] for s in ("train", "dev", "test") if files.get(s)},
                   id_column=files.get("id", "id" if files.get("format", "cs224n") == "cs224n" else None),
                   group_column=files.get("group"), dev_fraction=files.get("dev_fraction"),
                   head=decl.get("head") or DEFAULT_HEAD[len(texts) == 2], loss=decl.get("loss") or DEFAULT_LOSS[kind],
                   builtin=builtin, declaration=decl)

    @property
    def pair(self) -> bool:
        """A sentence-pair task (its input views: see minbert.data.views)."""
        return len(self.raw_text_columns) == 2

    @property
    def splits(self) -> tuple:
        """Its prepared splits: train, dev and test; a declared task without a test file has none."""
        return ("train", "dev") if self.format != "cs224n" and "test" not in self.files else ("train", "dev", "test")

    @property
    def text_columns(self) -> tuple:
        return ("sentence1", "sentence2") if self.pair else ("sentence",)

    @property
    def labels(self) -> tuple:
        """The integer labels of a classification or binary task."""
        return tuple(range(len(self.classes)))

    @property
    def metric_key(self) -> str:
        """The key in metrics.json, e.g. sst_acc, sts_pearson."""
        return f"{self.name}_{self.metric}"

    @property
    def outputs(self) -> int:
        """Width of the head's output: one logit per class, or one number."""
        return len(self.classes) if self.kind == "classification" else 1

    @property
    def prob_columns(self) -> list[str]:
        """Probability columns of the predictions file."""
        if self.kind == "classification":
            return [f"prob_{k}" for k in self.labels]
        return ["prob_1"] if self.kind == "binary" else []

    @property
    def label_dtype(self):
        return np.float32 if self.kind == "regression" else np.int64

    @property
    def metric_header(self) -> str:
        """A table header for the metric: "SST acc", "STS r"."""
        return f"{self.short} {'r' if self.metric == 'pearson' else 'acc'}"

    @property
    def metric_title(self) -> str:
        return f"{self.title} {'Pearson correlation' if self.metric == 'pearson' else 'accuracy'}"

    def score(self, metric_value: float) -> float:
        """The metric on a 0-1 scale where higher is better: accuracy, or (r + 1) / 2."""
        return (metric_value + 1.0) / 2.0 if self.metric == "pearson" else metric_value


def _builtins() -> dict[str, Task]:
    declared = yaml.safe_load((Path(__file__).with_name("tasks.yaml")).read_text(encoding="utf-8"))
    return {name: Task.declared(name, decl, builtin=True) for name, decl in declared.items()}


BUILTIN_TASKS: dict[str, Task] = _builtins()
TASK_NAMES = tuple(BUILTIN_TASKS)                # the built-in tasks
LEADERBOARD_TASKS = ("sst", "para", "sts")       # the course's overall score
DEFAULT_TASKS = LEADERBOARD_TASKS                # what an experiment trains unless it says otherwise
PAIR_TASKS = tuple(n for n, t in BUILTIN_TASKS.items() if t.pair)   # the built-in pair tasks
# the registry in use (a minbert.core.registry.Registry; None: the built-in things alone): set only
# by `Registry.active()`, around the work of one set of settings, never by reading them
ACTIVE: ContextVar = ContextVar("minbert_registry", default=None)


class TaskNotInRegistry(KeyError):
    """A task looked up in the registry in use (`TASKS`) that it does not hold: one line naming the
    task and why (a task a params file declares is known inside that file's registry alone)."""

    def __str__(self) -> str:
        return str(self.args[0])


def not_in_registry(name: str, tasks: Mapping[str, Task], active: bool) -> TaskNotInRegistry:
    """The error for `name` looked up in `tasks`, the tasks of the registry in use (`active`: one is
    set; else the built-in tasks alone)."""
    where = ("the task registry in use" if active else
             "the built-in tasks (no task registry is in use: none was passed or made active)")
    return TaskNotInRegistry(
        f"task '{name}' is not in {where}, whose tasks are {', '.join(tasks)}: a task a params file declares "
        f"(`tasks:`) is known in that file's registry alone; pass it (`lp.registry.tasks[...]`, a job's or "
        f"model's `.registry`) or run inside `with lp.registry.active():`")


class ActiveTasks(Mapping):
    """The tasks of the registry in use, by name (the built-in ones first, then the declared ones in
    their order); a name it does not hold is `TaskNotInRegistry`, saying why."""

    @staticmethod
    def _tasks() -> Mapping[str, Task]:
        registry = ACTIVE.get()
        return BUILTIN_TASKS if registry is None else registry.tasks

    def __getitem__(self, name: str) -> Task:
        tasks = self._tasks()
        try:
            return tasks[name]
        except KeyError:
            raise not_in_registry(name, tasks, ACTIVE.get() is not None) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks())

    def __len__(self) -> int:
        return len(self._tasks())

    def __contains__(self, name) -> bool:
        return name in self._tasks()


TASKS: Mapping[str, Task] = ActiveTasks()


def declarations(tasks, known: Mapping[str, Task] | None = None) -> dict[str, dict]:
    """The declarations of the tasks among `tasks` that are not built in (what a job's settings
    carry, so that the job knows them and a change to one re-runs it); `known`: the tasks of the
    registry they are declared in (default: the one in use)."""
    known = TASKS if known is None else known
    return {t: known[t].declaration for t in dict.fromkeys(tasks) if t in known and not known[t].builtin}


def task(name: str) -> Task:
    return TASKS[name]
