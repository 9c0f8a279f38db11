"""`classifier`: a one-text task's head, an MLP on its vector: C logits (classification), or one
logit (binary), or a score (regression)."""
from __future__ import annotations

from minbert.core.register import register_head
from minbert.model.blocks import VectorHead


@register_head
class ClassifierHead(VectorHead):
    name, view = "classifier", "single"
