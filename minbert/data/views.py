"""How the encoder reads a task's examples: its input view, defined once.

| view   | for                                        | encoder rows per example          | head gets |
|--------|--------------------------------------------|-----------------------------------|-----------|
| single | one-sentence tasks (sst, cfimdb)           | `[CLS] s [SEP]`                   | (emb,)    |
| cross  | a pair task with a `cross` head            | `[CLS] a [SEP] b [SEP]`           | (emb,)    |
| bi     | a pair task with a bi-encoder head         | a, then b (a batch stacks 2B rows)| (u, v)    |
| hybrid | a bi-encoder pair task listed in `hybrid`  | a, b, then a-b cross-encoded (3B) | (u, v, c) |

A batch stacks its rows part by part (every a, then every b, ...), so one encoder pass embeds them
all and `split` cuts the embeddings back into the head's arguments. A pair read in the other order
(`heads.symmetric_pairs`) swaps a and b and reads the cross-encoded pair as `[CLS] b [SEP] a [SEP]`.
Tokenisation (`encode`), batching (`rows`, `lengths`) and the heads (`split`) all go through here.
"""
from __future__ import annotations

from dataclasses import dataclass

from minbert.core.registry import Registry, active

Encoded = list[tuple[list[int], list[int]]]   # (input_ids, token_type_ids) per example
SWAPPED = {"a": "b", "b": "a", "ab": "ba", "ba": "ab"}   # the parts of a pair read as (b, a)


@dataclass(frozen=True)
class View:
    name: str
    parts: tuple          # encodings stacked in a batch, in order: text | ab | a, b | a, b, ab

    def encodings(self, symmetric: bool) -> tuple:
        """Every encoding this view needs, the swapped cross-encoding included when symmetric."""
        extra = ("ba",) if symmetric and "ab" in self.parts else ()
        return self.parts + extra

    def rows(self, enc: dict[str, Encoded], indices, swap=None) -> Encoded:
        """The encoder inputs of `indices`, part after part; `swap[k]` reads pair k as (b, a)."""
        swap = swap or [False] * len(indices)
        return [enc[SWAPPED[p] if s and p in SWAPPED else p][i]
                for p in self.parts for i, s in zip(indices, swap)]

    def lengths(self, enc: dict[str, Encoded]) -> list[int]:
        """Per example, its longest row (what batching by length should sort on)."""
        return [max(lens) for lens in zip(*([len(ids) for ids, _ in enc[p]] for p in self.parts))]

    def split(self, emb):
        """(len(parts) * B, H) stacked embeddings -> the head's arguments."""
        return emb.chunk(len(self.parts), 0)


VIEWS = {v.name: v for v in (View("single", ("text",)), View("cross", ("ab",)), View("bi", ("a", "b")),
                             View("hybrid", ("a", "b", "ab")))}


def view_of(task: str, heads, registry: Registry | None = None) -> View:
    """The view of `task` under the heads settings (minbert.params.HeadsParams): the one its head's
    declaration reads (minbert.core.registry; default: the registry in use), a bi-encoder head's
    with the cross-encoded pair too when the task is `hybrid`."""
    registry = registry or active()
    if not registry.tasks[task].pair:
        return VIEWS["single"]
    view = registry.heads[heads.head_of(task, registry.tasks)].view
    return VIEWS["hybrid" if view == "bi" and task in heads.hybrid else view]


def encode(tokenizer, frame, view: View, symmetric: bool, cache_dir=None) -> dict[str, Encoded]:
    """Tokenise a task's frame into the encodings `view` needs (cached by content)."""
    from minbert.data.encode import encode_cached

    columns = {"text": ("sentence", None), "a": ("sentence1", None), "b": ("sentence2", None),
               "ab": ("sentence1", "sentence2"), "ba": ("sentence2", "sentence1")}
    out = {}
    for part in view.encodings(symmetric):
        first, second = columns[part]
        out[part] = encode_cached(tokenizer, frame[first].tolist(),
                                  None if second is None else frame[second].tolist(), cache_dir=cache_dir)
    return out
