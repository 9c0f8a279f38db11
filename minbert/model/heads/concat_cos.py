"""`concat_cos`: a bi-encoder head on [u, v, cos(u, v)] through an MLP."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class ConcatCos(PairFeatureHead):
    name, view, parts = "concat_cos", "bi", ("u", "v", "cos")
