"""The task registry: everything the pipeline knows about a task, defined once.

| task   | data (CS224N files)            | input         | output                  | metric    |
|--------|--------------------------------|---------------|-------------------------|-----------|
| sst    | ids-sst-*.csv: sentence, 0-4   | one sentence  | 5 logits (softmax)      | accuracy  |
| para   | quora-*.csv: two questions, 0/1| sentence pair | 1 logit (sigmoid)       | accuracy  |
| sts    | sts-*.csv: two sentences, 0-5  | sentence pair | a score, 0-5            | Pearson r |
| cfimdb | ids-cfimdb-*.csv: review, 0/1  | one text      | 1 logit (sigmoid)       | accuracy  |

The readers, the heads, the losses, the predictions files, the metrics, the ensembles and the
report all look tasks up here. The course leaderboard's overall score uses sst, para and sts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Task:
    name: str                   # as in params.yaml, results/data/<name>-<split>.tsv, predictions
    title: str                  # for people: "sentiment (SST-5)"
    short: str                  # in table headers: "SST"
    file_prefix: str            # raw CS224N files: <prefix>-{train,dev,test-student}.csv
    raw_text_columns: tuple     # raw text columns; renamed to `text_columns`
    raw_label_column: str       # raw label column (absent in the test-student files)
    kind: str                   # classification (softmax) | binary (one logit) | regression (a score)
    classes: tuple = ()         # class names of classification / binary tasks
    label_range: tuple = ()     # (lo, hi) of a regression task's labels
    metric: str = "acc"         # acc | pearson

    @property
    def pair(self) -> bool:
        """A sentence-pair task (its input views: see minbert.data.views)."""
        return len(self.raw_text_columns) == 2

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


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("sst", "sentiment (SST-5)", "SST", "ids-sst", ("sentence",), "sentiment", "classification",
         classes=("very negative", "negative", "neutral", "positive", "very positive")),
    Task("para", "paraphrase (Quora)", "Para", "quora", ("sentence1", "sentence2"), "is_duplicate", "binary",
         classes=("not paraphrase", "paraphrase")),
    Task("sts", "similarity (STS)", "STS", "sts", ("sentence1", "sentence2"), "similarity", "regression",
         label_range=(0.0, 5.0), metric="pearson"),
    Task("cfimdb", "binary sentiment (CFIMDB)", "CFIMDB", "ids-cfimdb", ("sentence",), "sentiment", "binary",
         classes=("negative", "positive")),
)}
TASK_NAMES = tuple(TASKS)
TaskName = Literal[TASK_NAMES]              # for pydantic: one of the names above
LEADERBOARD_TASKS = ("sst", "para", "sts")       # the course's overall score
DEFAULT_TASKS = LEADERBOARD_TASKS                # what an experiment trains unless it says otherwise
PAIR_TASKS = tuple(n for n, t in TASKS.items() if t.pair)


def task(name: str) -> Task:
    return TASKS[name]
