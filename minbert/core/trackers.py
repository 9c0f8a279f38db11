"""The experiment trackers a training run can log to (`finetune.tracking`), the module each one
needs and the package that installs it: the params check (at load) and the run (minbert.train.
tracking) say the same one line when it is missing."""
from __future__ import annotations

import importlib.util

# tracker -> (the module it imports, the package pip installs it with)
TRACKERS = {"dvclive": ("dvclive", "dvclive"), "tensorboard": ("tensorboard", "tensorboard"),
            "mlflow": ("mlflow", "mlflow-skinny")}


def missing(tool: str) -> str:
    """What to do when `tool`'s package is not installed."""
    return (f"finetune.tracking lists {tool}, which is not installed: pip install {TRACKERS[tool][1]} (or the "
            f"project's `tracking` extra), or take {tool} out of finetune.tracking")


def installed(tool: str) -> bool:
    """Whether `tool`'s module can be imported here (found, not imported: the check costs nothing)."""
    try:
        return importlib.util.find_spec(TRACKERS[tool][0]) is not None
    except (ImportError, ValueError):        # a module set to None (a test's stand-in for absence), a broken one
        return False
