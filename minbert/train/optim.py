"""Optimiser and learning-rate schedule: torch AdamW and a pure lr function."""
from __future__ import annotations

import math

import torch


def lr_at(step: int, total_steps: int, base_lr: float, warmup_steps: int, schedule: str = "linear") -> float:
    """Learning rate at `step` (0-based): linear warmup, then linear/cosine decay to 0, or constant."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    if schedule == "cosine":
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def build_adamw(named_groups: list[tuple[list[tuple[str, torch.nn.Parameter]], float]], weight_decay: float,
                betas=(0.9, 0.999), eps: float = 1e-6) -> torch.optim.AdamW:
    """AdamW over (named parameters, lr) groups; biases and LayerNorm weights get no weight decay.

    Each param group records its `base_lr` so the schedule can scale every group alike.
    """
    groups = []
    for named, lr in named_groups:
        decay = [p for n, p in named if p.requires_grad and p.ndim >= 2]
        no_decay = [p for n, p in named if p.requires_grad and p.ndim < 2]
        if decay:
            groups.append({"params": decay, "weight_decay": weight_decay, "lr": lr, "base_lr": lr})
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0, "lr": lr, "base_lr": lr})
    # the fused kernel (CPU and CUDA) does one pass over all parameters instead of a loop per tensor
    return torch.optim.AdamW(groups, betas=betas, eps=eps, fused=True)


def set_lr(optimizer: torch.optim.Optimizer, step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Apply the schedule to every group (each relative to its base_lr); returns the first group's lr."""
    first = None
    for g in optimizer.param_groups:
        g["lr"] = lr_at(step, total_steps, g["base_lr"], warmup_steps, schedule)
        first = g["lr"] if first is None else first
    return first
