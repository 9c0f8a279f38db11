"""A frozen, deterministic encoder's sentence embeddings, computed once per split.

With `finetune.freeze_encoder` (the frozen baseline, and every head retraining) the encoder's
outputs are the same every epoch: only the heads (and a shared block) learn. Recomputing them is
most of such a job's time, so the training step and the dev evaluation run the heads on embeddings
stored once (minbert.model.embeddings.FrozenFeatures, which prediction uses too).

Only where the frozen encoder is deterministic: not with `frozen_encoder_dropout` (its dropout then
draws new masks every batch, as the course code does), not with SMART (its perturbation goes through
the encoder), not for a task with a trainable branch of extra layers over the encoder (003's
FREEZE_SST). The stored embeddings equal the ones the encoder gives batch by batch up to float
rounding (tests/test_frozen.py).
"""
from __future__ import annotations

from minbert.model.embeddings import ENCODE_BATCH, FrozenFeatures
from minbert.model.multitask import MultitaskModel

__all__ = ["ENCODE_BATCH", "FrozenFeatures", "cacheable"]


def cacheable(model: MultitaskModel, cfg, task: str) -> bool:
    """Whether `task`'s sentence embeddings are the same every time they are computed in this run."""
    return (cfg.freeze_encoder and not cfg.frozen_encoder_dropout and not cfg.smart.enabled
            and task not in model.branches)
