"""`concat`: a bi-encoder head SBERT's, on [u, v, |u - v|] through an MLP."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import PairFeatureHead


@register_head
class Concat(PairFeatureHead):
    name, view, parts = "concat", "bi", ("u", "v", "|u-v|")
