"""What a data folder is, as far as a model card must say it: the demo data carries a README whose
first line marks it (minbert.data.demo writes it), so a model trained on it is never described as
trained on SST-5, Quora or STS."""
from __future__ import annotations

from pathlib import Path

DEMO_MARKER = "README.md"
DEMO_TITLE = "# The minBERT demo data (synthetic)"


def is_demo_data(folder: str | Path) -> bool:
    """Whether `folder` holds the generated demo data (its README's first line says so)."""
    try:
        with open(Path(folder) / DEMO_MARKER, encoding="utf-8") as f:
            return f.readline().rstrip("\n") == DEMO_TITLE
    except (OSError, UnicodeDecodeError):
        return False
