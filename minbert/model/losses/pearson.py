"""`pearson`: 1 - Pearson r of a regression's scores over the batch (a statistic of the whole
batch, on no fixed scale: calibrated when training ends)."""
from __future__ import annotations

import torch

from minbert.core.register import Loss, register_loss
from minbert.model.vectors import as_vector


def pearson_loss(pred, target, eps: float = 1e-8):
    """1 - Pearson correlation between `pred` and `target` over the batch.

    Differentiable, and finite for constant inputs: `eps` inside the square roots keeps the
    gradient of the norms finite when a centred vector is all zeros (then r = 0, loss = 1).
    Pearson r ignores the scale and offset of `pred`, so a head trained only with this loss
    predicts scores that correlate with the labels but are not on their scale.
    """
    pred, target = as_vector(pred, "pred"), as_vector(target, "target")
    if pred.shape != target.shape:
        raise ValueError(f"pred and target lengths differ: {pred.shape[0]} vs {target.shape[0]}")
    pc = pred - pred.mean()
    tc = target - target.mean()
    r = (pc * tc).sum() / torch.sqrt(((pc * pc).sum() + eps) * ((tc * tc).sum() + eps))
    return 1.0 - r


@register_loss
class Pearson(Loss):
    name, kinds, batch_statistic, calibrate = "pearson", ("regression",), True, True

    def __call__(self, output, target, pair=None):
        return pearson_loss(output.float(), target.float())
