"""Where in an epoch a training run scores dev: fine-tuning (minbert.train.loop) and masked-LM and
NLI pretraining (minbert.train.pretrain) evaluate at the same points, so `evals_per_epoch` means one
thing in both; and in what batches fine-tuning scores it (the estimate prices the same batches)."""
from __future__ import annotations

EVAL_BATCH_SIZE = 128          # dev evaluation during training (prediction speed lives in predict)


def eval_points(n_updates: int, evals: int) -> list[int]:
    """After which of an epoch's updates (1-based) dev is evaluated: `evals` points evenly spaced, the
    last at the epoch's end (fewer when the epoch has fewer updates)."""
    return sorted({max(1, round(n_updates * (j + 1) / evals)) for j in range(evals)}) if n_updates else []
