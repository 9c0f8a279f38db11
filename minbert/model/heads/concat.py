"""`concat`: SBERT's bi-encoder head, on [u, v, |u - v|]."""
from __future__ import annotations

import torch

from minbert.core.extensions import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class Concat(PairFeatureHead):
    name, view = "concat", "bi"

    @staticmethod
    def width(in_dim: int) -> int:
        return 3 * in_dim

    def features(self, u, v):
        return torch.cat([u, v, (u - v).abs()], -1)
