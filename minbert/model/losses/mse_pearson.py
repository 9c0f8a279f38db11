"""`mse+pearson`: the sum of `mse` and `pearson` (a statistic of the whole batch, on the labels' scale)."""
from __future__ import annotations

import torch.nn.functional as F

from minbert.core.register import Loss, register_loss
from minbert.model.losses.pearson import pearson_loss


@register_loss
class MeanSquaredErrorAndPearson(Loss):
    name, kinds, batch_statistic = "mse+pearson", ("regression",), True

    def __call__(self, output, target, pair=None):
        return F.mse_loss(output.float(), target.float()) + pearson_loss(output.float(), target.float())
