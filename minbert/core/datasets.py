"""What a data folder is, as far as a model card must say it: where a task in the course's layout
has its raw files in it (`raw_path`, which the prepare stage reads), and whether it is the demo
data, whose README's first line marks it (minbert.data.demo writes it), so that a model trained on
it is never described as trained on SST-5, Quora or STS."""
from __future__ import annotations

from pathlib import Path

from minbert.core.tasks import TASKS

DEMO_MARKER = "README.md"
DEMO_TITLE = "# The minBERT demo data (synthetic)"


def is_demo_data(folder: str | Path) -> bool:
    """Whether `folder` holds the generated demo data (its README's first line says so)."""
    try:
        with open(Path(folder) / DEMO_MARKER, encoding="utf-8") as f:
            return f.readline().rstrip("\n") == DEMO_TITLE
    except (OSError, UnicodeDecodeError):
        return False


RAW_SPLITS = {"train": "train", "dev": "dev", "test": "test-student"}   # our split -> file suffix


def raw_path(data_dir: str | Path, task: str, split: str) -> Path:
    """Where the raw CS224N file of `task`/`split` lives, e.g. data/demo/ids-sst-test-student.csv."""
    return Path(data_dir) / f"{TASKS[task].file_prefix}-{RAW_SPLITS[split]}.csv"
