"""`ranking`: sentence-transformers' MultipleNegativesRankingLoss for labelled pairs. Each positive
pair (label 1) ranks its second sentence first among the second sentences of every pair of the
batch, by cosine similarity times `scale`, with cross-entropy; it reads the pair's two sentence
vectors (a bi-encoder head), is a statistic of the whole batch, and leaves the logit on no fixed
scale (calibrated when training ends)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minbert.core.register import Loss, register_loss


@register_loss
class MultipleNegativesRanking(Loss):
    name, kinds, batch_statistic, calibrate, reads = "ranking", ("binary",), True, True, "pairs"
    scale = 20.0                        # sentence-transformers' default: cosine similarities x 20

    def __call__(self, output, target, pair=None):
        u, v = (F.normalize(x.float(), dim=-1) for x in pair)         # (B, H) each
        scores = self.scale * u @ v.T                                    # (B, B): row i against every v_j
        ranked = F.cross_entropy(scores, torch.arange(len(u), device=u.device), reduction="none")
        positive = (target.float() > 0.5).float()
        # the mean over the positive pairs; no positive pair in the batch: 0 (no data-dependent branch,
        # so the step stays free of host reads and capturable)
        return (ranked * positive).sum() / positive.sum().clamp_min(1.0)
