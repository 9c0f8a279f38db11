"""`bce`: a binary task's cross-entropy on its one logit."""
from __future__ import annotations

import torch.nn.functional as F

from minbert.core.register import Loss, register_loss


@register_loss
class BinaryCrossEntropy(Loss):
    name, kinds = "bce", ("binary",)

    def __call__(self, output, target, pair=None):
        return F.binary_cross_entropy_with_logits(output.float(), target.float())
