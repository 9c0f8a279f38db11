"""Losses and output divergences shared by the heads and the regularisers.

- `task_loss`: each task's training loss by its kind (minbert.core.tasks): softmax cross-entropy,
  sigmoid binary cross-entropy, or for a regression task MSE and/or the correlation loss on labels
  scaled into the head's target space (minbert.model.outputs: `regression_target`;
  `regression_prediction` maps back);
- `pearson_loss`: 1 - Pearson r over a batch, the "correlation loss" some STS heads train with.
- `symmetric_kl` / `divergence`: the ℓ_s of SMART (Jiang et al. 2020), used by the smoothness
  term and the Bregman proximal point term: symmetric KL between the predicted distributions for
  classification, mean squared error for regression.

Everything is computed in at least float32, so these are safe to call on bf16 outputs under autocast.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from minbert.core.tasks import TASKS
from minbert.model.outputs import regression_target

DIVERGENCE_KINDS = ("classification", "binary", "regression")


# ---------------------------------------------------------------- task losses

def task_loss(task: str, heads, output: Tensor, labels: Tensor) -> Tensor:
    """The training loss of `task` for a batch of head outputs (any float dtype; computed in fp32)."""
    output = output.float()
    kind = TASKS[task].kind
    if kind == "classification":
        return F.cross_entropy(output, labels.long())
    if kind == "binary":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    target = regression_target(task, heads, labels.float())
    if heads.sts_loss == "mse":
        return F.mse_loss(output, target)
    if heads.sts_loss == "pearson":
        return pearson_loss(output, target)
    return F.mse_loss(output, target) + pearson_loss(output, target)


def _at_least_float32(x: Tensor) -> Tensor:
    """bf16/fp16 -> float32 (divergences of nearly equal outputs need the precision); float64 stays."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _as_vector(x: Tensor, name: str) -> Tensor:
    """(B,) or (B, 1) -> (B,), at least float32."""
    if x.dim() == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (B,) or (B, 1), got {tuple(x.shape)}")
    return _at_least_float32(x)


def distill_loss(task: str, heads, output: Tensor, labels: Tensor, soft: Tensor, weight: float,
                 temperature: float) -> Tensor:
    """(1 - weight) x the gold-label loss + weight x the loss against the teacher's outputs `soft`:
    for a classification task the KL divergence from the teacher's probabilities softened by the
    temperature T to the student's (times T^2, which keeps the gradients' scale as T changes); for a
    binary task the cross-entropy between the two softened sigmoids (times T^2); for a regression
    task the task's own loss against the teacher's scores. With weight 0 it is the gold-label loss."""
    gold = task_loss(task, heads, output, labels)
    out, soft, T = output.float(), soft.float(), float(temperature)
    kind = TASKS[task].kind
    if kind == "classification":
        target = F.softmax(torch.log(soft.clamp_min(1e-12)) / T, dim=-1)
        teacher = F.kl_div(F.log_softmax(out / T, dim=-1), target, reduction="batchmean") * T * T
    elif kind == "binary":
        p = soft.clamp(1e-6, 1 - 1e-6)
        target = torch.sigmoid((torch.log(p) - torch.log1p(-p)) / T)
        teacher = F.binary_cross_entropy_with_logits(out / T, target) * T * T
    else:
        teacher = task_loss(task, heads, output, soft)
    return (1.0 - weight) * gold + weight * teacher


def pearson_loss(pred: Tensor, target: Tensor, eps: float = 1e-8) -> Tensor:
    """1 - Pearson correlation between `pred` and `target` over the batch.

    Differentiable, and finite for constant inputs: `eps` inside the square roots keeps the
    gradient of the norms finite when a centred vector is all zeros (then r = 0, loss = 1).
    Pearson r ignores the scale and offset of `pred`, so a head trained only with this loss
    predicts scores that correlate with the labels but are not on their scale.
    """
    pred, target = _as_vector(pred, "pred"), _as_vector(target, "target")
    if pred.shape != target.shape:
        raise ValueError(f"pred and target lengths differ: {pred.shape[0]} vs {target.shape[0]}")
    pc = pred - pred.mean()
    tc = target - target.mean()
    r = (pc * tc).sum() / torch.sqrt(((pc * pc).sum() + eps) * ((tc * tc).sum() + eps))
    return 1.0 - r


def symmetric_kl(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(p||q) + KL(q||p) between softmax(p_logits) and softmax(q_logits), (B, C) each,
    summed over classes and averaged over the batch.

    Written as Σ_c (p_c - q_c)(log p_c - log q_c), which is the same sum but exactly zero when the
    logits are equal and free of 0·log 0 terms. Gradients flow into both arguments.
    """
    if p_logits.shape != q_logits.shape or p_logits.dim() != 2:
        raise ValueError(f"symmetric_kl needs two (B, C) tensors, got {tuple(p_logits.shape)} "
                         f"and {tuple(q_logits.shape)}")
    log_p = F.log_softmax(_at_least_float32(p_logits), dim=-1)
    log_q = F.log_softmax(_at_least_float32(q_logits), dim=-1)
    return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(-1).mean()


def divergence(a: Tensor, b: Tensor, kind: str) -> Tensor:
    """SMART's ℓ_s between two outputs of the same head, averaged over the batch.

    kind:
      - "classification": (B, C) logits, symmetric KL of the softmax distributions;
      - "binary": one logit per row, (B,) or (B, 1), read as a Bernoulli (sigmoid) and compared
        with symmetric KL as a 2-class distribution [1 - σ(a), σ(a)] = softmax([0, a]);
      - "regression": any shape, mean squared error.
    Zero when a == b.
    """
    if kind == "classification":
        return symmetric_kl(a, b)
    if kind == "binary":
        a, b = _as_vector(a, "a"), _as_vector(b, "b")
        zeros = torch.zeros_like(a)
        return symmetric_kl(torch.stack([zeros, a], -1), torch.stack([zeros, b], -1))
    if kind == "regression":
        if a.shape != b.shape:
            raise ValueError(f"regression outputs differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
        return F.mse_loss(_at_least_float32(a), _at_least_float32(b))
    raise ValueError(f"unknown divergence kind {kind!r}; use one of {', '.join(DIVERGENCE_KINDS)}")
