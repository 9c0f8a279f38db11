"""`concat_mult`: a bi-encoder head on [u, v, |u - v|, u * v] through an MLP."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class ConcatMult(PairFeatureHead):
    name, view, parts = "concat_mult", "bi", ("u", "v", "|u-v|", "u*v")
