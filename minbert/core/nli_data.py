"""The NLI pretraining's data: one source of its own beside the tasks, never a task.

The prepare stage reads the SNLI/MNLI jsonl `data.nli_file` (minbert.data.raw.read_nli) and writes
it, split by premise group, as results/data/nli-{train,dev}.tsv; the NLI pretraining trains on it
(minbert.train.nli) and a masked-LM pretraining may read its texts (`mlm.tasks: [..., nli]`). Every
fact about that data is here, once, and every module refers to `NLI_DATA`: its name (the prepared
files' stem, what `mlm.tasks` calls it, a name no declared task may take), its splits, its columns
and its labels. It is no task of the registry: it has no head, no metric and no test split.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NliData:
    name: str = "nli"                                                # results/data/<name>-<split>.tsv
    splits: tuple[str, ...] = ("train", "dev")                       # held out by premise group: data.nli_dev_fraction
    columns: tuple[str, ...] = ("id", "group", "sentence1", "sentence2", "label")
    labels: tuple[str, ...] = ("entailment", "neutral", "contradiction")   # the gold labels it keeps ("-" is dropped)

    def names(self, source: str) -> bool:
        """Whether `source` (a prepared source, an `mlm.tasks` entry) is this data, not a task."""
        return source == self.name

    def file(self, split: str) -> str:
        """Its prepared file of `split`, by name (in results/data)."""
        return f"{self.name}-{split}.tsv"

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.file(s) for s in self.splits)

    def label(self, value) -> str | None:
        """A prepared label read back: the label, or None when it is none of `labels`."""
        return value if value in self.labels else None

    @property
    def what(self) -> str:
        """What the name stands for, in words (why no task may take it)."""
        return f"the NLI pretraining's prepared data ({', '.join(self.files)})"


NLI_DATA = NliData()
