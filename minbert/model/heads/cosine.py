"""`cosine`: one number per pair, cos(u, v) through a learned affine map `a cos + b` (or the plain
cosine: `heads.cosine_affine: false`); a regression's labels scaled to [0, 1], or to [-1, 1] with
`heads.cosine_target: -1_1` (minbert.model.outputs)."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import Head, affine_cosine, cosine, cosine_start


@register_head
class CosineHead(Head):
    name, view, outputs, settings = "cosine", "bi", "one", ("cosine_affine", "cosine_target")

    @classmethod
    def build(cls, in_dim, task, heads):
        return cls(*cosine_start(task), affine=heads.cosine_affine)

    def __init__(self, init_scale: float = 1.0, init_bias: float = 0.0, affine: bool = True):
        super().__init__()
        affine_cosine(self, init_scale, init_bias, affine)

    def forward(self, u, v):  # (B, H), (B, H) -> (B,)
        cos = cosine(u, v)
        return self.scale * cos + self.bias
