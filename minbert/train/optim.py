"""Optimiser and learning-rate schedule: AdamW over torch's fused kernel, and a pure lr function.

`AdamW` is `torch.optim.AdamW(fused=True)` without its class: the same fused kernel
(`torch.optim.adamw.adamw`, one pass over all parameters), the same state (`exp_avg`, `exp_avg_sq`
and a float32 `step` per parameter, on its device) and the same `state_dict` format, so the numbers
are torch's to the bit (tests/test_optim.py). The class itself is left out because creating any
`torch.optim.Optimizer` imports torch's compiler stack (dynamo, sympy: about 2 s) on the way to a
job's first update, for nothing a job here uses. `step(params)` updates a subset (the captured step
of minbert.train.step updates the parameters one set of tasks trains), with learning rates given
as device tensors where a CUDA graph replays it.
"""
from __future__ import annotations

import math

import torch
from torch.optim.adamw import adamw


def lr_at(step: int, total_steps: int, base_lr: float, warmup_steps: int, schedule: str = "linear") -> float:
    """Learning rate at `step` (0-based) of one schedule of `total_steps` updates: linear warm-up over its
    first `warmup_steps`, then linear or cosine decay to 0 at its end, or constant. A fine-tuning run
    runs one such schedule per phase, `step` counting the phase's updates (minbert.train.training.Plan)."""
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


class AdamW:
    """AdamW with decoupled weight decay, fused (see the module docstring). `param_groups` and
    `state` are torch.optim's: a list of dicts (`params`, `lr`, `betas`, `eps`, `weight_decay`, ...)
    and parameter -> its state."""

    def __init__(self, groups: list[dict], betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        defaults = {"betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
                    "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                    "fused": True, "decoupled_weight_decay": True}
        self.param_groups = [{**defaults, **g, "params": list(g["params"])} for g in groups]
        if not any(g["params"] for g in self.param_groups):
            raise ValueError("optimizer got an empty parameter list")
        self.state: dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def state_of(self, p: torch.Tensor) -> dict:
        """A parameter's state, started as torch.optim.AdamW(fused=True) starts it."""
        state = self.state.get(p)
        if not state:
            state = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state

    @torch.no_grad()
    def step(self, params=None, grads: dict | None = None, lrs: list | None = None) -> None:
        """Update every parameter that has a gradient (or those of `params`, a set, with gradients
        from `grads`, parameter -> tensor); `lrs`: each group's learning rate as a tensor, instead of
        its `lr` (a captured step reads them from the device)."""
        for i, g in enumerate(self.param_groups):
            if params is None:
                mine = [p for p in g["params"] if p.grad is not None]
                gs = [p.grad for p in mine]
            else:
                mine = [p for p in g["params"] if p in params]
                gs = [grads[p] if grads is not None else p.grad for p in mine]
            if not mine:
                continue
            states = [self.state_of(p) for p in mine]
            beta1, beta2 = g["betas"]
            adamw(mine, gs, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
                  [s["step"] for s in states], fused=True, amsgrad=False, beta1=beta1, beta2=beta2,
                  lr=g["lr"] if lrs is None else lrs[i], weight_decay=g["weight_decay"], eps=g["eps"],
                  maximize=False)

    def state_dict(self) -> dict:
        """torch.optim's format: parameters numbered in group order."""
        index, groups = {}, []
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        by_id = {id(p): p for g in self.param_groups for p in g["params"]}
        state = {index[i]: dict(self.state[by_id[i]]) for i in index if by_id[i] in self.state}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, saved: dict) -> None:
        """The state and group settings of `state_dict`, onto this optimiser's parameters."""
        groups = saved["param_groups"]
        if len(groups) != len(self.param_groups) or \
                any(len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("the saved optimiser state has other parameter groups")
        params = [p for g in self.param_groups for p in g["params"]]
        ids = [i for g in groups for i in g["params"]]
        self.state = {}
        for p, i in zip(params, ids):
            if i in saved["state"]:
                self.state[p] = {k: (v.to(device=p.device, dtype=torch.float32) if k == "step" else
                                     v.to(device=p.device, dtype=p.dtype)) for k, v in saved["state"][i].items()}
        for mine, theirs in zip(self.param_groups, groups):
            mine.update({k: v for k, v in theirs.items() if k != "params"})


def build_adamw(named_groups: list[tuple[list[tuple[str, torch.nn.Parameter]], float]], weight_decay: float,
                betas=(0.9, 0.999), eps: float = 1e-6) -> AdamW:
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
    return AdamW(groups, betas=betas, eps=eps)


def set_lr(optimizer: AdamW, step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Apply the schedule to every group (each relative to its base_lr); returns the first group's lr."""
    first = None
    for g in optimizer.param_groups:
        g["lr"] = lr_at(step, total_steps, g["base_lr"], warmup_steps, schedule)
        first = g["lr"] if first is None else first
    return first
