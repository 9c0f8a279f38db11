"""`classifier`: a one-text task's head, an MLP on its vector: C logits (classification), or one
logit (binary), or a score (regression)."""
from __future__ import annotations

from minbert.core.extensions import register_head
from minbert.model.blocks import Head, mlp


@register_head
class ClassifierHead(Head):
    name, view = "classifier", "single"

    def __init__(self, in_dim: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.net = mlp(in_dim, outputs, in_dim, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, emb):  # (B, H) -> (B, C), or (B,) for one output
        out = self.net(emb)
        return out.squeeze(-1) if self.squeeze else out
