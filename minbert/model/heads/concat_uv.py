"""`concat_uv`: a bi-encoder head [u, v], the pair's two sentence vectors side by side through an MLP."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class ConcatUV(PairFeatureHead):
    name, view, parts = "concat_uv", "bi", ("u", "v")
