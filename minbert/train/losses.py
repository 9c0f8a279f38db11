"""Losses and output divergences shared by the heads and the regularisers.

- `task_loss`: each task's training loss, the loss object its heads settings choose by name from
  the registry in use (minbert.core.registry: cross-entropy, BCE, MSE, Pearson, MSE+Pearson,
  ranking, or the user's), on the labels in the head's target space (minbert.model.outputs:
  `regression_target` scales a regression's labels; `regression_prediction` maps back); its output is
  checked on its first call (`CheckedLoss`);
- `distill_loss`: the gold-label loss mixed with a loss against a teacher's outputs;
- `symmetric_kl` / `divergence`: the ℓ_s of SMART (Jiang et al. 2020), used by the smoothness
  term and the Bregman proximal point term: symmetric KL between the predicted distributions for
  classification, mean squared error for regression.

Everything is computed in at least float32, so these are safe to call on bf16 outputs under autocast.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from minbert.core.errors import MinBertError
from minbert.core.registry import LossDeclaration, Registry, active
from minbert.core.tasks import TASKS
from minbert.model.blocks import reaches
from minbert.model.outputs import regression_target
from minbert.model.vectors import as_vector, at_least_float32

DIVERGENCE_KINDS = ("classification", "binary", "regression")


# ---------------------------------------------------------------- task losses

class CheckedLoss:
    """A loss object of the registry whose output is checked on its first calls, as the contract
    says (docs/extending.md): a 0-dim floating tensor, carrying a gradient when its inputs do. A loss
    that breaks it is one line naming its module and class (a Python float would train nothing, a
    vector would fail deep in the backward pass). Its type, shape and its graph only: no host
    sync, and nothing more once each has been seen. Carrying a gradient means reaching the model: the
    loss's graph leads back to the head's output (or the pair's vectors), which `requires_grad` alone
    does not tell (a fresh leaf tensor requires a gradient and trains nothing)."""

    def __init__(self, decl: LossDeclaration, loss):
        self.decl, self.loss = decl, loss
        self.checked, self.checked_grad = False, False

    def __call__(self, output: Tensor, target: Tensor, pair=None) -> Tensor:
        out = self.loss(output, target, pair)
        if not self.checked_grad:
            self._check(out, [x for x in (output, *(pair or ())) if isinstance(x, Tensor) and x.requires_grad])
        return out

    def _check(self, out, inputs: list[Tensor]) -> None:
        if not self.checked:
            if not isinstance(out, Tensor) or out.dim() != 0 or not out.is_floating_point():
                what = type(out).__name__ if not isinstance(out, Tensor) else \
                    f"a tensor of shape {tuple(out.shape)}, {str(out.dtype).removeprefix('torch.')}"
                raise MinBertError(f"{self.decl.where}: loss '{self.decl.name}' returned {what}; it must return one "
                                   f"number as a 0-dim float tensor computed from its inputs (a mean over the "
                                   f"batch) (docs/extending.md)")
            self.checked = True
        if inputs and torch.is_grad_enabled():
            if not reaches(out, inputs):
                raise MinBertError(f"{self.decl.where}: loss '{self.decl.name}' returned a tensor that carries no "
                                   f"gradient to the model (computed outside the graph: .item(), .detach(), numpy, a "
                                   f"new tensor); compute it from `output` with torch operations (docs/extending.md)")
            self.checked_grad = True


@lru_cache(maxsize=None)
def _checked(decl: LossDeclaration, registry: Registry) -> CheckedLoss:
    return CheckedLoss(decl, registry.loss(decl.name))


def loss_object(name: str, registry: Registry | None = None) -> CheckedLoss:
    """The loss named `name` of `registry` (default: the one in use), checked on its first calls."""
    registry = registry or active()
    return _checked(registry.losses[name], registry)


def task_loss(task: str, heads, output: Tensor, labels: Tensor, pair=None) -> Tensor:
    """The training loss of `task` for a batch of head outputs (any float dtype; computed in fp32);
    `pair`: the pair's two embeddings, for a loss that reads them."""
    target = regression_target(task, heads, labels.float()) if TASKS[task].kind == "regression" else labels
    return loss_object(heads.loss_of(task))(output.float(), target, pair)


def distill_loss(task: str, heads, output: Tensor, labels: Tensor, soft: Tensor, distill, pair=None) -> Tensor:
    """(1 - weight) x the gold-label loss + weight x the loss against the teacher's outputs `soft`
    (`distill`: the distillation settings, minbert.params.DistillParams: `weight`, `temperature`):
    for a classification task the KL divergence from the teacher's probabilities softened by the
    temperature T to the student's (times T^2, which keeps the gradients' scale as T changes); for a
    binary task the cross-entropy between the two softened sigmoids (times T^2); for a regression
    task the task's own loss against the teacher's scores. With weight 0 it is the gold-label loss."""
    gold = task_loss(task, heads, output, labels, pair)
    weight, out, soft, T = distill.weight, output.float(), soft.float(), float(distill.temperature)
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


def symmetric_kl(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(p||q) + KL(q||p) between softmax(p_logits) and softmax(q_logits), (B, C) each,
    summed over classes and averaged over the batch.

    Written as Σ_c (p_c - q_c)(log p_c - log q_c), which is the same sum but exactly zero when the
    logits are equal and free of 0·log 0 terms. Gradients flow into both arguments.
    """
    if p_logits.shape != q_logits.shape or p_logits.dim() != 2:
        raise ValueError(f"symmetric_kl needs two (B, C) tensors, got {tuple(p_logits.shape)} "
                         f"and {tuple(q_logits.shape)}")
    log_p = F.log_softmax(at_least_float32(p_logits), dim=-1)
    log_q = F.log_softmax(at_least_float32(q_logits), dim=-1)
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
        a, b = as_vector(a, "a"), as_vector(b, "b")
        zeros = torch.zeros_like(a)
        return symmetric_kl(torch.stack([zeros, a], -1), torch.stack([zeros, b], -1))
    if kind == "regression":
        if a.shape != b.shape:
            raise ValueError(f"regression outputs differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
        return F.mse_loss(at_least_float32(a), at_least_float32(b))
    raise ValueError(f"unknown divergence kind {kind!r}; use one of {', '.join(DIVERGENCE_KINDS)}")
