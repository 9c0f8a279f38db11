"""Tensor shapes and precisions the losses share: a batch's scores as a vector, in at least float32."""
from __future__ import annotations

import torch
from torch import Tensor


def at_least_float32(x: Tensor) -> Tensor:
    """bf16/fp16 -> float32 (divergences and correlations of nearly equal values need the precision);
    float64 stays."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def as_vector(x: Tensor, name: str = "input") -> Tensor:
    """(B,) or (B, 1) -> (B,), at least float32."""
    if x.dim() == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (B,) or (B, 1), got {tuple(x.shape)}")
    return at_least_float32(x)
