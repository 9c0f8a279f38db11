"""The optimiser against torch.optim.AdamW(fused=True): the same numbers to the bit, the same state
format (each loads the other's), parameters without a gradient left alone, a subset updated with
learning rates given as tensors (what the captured CUDA step does), and no compiler stack loaded."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import child_env

from minbert.train.optim import build_adamw, lr_at, set_lr


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _groups(model, lr_a=1e-2, lr_b=3e-3):
    named = list(model.named_parameters())
    return [(named[:2], lr_a), (named[2:], lr_b)]


def _train(model, opt, steps: int, skip_last_every: int = 0, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if skip_last_every and step % skip_last_every == 0:   # the last layer gets no gradient this step
            out = model[1](model[0](x))
        out.pow(2).sum().backward()
        for i, group in enumerate(opt.param_groups):
            group["lr"] = group["base_lr"] * (0.9 ** step)
        opt.step()


def _torch_adamw(model) -> torch.optim.AdamW:
    ours = build_adamw(_groups(model), weight_decay=0.05)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"], "lr": g["lr"], "base_lr": g["base_lr"]}
              for g in ours.param_groups]
    return torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=1e-6, fused=True)


@pytest.mark.parametrize("skip", [0, 3])
def test_the_same_updates_as_torch_to_the_bit(skip):
    a, b = _model(), _model()
    ours, theirs = build_adamw(_groups(a), weight_decay=0.05), _torch_adamw(b)
    _train(a, ours, 7, skip)
    _train(b, theirs, 7, skip)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    mine, torch_state = ours.state_dict(), theirs.state_dict()
    assert mine["state"].keys() == torch_state["state"].keys()
    for k, s in mine["state"].items():
        assert s.keys() == torch_state["state"][k].keys()
        for name, v in s.items():
            assert torch.equal(v, torch_state["state"][k][name]) and v.dtype == torch_state["state"][k][name].dtype
    assert [g["params"] for g in mine["param_groups"]] == [g["params"] for g in torch_state["param_groups"]]


def test_each_loads_the_others_state_and_goes_on_alike():
    a, b = _model(), _model()
    ours, theirs = build_adamw(_groups(a), weight_decay=0.05), _torch_adamw(b)
    _train(a, ours, 3)
    _train(b, theirs, 3)
    # swap the states: each optimiser goes on from the other's
    fresh_ours, fresh_theirs = build_adamw(_groups(a), weight_decay=0.05), _torch_adamw(b)
    fresh_ours.load_state_dict(theirs.state_dict())
    fresh_theirs.load_state_dict(ours.state_dict())
    _train(a, fresh_ours, 4, seed=2)
    _train(b, fresh_theirs, 4, seed=2)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="other parameter groups"):
        build_adamw([(list(a.named_parameters()), 1e-3)], 0.0).load_state_dict(ours.state_dict())


@pytest.mark.parametrize("tensor_lrs", [False, True])
def test_a_subset_equals_a_step_without_the_others_gradients(tensor_lrs):
    a, b = _model(), _model()
    ours, other = build_adamw(_groups(a), weight_decay=0.05), build_adamw(_groups(b), weight_decay=0.05)
    x = torch.randn(4, 6)
    for model in (a, b):
        model(x).pow(2).sum().backward()
    trained = set(list(a.parameters())[:4])
    grads = {p: p.grad for p in a.parameters()}
    # learning rates as float32 tensors (what a replayed CUDA graph reads) round the float lr
    lrs = [torch.tensor(g["lr"], dtype=torch.float32) for g in ours.param_groups] if tensor_lrs else None
    ours.step(params=trained, grads=grads, lrs=lrs)
    for p in list(b.parameters())[4:]:
        p.grad = None
    other.step()
    for p, q in zip(a.parameters(), b.parameters()):
        if tensor_lrs:
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)
        else:
            assert torch.equal(p, q)
    assert len(ours.state) == 4 and len(other.state) == 4
    assert torch.equal(list(a.parameters())[4], list(b.parameters())[4])    # untouched: exactly as it was


def test_lr_schedule_and_groups():
    assert lr_at(0, 10, 1.0, 2) == 0.5 and lr_at(1, 10, 1.0, 2) == 1.0 and lr_at(10, 10, 1.0, 2) == 0.0
    assert lr_at(6, 10, 1.0, 2, "cosine") == pytest.approx(0.5) and lr_at(9, 10, 1.0, 2, "constant") == 1.0
    opt = build_adamw(_groups(_model()), weight_decay=0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0, 0.1, 0.0]   # no decay for biases, norms
    assert set_lr(opt, 5, 10, 0, "linear") == pytest.approx(0.005)
    assert opt.param_groups[2]["lr"] == pytest.approx(0.0015)


def test_making_and_stepping_it_loads_no_compiler():
    code = ("import sys, torch; from minbert.train.optim import build_adamw\n"
            "m = torch.nn.Linear(3, 2); o = build_adamw([(list(m.named_parameters()), 1e-3)], 0.01)\n"
            "m(torch.randn(2, 3)).sum().backward(); o.step(); o.state_dict()\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout
