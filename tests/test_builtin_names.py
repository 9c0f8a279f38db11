"""The built-in losses and heads are named once, by their files (minbert/model/losses/,
minbert/model/heads/, read by the registry): the help texts are built from the registry, and each
list of them that people wrote by hand (a table, a sentence) names every one, and no other. A new
built-in file that a list misses fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from minbert.core.registry import builtin
from minbert.params.heads import HeadsParams, builtin_heads
from minbert.params.tasks import TaskParams

REPO = Path(__file__).resolve().parents[1]
LOSSES = set(builtin().losses)
PAIR_HEADS = set(builtin_heads("cross", "bi"))


def _block(path: str, start: str, paragraphs: int = 1) -> str:
    """The text of `path` from the line holding `start` on, `paragraphs` paragraphs (a table is one)."""
    text = (REPO / path).read_text(encoding="utf-8")
    rest = text[text.rindex("\n", 0, text.index(start)) + 1:]
    return "\n\n".join(re.split(r"\n\s*\n", rest)[:paragraphs])


def _names(text: str, universe: set[str]) -> set[str]:
    """The names of `universe` a text names: in backticks, or as a table's first cell."""
    quoted = set(re.findall(r"`([A-Za-z0-9_.+-]+)`", text))
    cells = set(re.findall(r"^\s*\|\s*`?([A-Za-z0-9_.+-]+)`?\s*\|", text, re.M))
    return (quoted | cells) & universe


# every hand-written list of built-in names: where it starts, its paragraphs, and what it must name
HAND_LISTS = [
    ("minbert/core/losses.py", "| name ", 1, LOSSES),
    ("docs/finetuning.md", "Pair head kinds", 2, PAIR_HEADS),
    ("docs/finetuning.md", "Each task's loss is an object chosen by name", 1, LOSSES),
    ("docs/extending.md", "A task's loss is a small object chosen by name", 1, LOSSES),
]


@pytest.mark.parametrize("path, start, paragraphs, names", HAND_LISTS, ids=[f"{p}: {s}" for p, s, _, _ in HAND_LISTS])
def test_each_hand_written_list_names_every_builtin(path, start, paragraphs, names):
    assert _names(_block(path, start, paragraphs), names) == names


def test_the_help_texts_name_the_builtins_from_the_registry():
    losses = HeadsParams.model_fields["losses"].description
    assert all(name in losses for name in LOSSES)
    task_key = HeadsParams.extra_key[2]
    assert all(f"`{name}`" in task_key for name in builtin_heads("single", "cross"))
    assert "cross_entropy" in TaskParams.model_fields["loss"].description


def test_a_list_that_misses_a_builtin_fails():
    """The check itself: a new built-in loss that the lists do not name is caught."""
    more = LOSSES | {"huber"}
    for path, start, paragraphs, names in HAND_LISTS:
        if names is LOSSES:
            assert _names(_block(path, start, paragraphs), more) != more
