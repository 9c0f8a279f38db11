"""`cross`: a pair's output (one number, or one logit per class) from the cross-encoder's vector of
"[CLS] a [SEP] b [SEP]"."""
from __future__ import annotations

from minbert.core.extensions import register_head
from minbert.model.blocks import Head, mlp


@register_head
class CrossPairHead(Head):
    name, view = "cross", "cross"

    def __init__(self, in_dim: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.net = mlp(in_dim, outputs, in_dim, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, emb):  # (B, H) -> (B,), or (B, C)
        out = self.net(emb)
        return out.squeeze(-1) if self.squeeze else out
