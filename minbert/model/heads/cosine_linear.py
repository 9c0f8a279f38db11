"""`cosine_linear`: one number per pair, the affine map of cos(u, v) (`cosine`) plus a linear output
on [u, v, |u - v|]."""
from __future__ import annotations

import torch

from minbert.core.register import register_head
from minbert.model.blocks import Head, affine_cosine, cosine, cosine_start, mlp


@register_head
class CosineLinearHead(Head):
    name, view, outputs, settings = "cosine_linear", "bi", "one", ("cosine_affine",)

    @classmethod
    def build(cls, in_dim, task, heads):
        return cls(in_dim, heads.depth(task.name), heads.dropout, *cosine_start(task), affine=heads.cosine_affine)

    def __init__(self, in_dim: int, hidden_layers: int, dropout: float, init_scale: float = 1.0,
                 init_bias: float = 0.0, affine: bool = True):
        super().__init__()
        self.net = mlp(3 * in_dim, 1, in_dim, hidden_layers, dropout)
        affine_cosine(self, init_scale, init_bias, affine)

    def forward(self, u, v):  # (B, H), (B, H) -> (B,)
        cos = cosine(u, v)
        return self.scale * cos + self.bias + self.net(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1)
