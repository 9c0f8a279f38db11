"""A task's training loss as a small object chosen by name (params: `finetune.heads.losses`, a
task's declared `loss`), each declaring what the checks around it need to know:

| name          | kinds          | batch statistic | calibrated | reads                        |
|---------------|----------------|-----------------|------------|------------------------------|
| cross_entropy | classification | no              | no         | the logits                   |
| bce           | binary         | no              | no         | the logit                    |
| mse           | regression     | no              | no         | the score (in the head's target space) |
| pearson       | regression     | yes             | yes        | the scores of the batch      |
| mse+pearson   | regression     | yes             | no         | both                         |
| ranking       | binary         | yes             | yes        | the pair's two embeddings    |

- `batch_statistic`: the loss is a statistic of the whole batch (a correlation, a ranking against
  the other pairs of the batch), so a batch of one carries no signal; the three guards refuse it
  (the params' check of the batch size, torchrun's per-process slices, the training data left
  after downsampling) by reading this declaration;
- `calibrate`: the head's outputs end on no fixed scale, so when training ends an affine map is
  fitted to the training labels (a regression's scores, a binary task's logit: minbert.model.outputs);
- `reads = "pairs"`: the loss reads the two sentence embeddings of each pair (a bi-encoder head).

`ranking` is sentence-transformers' MultipleNegativesRankingLoss for labelled pairs: each positive
pair (label 1) ranks its second sentence first among the second sentences of every pair of the
batch, by cosine similarity times `scale`, with cross-entropy.

A loss of your own is a subclass registered by name (`@register_loss`) in a module the params name
(`modules:`; docs/extending.md). torch is imported when a loss computes, not when this module is
read: the params checks read the declarations without it.
"""
from __future__ import annotations

from typing import ClassVar

LOSSES: dict[str, type[Loss]] = {}      # every loss by name: the built-in ones below and the user's


class Loss:
    """A task's loss on its head's outputs: `loss(output, target, pair)` with `target` the labels
    in the head's target space and `pair` the pair's two embeddings when `reads == "pairs"`."""
    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]            # the task kinds it trains (minbert.core.tasks.KINDS)
    batch_statistic: ClassVar[bool] = False     # a statistic of the whole batch (a batch of one: no signal)
    calibrate: ClassVar[bool] = False           # outputs on no fixed scale: fitted to the labels when training ends
    reads: ClassVar[str] = "outputs"            # "outputs", or "pairs": the pair's two sentence embeddings

    def __call__(self, output, target, pair=None):
        raise NotImplementedError


def register_loss(cls: type[Loss]) -> type[Loss]:
    """Make a loss class choosable by its `name` (a decorator)."""
    LOSSES[cls.name] = cls
    return cls


def _vector(x):
    """(B,) or (B, 1) -> (B,), at least float32."""
    import torch

    if x.dim() == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 1:
        raise ValueError(f"expected shape (B,) or (B, 1), got {tuple(x.shape)}")
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def pearson_loss(pred, target, eps: float = 1e-8):
    """1 - Pearson correlation between `pred` and `target` over the batch.

    Differentiable, and finite for constant inputs: `eps` inside the square roots keeps the
    gradient of the norms finite when a centred vector is all zeros (then r = 0, loss = 1).
    Pearson r ignores the scale and offset of `pred`, so a head trained only with this loss
    predicts scores that correlate with the labels but are not on their scale.
    """
    import torch

    pred, target = _vector(pred), _vector(target)
    if pred.shape != target.shape:
        raise ValueError(f"pred and target lengths differ: {pred.shape[0]} vs {target.shape[0]}")
    pc = pred - pred.mean()
    tc = target - target.mean()
    r = (pc * tc).sum() / torch.sqrt(((pc * pc).sum() + eps) * ((tc * tc).sum() + eps))
    return 1.0 - r


@register_loss
class CrossEntropy(Loss):
    name, kinds = "cross_entropy", ("classification",)

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.cross_entropy(output.float(), target.long())


@register_loss
class BinaryCrossEntropy(Loss):
    name, kinds = "bce", ("binary",)

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.binary_cross_entropy_with_logits(output.float(), target.float())


@register_loss
class MeanSquaredError(Loss):
    name, kinds = "mse", ("regression",)

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.mse_loss(output.float(), target.float())


@register_loss
class Pearson(Loss):
    name, kinds, batch_statistic, calibrate = "pearson", ("regression",), True, True

    def __call__(self, output, target, pair=None):
        return pearson_loss(output.float(), target.float())


@register_loss
class MeanSquaredErrorAndPearson(Loss):
    name, kinds, batch_statistic = "mse+pearson", ("regression",), True

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.mse_loss(output.float(), target.float()) + pearson_loss(output.float(), target.float())


@register_loss
class MultipleNegativesRanking(Loss):
    """Each positive pair's second sentence against the second sentences of the whole batch."""
    name, kinds, batch_statistic, calibrate, reads = "ranking", ("binary",), True, True, "pairs"
    scale = 20.0                        # sentence-transformers' default: cosine similarities x 20

    def __call__(self, output, target, pair=None):
        import torch
        import torch.nn.functional as F

        u, v = (F.normalize(x.float(), dim=-1) for x in pair)         # (B, H) each
        scores = self.scale * u @ v.T                                    # (B, B): row i against every v_j
        ranked = F.cross_entropy(scores, torch.arange(len(u), device=u.device), reduction="none")
        positive = (target.float() > 0.5).float()
        # the mean over the positive pairs; no positive pair in the batch: 0 (no data-dependent branch,
        # so the step stays free of host reads and capturable)
        return (ranked * positive).sum() / positive.sum().clamp_min(1.0)


def loss_named(name: str) -> Loss:
    return LOSSES[name]()
