"""A task of the user's, declared in params.yaml's `tasks:` section the way the built-in tasks are
declared (minbert/core/tasks.yaml): one text or a pair, classes or a label range, its files and
their columns, its metric, its default head and loss (docs/extending.md).

    tasks:
      snli:
        title: inference (SNLI)
        classes: [entailment, neutral, contradiction]
        files: {format: jsonl, train: ../shared/data/nli/snli-sample.jsonl, dev_fraction: 0.2,
                group: captionID, texts: [sentence1, sentence2], label: gold_label, id: pairID}

`declare_tasks` puts them into the task registry (minbert.core.tasks.declare), where every later
check and every stage looks them up: a params file's tasks when it is read, a job's when its
settings are (each job's settings carry the declarations of the tasks it works on).
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from minbert.core.errors import MinBertError
from minbert.core.extensions import use_module
from minbert.core.tasks import BUILTIN_TASKS, KINDS, Task, declare
from minbert.params.fields import NAME_MAX, NAME_RE, Strict

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
        return self


class TaskParams(Strict):
    """One task of the user's (docs/extending.md): a task to train, predict, evaluate and report like
    the built-in ones."""
    title: str = Field("", description="its name for people (\"inference (SNLI)\"); empty: the task's key")
    short: str = Field("", description="in table headers (\"SNLI\"); empty: the key in capitals")
    classes: list[str] | None = Field(None, description="its classes' names, in label order (two: a binary task "
                                                        "with one logit; more: a softmax)")
    range: tuple[float, float] | None = Field(None, description="instead of classes: a regression task's label range "
                                                                "`[lo, hi]`")
    metric: Literal["acc", "pearson"] | None = Field(None, description="`acc` or `pearson`; none: accuracy for "
                                                                       "classes, Pearson r for a range")
    head: str | None = Field(None, description="its default head (docs/finetuning.md); none: `classifier` for one "
                                               "text, `cross` for a pair")
    loss: str | None = Field(None, description="its default loss by name; none: cross_entropy, bce or mse by its "
                                               "kind")
    files: TaskFilesParams = Field(description="its files and columns")

    @model_validator(mode="after")
    def _labels(self):
        if (self.classes is None) == (self.range is None):
            raise ValueError("give either 'classes' (their names) or 'range' ([lo, hi] of a regression label)")
        if self.classes is not None and (len(self.classes) < 2 or len(set(self.classes)) != len(self.classes)):
            raise ValueError("'classes' names two or more classes, each once")
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"'range' {list(self.range)}: the low end must be below the high end")
        if self.metric == "pearson" and self.classes is not None:
            raise ValueError("metric pearson is for a regression task ('range'); a classification task's is acc")
        return self

    def task(self, name: str) -> Task:
        return Task.declared(name, self.model_dump(exclude_none=True))

    @property
    def kind(self) -> str:
        return KINDS[2] if self.range else KINDS[1] if len(self.classes) == 2 else KINDS[0]


def _task_key(name: str) -> str:
    if name in BUILTIN_TASKS:
        raise ValueError(f"'{name}' is a built-in task; declare yours under another name")
    if not NAME_RE.match(name) or len(name) > NAME_MAX or "-" in name or "." in name:
        raise ValueError(f"task name {name!r} must be letters, digits and '_' (it names files and metrics)")
    return name


def declare_tasks(tasks: dict[str, TaskParams], *, only: bool = False) -> dict[str, TaskParams]:
    """Put the tasks into the registry (`only`: as the only declared ones) and return them."""
    for name in tasks:
        _task_key(name)
    declare({name: t.task(name) for name, t in tasks.items()}, only=only)
    return tasks


class Declarations(Strict):
    """What enters the registries before the rest of a model is checked: the user's `modules`
    (imported: their losses and heads become choosable by name) and `tasks` (declared). The params
    file as a whole declares its own (`_only_declared`: they replace any declared before); each
    job's settings carry those the job works with. Empty, they are left out of a model's dump, so a
    job that uses none has the description it had before they existed."""
    modules: list[str] = Field([], validate_default=True, description="modules of your own, each a path in the "
                                                                      "project (`ext/heads.py`) or an importable "
                                                                      "name, whose losses and heads the params then "
                                                                      "name (docs/extending.md)")
    tasks: dict[str, TaskParams] = Field({}, validate_default=True, description="tasks of your own, by name "
                                                                                 "(docs/extending.md)")
    _only_declared: ClassVar[bool] = False

    @field_validator("modules")
    @classmethod
    def _import(cls, modules):
        for module in modules:
            try:
                use_module(module)
            except MinBertError as e:       # the model's own error names the key
                raise ValueError(str(e).split("key 'modules': ", 1)[-1]) from None
        return modules

    @field_validator("tasks")
    @classmethod
    def _declare(cls, tasks):
        return declare_tasks(tasks, only=cls._only_declared)

    @model_serializer(mode="wrap")
    def _without_empty(self, handler):
        out = handler(self)
        for key in ("modules", "tasks"):
            if isinstance(out, dict) and not out.get(key):
                out.pop(key, None)
        return out
