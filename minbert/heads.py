"""Task heads: what turns sentence embeddings into sentiment logits, paraphrase logits and
similarity scores.

Pair tasks come in two families:
- cross-encoder (`cross`): the encoder reads "[CLS] a [SEP] b [SEP]" and the head sees one vector;
- bi-encoder (the rest): each sentence is embedded separately (u, v) and the head combines them:
  `concat` [u, v, |u-v|] (SBERT), `concat_mult` [u, v, |u-v|, u*v], `concat_cos` [u, v, cos(u,v)],
  `cosine` cos(u, v) with a learned affine map, `cosine_linear` cos(u, v) plus a linear output on
  [u, v, |u-v|].
A `hybrid` pair head is a bi-encoder head plus a cross-encoder term: the encoder reads the pair
both ways (each sentence alone, and "[CLS] a [SEP] b [SEP]"), and the output is the sum.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import init_std_linear

BI_ENCODER_HEADS = ("concat", "concat_mult", "concat_cos", "cosine", "cosine_linear")
NUM_SENTIMENT_CLASSES = 5


def mlp(in_dim: int, out_dim: int, hidden_dim: int, hidden_layers: int, dropout: float) -> nn.Sequential:
    """Dropout, then `hidden_layers` x (Linear, GELU, Dropout), then the output Linear."""
    layers: list[nn.Module] = [nn.Dropout(dropout)]
    dim = in_dim
    for _ in range(hidden_layers):
        layers += [init_std_linear(nn.Linear(dim, hidden_dim)), nn.GELU(), nn.Dropout(dropout)]
        dim = hidden_dim
    layers.append(init_std_linear(nn.Linear(dim, out_dim)))
    return nn.Sequential(*layers)


class SentimentHead(nn.Module):
    def __init__(self, hidden: int, hidden_layers: int, dropout: float, num_classes: int = NUM_SENTIMENT_CLASSES):
        super().__init__()
        self.net = mlp(hidden, num_classes, hidden, hidden_layers, dropout)

    def forward(self, emb):  # (B, H) -> (B, C)
        return self.net(emb)


class CrossPairHead(nn.Module):
    """One output per pair from the cross-encoder's pooled vector."""

    def __init__(self, hidden: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.net = mlp(hidden, 1, hidden, hidden_layers, dropout)

    def forward(self, emb):  # (B, H) -> (B,)
        return self.net(emb).squeeze(-1)


class BiPairHead(nn.Module):
    """One output per pair from two sentence embeddings u, v."""

    def __init__(self, kind: str, hidden: int, hidden_layers: int, dropout: float,
                 init_scale: float = 1.0, init_bias: float = 0.0):
        super().__init__()
        assert kind in BI_ENCODER_HEADS, kind
        self.kind = kind
        in_dim = {"concat": 3 * hidden, "concat_mult": 4 * hidden, "concat_cos": 2 * hidden + 1,
                  "cosine_linear": 3 * hidden}.get(kind)
        self.net = mlp(in_dim, 1, hidden, hidden_layers, dropout) if in_dim else None
        if kind in ("cosine", "cosine_linear"):
            # a learned affine map of the cosine (the caller picks a sensible start per task)
            self.scale = nn.Parameter(torch.tensor(float(init_scale)))
            self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    def forward(self, u, v):  # (B, H), (B, H) -> (B,)
        if self.kind == "concat":
            return self.net(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1)
        if self.kind == "concat_mult":
            return self.net(torch.cat([u, v, (u - v).abs(), u * v], -1)).squeeze(-1)
        cos = F.cosine_similarity(u.float(), v.float(), dim=-1).to(u.dtype)
        if self.kind == "concat_cos":
            return self.net(torch.cat([u, v, cos[:, None]], -1)).squeeze(-1)
        out = self.scale * cos + self.bias
        if self.kind == "cosine_linear":
            out = out + self.net(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1)
        return out


class HybridPairHead(nn.Module):
    """bi-encoder head(u, v) + cross-encoder head(c): one output per pair from both views."""

    def __init__(self, bi: BiPairHead, cross: CrossPairHead):
        super().__init__()
        self.bi = bi
        self.cross = cross

    def forward(self, u, v, c):  # (B, H) x 3 -> (B,)
        return self.bi(u, v) + self.cross(c)


class SharedLayer(nn.Module):
    """A dense layer shared by the pair tasks, between the encoder and their heads."""

    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.dense = init_std_linear(nn.Linear(hidden, hidden))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(F.leaky_relu(self.dense(x)))
