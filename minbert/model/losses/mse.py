"""`mse`: a regression task's mean squared error, in the head's target space."""
from __future__ import annotations

import torch.nn.functional as F

from minbert.core.register import Loss, register_loss


@register_loss
class MeanSquaredError(Loss):
    name, kinds = "mse", ("regression",)

    def __call__(self, output, target, pair=None):
        return F.mse_loss(output.float(), target.float())
