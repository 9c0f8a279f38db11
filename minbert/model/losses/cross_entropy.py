"""`cross_entropy`: a classification task's softmax cross-entropy on its logits."""
from __future__ import annotations

import torch.nn.functional as F

from minbert.core.register import Loss, register_loss


@register_loss
class CrossEntropy(Loss):
    name, kinds = "cross_entropy", ("classification",)

    def __call__(self, output, target, pair=None):
        return F.cross_entropy(output.float(), target.long())
