"""What a module of yours imports to add a loss or a head (docs/extending.md): both registration
entry points side by side, and the loss's base class.

    from minbert.core.register import Loss, register_loss, register_head

`@register_loss` makes a `Loss` subclass choosable by its `name` (its declaration and contract:
minbert.core.losses), `@register_head` an `nn.Module` class (its contract: minbert.core.extensions);
`replace=True` uses yours in place of the built-in one of its name. The built-in losses and heads
(minbert/model/losses/, minbert/model/heads/) are registered here exactly as yours are. Registering
notes the class for the module being imported (minbert.core.extensions.note_registration); the
registry of a params file that names the module takes it (minbert.core.registry).
"""
from __future__ import annotations

from minbert.core.extensions import note_registration
from minbert.core.losses import Loss

__all__ = ["Loss", "register_head", "register_loss"]


def _register(kind: str, cls: type | None, replace: bool):
    if cls is None:
        return lambda c: note_registration(kind, c, replace)
    return note_registration(kind, cls, replace)


def register_loss(cls: type[Loss] | None = None, *, replace: bool = False):
    """Make a loss class choosable by its `name` (a decorator: `@register_loss`, or
    `@register_loss(replace=True)` to use it in place of the built-in loss of that name)."""
    return _register("loss", cls, replace)


def register_head(cls: type | None = None, *, replace: bool = False):
    """Make a head class choosable by its `name` (a decorator: `@register_head`, or
    `@register_head(replace=True)` to use it in place of the built-in head of that name)."""
    return _register("head", cls, replace)
