"""`prototypes`: 003's SST_TO_STS, a classification task's head. The cosine similarities of a text
to `heads.prototypes_per_label` training texts of each label, concatenated with those texts'
labels, through dropout and a linear layer to the class logits. The prototypes are embedded once,
before the head trains (`prepare`), by the frozen encoder, and kept as buffers: the head trains
over a frozen encoder only."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minbert.core.errors import MinBertError
from minbert.core.register import register_head
from minbert.model.blocks import Head, mlp


@register_head
class PrototypeHead(Head):
    name, view, kinds, settings, frozen_encoder = ("prototypes", "single", ("classification",),
                                                   ("prototypes_per_label",), True)

    @classmethod
    def build(cls, in_dim, task, heads):
        return cls(in_dim, task.outputs, heads.prototypes_per_label, heads.dropout)

    def __init__(self, in_dim: int, classes: int, per_label: int, dropout: float):
        super().__init__()
        n = classes * per_label
        self.classes, self.per_label = classes, per_label
        self.register_buffer("prototypes", torch.zeros(n, in_dim))
        self.register_buffer("labels", torch.zeros(n))
        self.register_buffer("ready", torch.zeros((), dtype=torch.bool))
        self.net = mlp(2 * n, classes, in_dim, 0, dropout)
        self._ready = False     # the buffer's value, known to the host (reading the buffer waits for the device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._ready = bool(self.ready)

    def prepare(self, task: str, labels: np.ndarray, embed, seed: int) -> None:
        """Draw `per_label` training rows of each label (seeded; with replacement where a label has
        fewer) and keep their embeddings (`embed(rows)`: (N, H), by the frozen encoder)."""
        rng = np.random.default_rng([seed, 53])
        picks = []
        for label in range(self.classes):
            rows = np.flatnonzero(labels == label)
            if len(rows) == 0:
                raise MinBertError(f"the {task} training data has no example of label {label} for the prototypes head")
            picks += rng.choice(rows, self.per_label, replace=len(rows) < self.per_label).tolist()
        self.set_prototypes(embed(picks), torch.tensor(labels[picks], dtype=torch.float32))

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
            raise RuntimeError("PrototypeHead used before its prototypes were prepared")
        sims = F.normalize(emb.float(), dim=-1) @ self.prototypes.T                  # (B, P)
        feats = torch.cat([sims, self.labels.expand(len(emb), -1)], -1).to(emb.dtype)
        return self.net(feats)
