"""`concat_cos`: a bi-encoder head on [u, v, cos(u, v)]."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minbert.core.extensions import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class ConcatCos(PairFeatureHead):
    name, view = "concat_cos", "bi"

    @staticmethod
    def width(in_dim: int) -> int:
        return 2 * in_dim + 1

    def features(self, u, v):
        cos = F.cosine_similarity(u.float(), v.float(), dim=-1).to(u.dtype)
        return torch.cat([u, v, cos[:, None]], -1)
