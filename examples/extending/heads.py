"""A pair head of your own: a bilinear form of the two sentence vectors, u^T W v + b (one output per
class, or one score). Named in params.yaml's `modules:` and chosen by name: `heads: {sts: bilinear}`."""
from torch import nn

from minbert.core.register import register_head


@register_head
class Bilinear(nn.Module):
    name = "bilinear"      # what params call it
    view = "bi"            # it reads the two sentences' vectors u, v (a bi-encoder)

    def __init__(self, in_dim: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.bilinear = nn.Bilinear(in_dim, in_dim, outputs)
        self.squeeze = outputs == 1

    def forward(self, u, v):  # (B, H), (B, H) -> (B,), or (B, C)
        out = self.bilinear(self.dropout(u), self.dropout(v))
        return out.squeeze(-1) if self.squeeze else out
