"""A task's training loss: a small object chosen by name (params: `finetune.heads.losses`, a task's
declared `loss`), whose class says what the checks around it need to know (its declaration:
minbert.core.registry):

| name          | kinds          | batch statistic | calibrated | reads                        |
|---------------|----------------|-----------------|------------|------------------------------|
| cross_entropy | classification | no              | no         | the logits                   |
| bce           | binary         | no              | no         | the logit                    |
| mse           | regression     | no              | no         | the score (in the head's target space) |
| pearson       | regression     | yes             | yes        | the scores of the batch      |
| mse+pearson   | regression     | yes             | no         | both                         |
| ranking       | binary         | yes             | yes        | the pair's two embeddings    |

- `batch_statistic`: the loss is a statistic of the whole batch (a correlation, a ranking against
  the other pairs of the batch), so a batch of one carries no signal; every guard that needs whole
  batches reads this declaration (the params' check of the batch size and of gradient accumulation,
  torchrun's per-process slices, the training data left after downsampling);
- `calibrate`: the head's outputs end on no fixed scale, so when training ends an affine map is
  fitted to the training labels (a regression's scores, a binary task's logit: minbert.model.outputs);
- `reads = "pairs"`: the loss reads the two sentence embeddings of each pair (a bi-encoder head).

The built-in losses are one file each in minbert/model/losses/, registered with `@register_loss`
(minbert.core.register, beside `@register_head`) exactly as a loss of your own is, in a module the params name (`modules:`; docs/extending.md).
`@register_loss(replace=True)` uses yours in place of the built-in loss of its name; any other name
that is taken is refused. This module holds no loss code (and imports no torch): the params checks
read the declarations without it.
"""
from __future__ import annotations

from typing import ClassVar


class Loss:
    """A task's loss on its head's outputs: `loss(output, target, pair)` with `target` the labels
    in the head's target space and `pair` the pair's two embeddings when `reads == "pairs"`; it
    returns a 0-dim floating tensor that carries the gradient (checked on its first use)."""
    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]            # the task kinds it trains (minbert.core.tasks.KINDS)
    batch_statistic: ClassVar[bool] = False     # a statistic of the whole batch (a batch of one: no signal)
    calibrate: ClassVar[bool] = False           # outputs on no fixed scale: fitted to the labels when training ends
    reads: ClassVar[str] = "outputs"            # "outputs", or "pairs": the pair's two sentence embeddings

    def __call__(self, output, target, pair=None):
        raise NotImplementedError


def __getattr__(name: str):
    """`register_loss`, imported from here by modules written before minbert.core.register held it."""
    if name == "register_loss":
        from minbert.core import register  # register imports this module: imported when first asked for

        return register.register_loss
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
