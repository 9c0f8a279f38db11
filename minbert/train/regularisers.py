"""Regularisers for multi-task fine-tuning: SMART and PCGrad.

SMART (Jiang et al. 2020) adds two terms to the task loss L(θ):

    λ_s · R_s(θ),  R_s = 1/n Σ_i max_{||x̃_i - x_i||_∞ ≤ ε} ℓ_s(f(x̃_i; θ), f(x_i; θ))
    μ · D_Breg(θ, θ̃_t),  D_Breg = 1/n Σ_i ℓ_s(f(x_i; θ), f(x_i; θ̃_t))

where x are the word embeddings, ℓ_s is `minbert.train.losses.divergence`, the inner max is
approximated by a few steps of normalised projected gradient ascent from x + noise
(`smart_adversarial_loss`), and θ̃_t is a momentum (EMA) copy of the parameters
(`MomentumModel`, `bregman_term`).

PCGrad (Yu et al. 2020) projects each task's gradient onto the normal plane of every other task's
gradient it conflicts with (negative dot product), in a random order, and sums the results
(`pcgrad_project`, `pcgrad_backward`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from minbert.train.losses import divergence

# ---------------------------------------------------------------- SMART: smoothness term

def _per_example_inf_norm(x: Tensor) -> Tensor:
    """max |x| over every dimension but the first, shaped to broadcast against x."""
    return x.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True)


@dataclass(frozen=True)
class Ascent:
    """SMART's inner maximisation: `steps` normalised gradient steps of `step_size` within an
    infinity-norm box of radius `epsilon`, from Gaussian noise of scale `noise_var` (the name and
    its use as a standard deviation follow the reference implementation, mt-dnn's `adv_noise_var`)."""
    step_size: float = 1e-3
    epsilon: float = 1e-5
    noise_var: float = 1e-5
    steps: int = 1


def smart_adversarial_loss(forward_fn: Callable[[Tensor], Tensor], embeds: Tensor, clean_out: Tensor, kind: str,
                           ascent: Ascent = Ascent(), *, generator: torch.Generator | None = None,
                           zero_perturbation: bool = False, ascent_grads: list | None = None) -> Tensor:
    """SMART's smoothness-inducing adversarial term ℓ_s(f(x + δ), f(x)) for one batch.

    forward_fn: maps word embeddings shaped like `embeds` (B, T, H) to the head's output
        (shaped like `clean_out`); the model adds positions and token types itself.
    embeds: the word embeddings the clean pass used.
    clean_out: f(embeds), with its graph.
    kind: "classification" | "binary" | "regression" (see `minbert.train.losses.divergence`).
    ascent: the inner maximisation (`Ascent`): each step takes δ ← Π_ε(δ + step_size · g / ||g||_∞),
        with g = ∇_δ ℓ_s (clean output held fixed), ||·||_∞ per example and Π_ε clamping to [-ε, ε].
    generator: draws the starting noise, on its own device (the model's: no copy to the device).
    zero_perturbation: evaluate at δ = 0 (no noise, no ascent); the term is then exactly zero
        when forward_fn is deterministic (dropout off), which tests use.
    ascent_grads: when a list, each ascent step's gradient g is appended to it (for inspection).

    Precision: δ (ε = 1e-5 by default) is far below bf16's resolution (about 4e-3 relative), so
    under bf16 autocast the perturbed pass would round x + δ back to x and the ascent would follow
    rounding noise. The term is therefore computed in float32 whatever the autocast: with autocast
    on, the clean output is recomputed in float32 (with its graph) and every pass of this term runs
    with autocast off.

    The ascent only needs ∇_δ: it runs on detached embeddings and a detached clean output, takes
    the gradient with `torch.autograd.grad` and frees each graph immediately. The returned term
    is differentiable with respect to the model through both f(x + δ) and f(x) (`clean_out` is
    not detached), as in the reference implementations; δ itself is a constant.
    """
    device_type = embeds.device.type
    low_precision = torch.is_autocast_enabled(device_type)
    with torch.autocast(device_type, enabled=False):
        embeds = embeds if embeds.dtype in (torch.float32, torch.float64) else embeds.float()
        if low_precision:   # the reference output in float32 too, or the term measures bf16 rounding
            clean_out = forward_fn(embeds)
        if zero_perturbation:
            delta = torch.zeros_like(embeds)
        else:
            delta = _ascend(forward_fn, embeds.detach(), clean_out.detach(), kind, ascent, generator, ascent_grads)
        return divergence(forward_fn(embeds + delta), clean_out, kind)


def _ascend(forward_fn, x: Tensor, target: Tensor, kind: str, ascent: Ascent, generator, ascent_grads) -> Tensor:
    """The perturbation δ the inner maximisation reaches from noise (a constant: detached)."""
    noise_device = generator.device if generator is not None else x.device
    noise = torch.randn(x.shape, generator=generator, device=noise_device, dtype=x.dtype).to(x.device)
    delta = (noise * ascent.noise_var).clamp(-ascent.epsilon, ascent.epsilon)
    for _ in range(ascent.steps):
        delta.requires_grad_(True)
        with torch.enable_grad():
            adv_loss = divergence(forward_fn(x + delta), target, kind)
            (grad,) = torch.autograd.grad(adv_loss, delta)
        # Overflow must not poison δ: non-finite entries take no step.
        grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
        if ascent_grads is not None:
            ascent_grads.append(grad)
        direction = grad / (_per_example_inf_norm(grad) + 1e-12)
        delta = (delta.detach() + ascent.step_size * direction).clamp(-ascent.epsilon, ascent.epsilon)
    return delta.detach()


# ---------------------------------------------------------------- SMART: Bregman proximal point

class MomentumModel:
    """A frozen copy θ̃ of a model, updated as an exponential moving average of its parameters:
    θ̃ ← β·θ̃ + (1 - β)·θ. It is the θ̃_t of SMART's momentum Bregman proximal point term.

    `module` is the copy. Its train/eval mode is the caller's to set (it starts in the mode the
    model had); SMART compares the model and its momentum copy in the same mode.
    """

    def __init__(self, model: nn.Module, beta: float):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self.module = copy.deepcopy(model)
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """θ̃ ← β·θ̃ + (1 - β)·θ for every parameter; buffers are copied as they are."""
        averaged = dict(self.module.named_parameters())
        current = dict(model.named_parameters())
        if averaged.keys() != current.keys():
            raise ValueError("MomentumModel.update: the model's parameters differ from the copy's")
        for name, p in averaged.items():
            p.lerp_(current[name].detach().to(p.dtype), 1.0 - self.beta)
        current_buffers = dict(model.named_buffers())
        for name, b in self.module.named_buffers():
            b.copy_(current_buffers[name])

    @torch.no_grad()
    def __call__(self, *args, **kwargs):
        """Run the copy without building a graph."""
        return self.module(*args, **kwargs)


def bregman_term(out: Tensor, momentum_out: Tensor, kind: str) -> Tensor:
    """D_Breg for one batch: ℓ_s(f(x; θ), f(x; θ̃)); gradients flow into the model only, not its momentum copy."""
    return divergence(out, momentum_out.detach(), kind)


# ---------------------------------------------------------------- PCGrad

def pcgrad_coefficients(dots: Tensor, orders: list[list[int]]) -> Tensor:
    """PCGrad's projections as coefficients: row i holds c_i with g_i^PC = Σ_k c_ik g_k.

    dots: the (n, n) Gram matrix g_i · g_j of the original gradients; orders[i]: the order in
    which task i meets the others. Each projection g ← g - (g · g_j) / ||g_j||² · g_j only needs
    g · g_j, which the coefficients give from the Gram matrix (g · g_j = Σ_k c_k (g_k · g_j)): the
    whole projection is a few operations on n × n numbers, read by the host never (no device sync
    per pair, as `if dot < 0` would be)."""
    n = dots.shape[0]
    eye = torch.eye(n, dtype=dots.dtype, device=dots.device)
    sq_norms = dots.diagonal().clamp_min(torch.finfo(dots.dtype).tiny)
    rows = []
    for i in range(n):
        c = eye[i].clone()
        for j in orders[i]:
            dot = c @ dots[:, j]
            c = c - torch.where(dot < 0, dot / sq_norms[j], torch.zeros_like(dot)) * eye[j]
        rows.append(c)
    return torch.stack(rows) if rows else dots.new_zeros(0, 0)


def _gram(grads: list[Tensor]) -> Tensor:
    n = len(grads)
    dots = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            dots[i][j] = dots[j][i] = torch.dot(grads[i], grads[j]).double()
    return torch.stack([torch.stack(row) for row in dots]) if n else torch.zeros(0, 0, dtype=torch.float64)


def pcgrad_orders(n: int, generator: torch.Generator | None = None, orders: list[list[int]] | None = None) -> list[list[int]]:
    """The order in which each of n tasks meets the others: `orders` checked, or drawn with `generator`."""
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        if orders is not None:
            order = list(orders[i])
            if sorted(order) != others:
                raise ValueError(f"pcgrad_project: orders[{i}] must be a permutation of {others}")
        else:
            device = generator.device if generator is not None else "cpu"
            perm = torch.randperm(len(others), generator=generator, device=device).tolist()
            order = [others[k] for k in perm]
        out.append(order)
    return out


def pcgrad_project(grads: list[Tensor], generator: torch.Generator | None = None,
                   orders: list[list[int]] | None = None) -> list[Tensor]:
    """Project conflicting task gradients (PCGrad, Yu et al. 2020).

    grads: one flat gradient vector per task, all the same shape.
    For each task i, for every other task j in a random order (drawn with `generator`, or given
    by `orders[i]`, a permutation of the other task indices), if g_i · g_j < 0 then
    g_i ← g_i - (g_i · g_j) / ||g_j||² · g_j, where g_i is task i's gradient as projected so far
    and g_j task j's original gradient. Returns the projected gradients; the update is their sum.
    The order matters when three or more gradients conflict. (Computed from the Gram matrix:
    `pcgrad_coefficients`.)
    """
    n = len(grads)
    if n and any(g.shape != grads[0].shape for g in grads):
        raise ValueError("pcgrad_project: the gradients differ in shape")
    coefs = pcgrad_coefficients(_gram(grads), pcgrad_orders(n, generator, orders))
    return [_combine(grads, coefs[i]) for i in range(n)]


def _combine(grads: list[Tensor], coefs: Tensor) -> Tensor:
    """Σ_k coefs[k] · grads[k], in the gradients' dtype."""
    coefs = coefs.to(grads[0].dtype)
    out = grads[0] * coefs[0]
    for k in range(1, len(grads)):
        out.add_(grads[k] * coefs[k])
    return out


def _flat_grad(loss: Tensor, params: list[nn.Parameter], retain_graph: bool) -> Tensor:
    """One task's gradient as a flat vector; parameters it does not use get zeros."""
    if not loss.requires_grad:
        return torch.cat([torch.zeros_like(p).reshape(-1) for p in params])
    grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=retain_graph)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                      for p, g in zip(params, grads)])


def pcgrad_backward(losses: list[Tensor], params: list[nn.Parameter],
                    generator: torch.Generator | None = None, *, retain_graph: bool = False,
                    world: int = 1, with_stats: bool = True, orders: list[list[int]] | None = None) -> dict:
    """Backward pass with PCGrad: writes Σ_i projected g_i into p.grad (adding to any existing grad).

    Each task's gradient is taken with `torch.autograd.grad` and its graph freed at once, so only
    one task's graph is alive at a time when the losses come from separate forward passes. Pass
    `retain_graph=True` when the losses share a graph (one forward pass feeding several heads);
    the shared graph is then freed after the last task. Parameters that do not require grad are
    skipped. `orders` (see `pcgrad_project`) may be drawn beforehand with `pcgrad_orders`, where the
    host has time. Under torch.distributed (`world` > 1) each task's gradient is averaged over the ranks
    before the projection, so N processes project the gradients one process would (the result is
    then the same on every rank). Returns statistics of the original gradients: `conflicts`, the
    number of task pairs with a negative dot product, `cosines`, their pairwise cosine similarities
    (n × n nested list), and `norms`; with `with_stats=False` nothing (reading them on the host
    would wait for the device).
    """
    if not losses:
        raise ValueError("pcgrad_backward: no losses")
    params = [p for p in params if p.requires_grad]
    flats = []
    for i, loss in enumerate(losses):
        keep = retain_graph and i < len(losses) - 1
        flats.append(_flat_grad(loss, params, keep))
    if world > 1:   # project the global task gradients (what one process would see), not each rank's own
        for f in flats:
            dist.all_reduce(f)
            f /= world
    n = len(flats)
    dots = _gram(flats)
    coefs = pcgrad_coefficients(dots, pcgrad_orders(n, generator, orders))
    total = _combine(flats, coefs.sum(0))      # Σ_i g_i^PC, without materialising each of them
    del flats
    for p, g in zip(params, total.split([p.numel() for p in params])):
        g = g.view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.add_(g)
    if not with_stats:
        return {}
    norms = dots.diagonal().clamp_min(0).sqrt()
    cosines = dots / (norms[:, None] * norms[None, :]).clamp_min(1e-12)
    conflicts = sum(bool(dots[i, j] < 0) for i in range(n) for j in range(i + 1, n))
    return {"conflicts": conflicts, "cosines": cosines.tolist(), "norms": norms.tolist()}
