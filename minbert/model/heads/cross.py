"""`cross`: a pair's output (one number, or one logit per class), an MLP on the cross-encoder's
vector of "[CLS] a [SEP] b [SEP]"."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import VectorHead


@register_head
class CrossPairHead(VectorHead):
    name, view = "cross", "cross"
