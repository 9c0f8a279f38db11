"""Task heads: what turns sentence embeddings into sentiment logits, paraphrase logits and
similarity scores, and what a head may add between the encoder and itself.

Pair tasks come in two families:
- cross-encoder (`cross`): the encoder reads "[CLS] a [SEP] b [SEP]" and the head sees one vector;
- bi-encoder (the rest): each sentence is embedded separately (u, v) and the head combines them:
  `concat_uv` [u, v], `concat` [u, v, |u-v|] (SBERT), `concat_mult` [u, v, |u-v|, u*v],
  `concat_cos` [u, v, cos(u,v)], `cosine` cos(u, v) (with a learned affine map unless
  `cosine_affine: false`), `cosine_linear` cos(u, v) plus a linear output on [u, v, |u-v|].
A `hybrid` pair head is a bi-encoder head plus a cross-encoder term: the encoder reads the pair
both ways (each sentence alone, and "[CLS] a [SEP] b [SEP]"), and the output is the sum.

One-sentence tasks get a classifier (`ClassifierHead`), or for SST 003's SST_TO_STS head
(`PrototypeHead`: cosines to labelled training sentences -> a linear layer). Between the encoder
and the heads: `SharedBlock`, dense layers some tasks share, and `Branch`, extra transformer
layers of one task (003's FREEZE_SST), copies of the encoder's top layers.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert.model.bert import BertModel, init_std_linear
from minbert.params.finetune import BI_ENCODER_HEADS, SCALAR_HEADS

ACTIVATIONS = {"leaky_relu": nn.LeakyReLU, "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


def mlp(in_dim: int, out_dim: int, hidden_dim: int, hidden_layers: int, dropout: float) -> nn.Sequential:
    """Dropout, then `hidden_layers` x (Linear, GELU, Dropout), then the output Linear."""
    layers: list[nn.Module] = [nn.Dropout(dropout)]
    dim = in_dim
    for _ in range(hidden_layers):
        layers += [init_std_linear(nn.Linear(dim, hidden_dim)), nn.GELU(), nn.Dropout(dropout)]
        dim = hidden_dim
    layers.append(init_std_linear(nn.Linear(dim, out_dim)))
    return nn.Sequential(*layers)


class ClassifierHead(nn.Module):
    """A one-sentence task's head: C logits (classification), or one logit (binary)."""

    def __init__(self, hidden: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.net = mlp(hidden, outputs, hidden, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, emb):  # (B, H) -> (B, C), or (B,) for one output
        out = self.net(emb)
        return out.squeeze(-1) if self.squeeze else out


class PrototypeHead(nn.Module):
    """003's SST_TO_STS: the cosine similarities of a sentence to `per_label` training sentences of
    each label, concatenated with those sentences' labels, through dropout and a linear layer to
    the class logits. The prototypes' embeddings are computed once (`set_prototypes`) with the
    encoder frozen, and kept as buffers."""

    def __init__(self, hidden: int, classes: int, per_label: int, dropout: float):
        super().__init__()
        n = classes * per_label
        self.register_buffer("prototypes", torch.zeros(n, hidden))
        self.register_buffer("labels", torch.zeros(n))
        self.register_buffer("ready", torch.zeros((), dtype=torch.bool))
        self.net = mlp(2 * n, classes, hidden, 0, dropout)
        self._ready = False     # the buffer's value, known to the host (reading the buffer waits for the device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._ready = bool(self.ready)

    @torch.no_grad()
    def set_prototypes(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        if embeddings.shape != self.prototypes.shape:
            raise ValueError(f"expected {tuple(self.prototypes.shape)} prototype embeddings, got {tuple(embeddings.shape)}")
        self.prototypes.copy_(F.normalize(embeddings.float(), dim=-1))
        self.labels.copy_(labels.float())
        self.ready.fill_(True)
        self._ready = True

    def forward(self, emb):  # (B, H) -> (B, C)
        if not self._ready:
            raise RuntimeError("PrototypeHead used before set_prototypes")
        sims = F.normalize(emb.float(), dim=-1) @ self.prototypes.T                  # (B, P)
        feats = torch.cat([sims, self.labels.expand(len(emb), -1)], -1).to(emb.dtype)
        return self.net(feats)


class CrossPairHead(nn.Module):
    """A pair's output (one number, or one logit per class) from the cross-encoder's pooled vector."""

    def __init__(self, hidden: int, hidden_layers: int, dropout: float, outputs: int = 1):
        super().__init__()
        self.net = mlp(hidden, outputs, hidden, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, emb):  # (B, H) -> (B,), or (B, C)
        out = self.net(emb)
        return out.squeeze(-1) if self.squeeze else out


class BiPairHead(nn.Module):
    """One output per pair from two sentence embeddings u, v."""

    def __init__(self, kind: str, hidden: int, hidden_layers: int, dropout: float,
                 init_scale: float = 1.0, init_bias: float = 0.0, affine: bool = True, outputs: int = 1):
        super().__init__()
        assert kind in BI_ENCODER_HEADS, kind
        assert outputs == 1 or kind not in SCALAR_HEADS, (kind, outputs)
        self.kind, self.squeeze = kind, outputs == 1
        in_dim = {"concat_uv": 2 * hidden, "concat": 3 * hidden, "concat_mult": 4 * hidden,
                  "concat_cos": 2 * hidden + 1, "cosine_linear": 3 * hidden}.get(kind)
        self.net = mlp(in_dim, outputs, hidden, hidden_layers, dropout) if in_dim else None
        if kind in ("cosine", "cosine_linear"):
            # a learned affine map of the cosine (the caller picks a sensible start per task), or
            # the plain cosine (affine=False: scale 1 and shift 0, fixed)
            scale, bias = (float(init_scale), float(init_bias)) if affine else (1.0, 0.0)
            if affine:
                self.scale = nn.Parameter(torch.tensor(scale))
                self.bias = nn.Parameter(torch.tensor(bias))
            else:
                self.register_buffer("scale", torch.tensor(scale))
                self.register_buffer("bias", torch.tensor(bias))

    def _out(self, x):
        out = self.net(x)
        return out.squeeze(-1) if self.squeeze else out

    def forward(self, u, v):  # (B, H), (B, H) -> (B,), or (B, C)
        if self.kind == "concat_uv":
            return self._out(torch.cat([u, v], -1))
        if self.kind == "concat":
            return self._out(torch.cat([u, v, (u - v).abs()], -1))
        if self.kind == "concat_mult":
            return self._out(torch.cat([u, v, (u - v).abs(), u * v], -1))
        cos = F.cosine_similarity(u.float(), v.float(), dim=-1).to(u.dtype)
        if self.kind == "concat_cos":
            return self._out(torch.cat([u, v, cos[:, None]], -1))
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


class SharedBlock(nn.Module):
    """Dense layers (Linear, activation, dropout) shared by some tasks between the encoder and
    their heads: 000 shares one 768 -> 384 leaky-ReLU layer among all tasks, 003 two ReLU layers
    between Para and STS. A bi-encoder task's sentences go through it one by one."""

    def __init__(self, hidden: int, sizes: list[int], activation: str, dropout: float):
        super().__init__()
        layers, dim = [], hidden
        for size in sizes:
            layers += [init_std_linear(nn.Linear(dim, size)), ACTIVATIONS[activation](), nn.Dropout(dropout)]
            dim = size
        self.net = nn.Sequential(*layers)
        self.out_dim = dim

    def forward(self, x):  # (N, H) -> (N, out_dim)
        return self.net(x)


class Branch(nn.Module):
    """Extra transformer layers one task adds over the encoder's last hidden states, initialised as
    copies of the encoder's top `n` layers (003's FREEZE_SST: 4 layers for SST over a frozen
    encoder)."""

    def __init__(self, encoder: BertModel, n: int):
        super().__init__()
        if n > len(encoder.layers):
            from minbert.core.errors import MinBertError

            raise MinBertError(f"heads.extra_layers asks for {n} extra layers but the encoder has only "
                               f"{len(encoder.layers)} to copy; ask for at most {len(encoder.layers)}")
        self.layers = nn.ModuleList(copy.deepcopy(layer) for layer in encoder.layers[-n:])
        for p in self.layers.parameters():
            p.requires_grad_(True)

    def forward(self, hidden, attention_mask, padded: bool | None = None):  # (B, T, H) -> (B, T, H), zeros at padding
        bias = BertModel.attention_bias(attention_mask, padded)
        for layer in self.layers:
            hidden = layer(hidden, bias)
        return hidden * attention_mask[..., None].to(hidden.dtype)
