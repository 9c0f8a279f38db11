"""The user's own modules (params.yaml's `modules:`, docs/extending.md) and the heads they add.

A module is named by a path in the project (`extensions/heads.py`) or an importable name
(`my_package.losses`). Importing it runs its registrations: losses (minbert.core.losses's
`@register_loss`) and heads (`@register_head` below), which the params then choose by name. A
module is part of the code of every job whose settings name it (minbert.pipeline.code), so an
edit to it re-runs those jobs and no others.

A head of your own is an `nn.Module` class with a `name`, the `view` it reads (`single`: one
sentence's vector; `cross`: a cross-encoded pair's; `bi`: the two sentences' vectors u, v) and a
constructor `(in_dim, outputs, hidden_layers, dropout)`; `forward(emb)` (single, cross) or
`forward(u, v)` (bi) returns (B, outputs) logits, or (B,) for one output.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from minbert.core.errors import MinBertError

HEADS: dict[str, type] = {}             # the user's heads by name (the built-in ones: minbert.model.heads)
HEAD_VIEWS = ("single", "cross", "bi")
ADDED: dict[str, set[tuple[str, str]]] = {}   # module -> what importing it registered: (kind, name)
_IMPORTED: dict[str, object] = {}


def register_head(cls: type) -> type:
    """Make a head class choosable by its `name` (a decorator)."""
    if getattr(cls, "view", None) not in HEAD_VIEWS:
        raise TypeError(f"head {cls.__name__}: set `view` to one of {', '.join(HEAD_VIEWS)}")
    HEADS[cls.name] = cls
    return cls


def is_path(module: str) -> bool:
    """A module named by its file (a path in the project) rather than by an importable name."""
    return module.endswith(".py") or "/" in module or "\\" in module


def use_module(module: str, where: str = "params.yaml") -> object:
    """Import the user's module (once per process) and note what it registered; a module that
    cannot be imported is a one-line error naming it."""
    if module in _IMPORTED:
        return _IMPORTED[module]
    from minbert.core.losses import LOSSES

    before = {("loss", n) for n in LOSSES} | {("head", n) for n in HEADS}
    try:
        if is_path(module):
            path = Path(module)
            if not path.is_file():
                raise MinBertError(f"{where}: key 'modules': no file {module}; give a path from the project's "
                                   f"folder or an importable module name")
            name = "minbert_user." + ".".join(path.with_suffix("").parts).replace("-", "_")
            spec = importlib.util.spec_from_file_location(name, path)
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded
            spec.loader.exec_module(loaded)
        else:
            loaded = importlib.import_module(module)
    except MinBertError:
        raise
    except Exception as e:   # the user's code: any failure is reported as that module's, in one line
        sys.modules.pop(f"minbert_user.{module}", None)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MinBertError(f"{where}: key 'modules': module '{module}' cannot be imported ({type(e).__name__}: "
                           f"{reason}); fix it or remove it from modules") from None
    ADDED[module] = ({("loss", n) for n in LOSSES} | {("head", n) for n in HEADS}) - before
    _IMPORTED[module] = loaded
    return loaded


def module_of(kind: str, name: str) -> str | None:
    """The user's module that registered `name` (a loss or a head), or None for a built-in one."""
    return next((m for m, added in ADDED.items() if (kind, name) in added), None)
