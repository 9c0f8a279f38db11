"""`concat_uv`: a bi-encoder head on [u, v], the pair's two sentence vectors side by side."""
from __future__ import annotations

import torch

from minbert.core.extensions import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class ConcatUV(PairFeatureHead):
    name, view = "concat_uv", "bi"

    @staticmethod
    def width(in_dim: int) -> int:
        return 2 * in_dim

    def features(self, u, v):
        return torch.cat([u, v], -1)
