"""What the heads are made of, and what sits between the encoder and them.

- `Head`: what a head is (its declaration as class attributes: minbert.core.registry; its
  constructor `(in_dim, outputs, hidden_layers, dropout)`, or a `build` of its own that reads more
  of the heads settings); each head is one file in minbert/model/heads/, registered by name as a
  head of the user's is (docs/extending.md). `make_head` builds any of them, the user's included;
- `mlp`: dropout, hidden GELU layers and the output layer, which most heads end with; `VectorHead`,
  an MLP on one vector; `PairFeatureHead`, an MLP on features of a pair's two vectors;
- `HybridPairHead`: a bi-encoder head plus a cross-encoder term (`heads.hybrid`);
- between the encoder and the heads: `SharedBlock`, dense layers some tasks share, and `Branch`,
  extra transformer layers of one task (003's FREEZE_SST), copies of the encoder's top layers.
"""
from __future__ import annotations

import copy
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert.core.errors import MinBertError
from minbert.core.tasks import KINDS, Task
from minbert.model.bert import BertModel, init_std_linear

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


class Head(nn.Module):
    """A task's head. Its class states its declaration (minbert.core.registry.HeadDeclaration): its
    `name`, the `view` it reads (`single`: one text's vector, `forward(emb)`; `cross`: a
    cross-encoded pair's, `forward(emb)`; `bi`: the pair's two vectors, `forward(u, v)`), its
    `outputs` ("any": (B, C) logits for C classes, else (B,); "one": (B,) whatever the task), the
    task `kinds` it serves, the heads `settings` it reads and whether it needs a `frozen_encoder`."""
    name: ClassVar[str]
    view: ClassVar[str]
    outputs: ClassVar[str] = "any"
    kinds: ClassVar[tuple[str, ...]] = KINDS
    settings: ClassVar[tuple[str, ...]] = ()
    frozen_encoder: ClassVar[bool] = False

    @classmethod
    def build(cls, in_dim: int, task: Task, heads) -> nn.Module:
        """The head of `task` on `in_dim`-wide vectors under the heads settings `heads`."""
        return cls(in_dim, task.outputs, heads.depth(task.name), heads.dropout)


def make_head(cls: type, in_dim: int, task: Task, heads) -> nn.Module:
    """A head of class `cls` (any registered head: a `Head`, or a user's `nn.Module` with the
    constructor `(in_dim, outputs, hidden_layers, dropout)`) for `task`."""
    build = getattr(cls, "build", None)
    if build is not None:
        return build(in_dim, task, heads)
    return cls(in_dim, task.outputs, heads.depth(task.name), heads.dropout)


class VectorHead(Head):
    """An MLP on one vector: a text's (`single`), or a cross-encoded pair's (`cross`); (B, C) logits
    for C classes, else (B,)."""

    def __init__(self, in_dim: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        self.net = mlp(in_dim, outputs, in_dim, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, emb):  # (B, H) -> (B, C), or (B,) for one output
        out = self.net(emb)
        return out.squeeze(-1) if self.squeeze else out


def cosine(u, v):
    """cos(u, v) per row, computed in float32 (B,)."""
    return F.cosine_similarity(u.float(), v.float(), dim=-1).to(u.dtype)


# what a bi-encoder head may read of a pair's vectors u, v (B, H): a vector (B, H), or the cosine (B, 1)
PAIR_FEATURES = {"u": lambda u, v: u, "v": lambda u, v: v, "|u-v|": lambda u, v: (u - v).abs(),
                 "u*v": lambda u, v: u * v, "cos": lambda u, v: cosine(u, v)[:, None]}


class PairFeatureHead(Head):
    """A bi-encoder head: an MLP on the features `parts` (of PAIR_FEATURES) of the pair's vectors,
    side by side."""
    parts: ClassVar[tuple[str, ...]]

    def __init__(self, in_dim: int, outputs: int, hidden_layers: int, dropout: float):
        super().__init__()
        width = sum(1 if p == "cos" else in_dim for p in self.parts)
        self.net = mlp(width, outputs, in_dim, hidden_layers, dropout)
        self.squeeze = outputs == 1

    def forward(self, u, v):  # (B, H), (B, H) -> (B,), or (B, C)
        out = self.net(torch.cat([PAIR_FEATURES[p](u, v) for p in self.parts], -1))
        return out.squeeze(-1) if self.squeeze else out


def affine_cosine(head: nn.Module, init_scale: float, init_bias: float, affine: bool) -> None:
    """Give `head` the `scale` and `bias` of a cosine: learned from (init_scale, init_bias), or the plain
    cosine (affine=False: 1 and 0, fixed)."""
    scale, bias = (float(init_scale), float(init_bias)) if affine else (1.0, 0.0)
    if affine:
        head.scale = nn.Parameter(torch.tensor(scale))
        head.bias = nn.Parameter(torch.tensor(bias))
    else:
        head.register_buffer("scale", torch.tensor(scale))
        head.register_buffer("bias", torch.tensor(bias))


def cosine_start(task: Task) -> tuple[float, float]:
    """Where a cosine's affine map starts: a binary task's logit 0 at a cosine of 0.75 (10 cos - 7.5),
    a score as the cosine itself."""
    return (10.0, -7.5) if task.kind == "binary" else (1.0, 0.0)


class HybridPairHead(nn.Module):
    """bi-encoder head(u, v) + cross-encoder head(c): one output per pair from both views."""

    def __init__(self, bi: nn.Module, cross: nn.Module):
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


def reaches(out, sources) -> bool:
    """Whether the autograd graph of `out` reaches one of `sources` (tensors: the node that computed
    each, or the tensor itself for a leaf such as a parameter), so that a gradient of `out` flows
    into them: what `requires_grad` alone cannot tell (a fresh leaf, a detached value made to require
    a gradient). A walk over the graph's nodes, each once, stopped at the first source met."""
    node = getattr(out, "grad_fn", None)
    if node is None:
        return False
    made = {s.grad_fn for s in sources if s.grad_fn is not None}
    leaves = {id(s) for s in sources if s.grad_fn is None}
    seen, stack = {node}, [node]
    while stack:
        node = stack.pop()
        if node in made or id(getattr(node, "variable", None)) in leaves:
            return True
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return False


def shared_widths(sizes: list, hidden: int) -> list[int]:
    """Shared layers' widths (`SharedParams.sizes`) over an encoder of `hidden` units: `encoder` is its
    width, `encoder/N` an Nth of it (rounded down, at least 1); `[]` one layer of its width."""
    out = []
    for size in sizes or ["encoder"]:
        if isinstance(size, int):
            out.append(size)
        else:
            _, _, n = size.partition("/")
            out.append(max(1, hidden // int(n or 1)))
    return out
