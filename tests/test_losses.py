"""Losses and divergences against independent references (scipy, numpy, closed forms)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch

from minbert.model.losses.pearson import pearson_loss
from minbert.train.losses import divergence, symmetric_kl

# ---------------------------------------------------------------- pearson_loss

@pytest.mark.parametrize("n", [2, 7, 64, 500])
def test_pearson_loss_matches_scipy(n):
    rng = np.random.default_rng(n)
    target = rng.uniform(0, 5, n)
    pred = 0.7 * target + rng.normal(0, 1.5, n)
    loss = pearson_loss(torch.tensor(pred), torch.tensor(target))
    assert loss.item() == pytest.approx(1 - scipy.stats.pearsonr(pred, target)[0], abs=1e-6)


def test_pearson_loss_accepts_column_vectors_and_float32():
    rng = np.random.default_rng(1)
    pred, target = rng.normal(size=32), rng.normal(size=32)
    loss = pearson_loss(torch.tensor(pred, dtype=torch.float32)[:, None],
                        torch.tensor(target, dtype=torch.float32))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(1 - scipy.stats.pearsonr(pred, target)[0], abs=1e-5)


def test_pearson_loss_extremes_and_invariances():
    t = torch.linspace(0, 5, 20, dtype=torch.float64)
    assert pearson_loss(t, t).item() == pytest.approx(0.0, abs=1e-9)
    assert pearson_loss(-t, t).item() == pytest.approx(2.0, abs=1e-9)
    # Pearson ignores affine rescaling of the prediction (a positive scale and any shift).
    x = torch.randn(20, dtype=torch.float64)
    assert pearson_loss(3 * x + 1, t).item() == pytest.approx(pearson_loss(x, t).item(), abs=1e-9)


def test_pearson_loss_gradient_matches_finite_differences():
    torch.manual_seed(0)
    pred = torch.randn(9, dtype=torch.float64, requires_grad=True)
    target = torch.randn(9, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda p: pearson_loss(p, target), (pred,))


@pytest.mark.parametrize("which", ["pred", "target", "both"])
def test_pearson_loss_finite_for_constant_inputs(which):
    pred = torch.full((8,), 2.5) if which in ("pred", "both") else torch.randn(8)
    target = torch.full((8,), 1.0) if which in ("target", "both") else torch.randn(8)
    pred.requires_grad_(True)
    loss = pearson_loss(pred, target)
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    assert torch.isfinite(pred.grad).all()


def test_pearson_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="lengths differ"):
        pearson_loss(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="shape"):
        pearson_loss(torch.zeros(3, 2), torch.zeros(3, 2))


# ---------------------------------------------------------------- symmetric KL / divergence

def _scipy_symmetric_kl(a: np.ndarray, b: np.ndarray) -> float:
    p, q = scipy.special.softmax(a, axis=-1), scipy.special.softmax(b, axis=-1)
    return float(np.mean(scipy.stats.entropy(p, q, axis=-1) + scipy.stats.entropy(q, p, axis=-1)))


def test_symmetric_kl_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 2, (16, 5)), rng.normal(0, 2, (16, 5))
    value = symmetric_kl(torch.tensor(a), torch.tensor(b)).item()
    assert value == pytest.approx(_scipy_symmetric_kl(a, b), rel=1e-10)
    # symmetric, and shift-invariant per row like softmax
    assert symmetric_kl(torch.tensor(b), torch.tensor(a)).item() == pytest.approx(value, rel=1e-12)
    assert symmetric_kl(torch.tensor(a + 3.0), torch.tensor(b)).item() == pytest.approx(value, rel=1e-9)


def test_symmetric_kl_gradient_flows_into_both_arguments():
    torch.manual_seed(0)
    a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(symmetric_kl, (a, b))


@pytest.mark.parametrize("kind,shape", [("classification", (6, 5)), ("binary", (6,)),
                                        ("binary", (6, 1)), ("regression", (6,)),
                                        ("regression", (6, 1))])
def test_divergence_is_exactly_zero_for_equal_outputs(kind, shape):
    a = torch.randn(shape) * 10
    assert divergence(a, a.clone(), kind).item() == 0.0


def test_binary_divergence_is_bernoulli_symmetric_kl():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 3, 12), rng.normal(0, 3, 12)
    # KL between Bernoullis with scipy, and the closed form (σ(a) - σ(b)) (a - b).
    p, q = scipy.special.expit(a), scipy.special.expit(b)
    P, Q = np.stack([1 - p, p], -1), np.stack([1 - q, q], -1)
    reference = np.mean(scipy.stats.entropy(P, Q, axis=-1) + scipy.stats.entropy(Q, P, axis=-1))
    value = divergence(torch.tensor(a), torch.tensor(b), "binary").item()
    assert value == pytest.approx(reference, rel=1e-9)
    assert value == pytest.approx(np.mean((p - q) * (a - b)), rel=1e-9)
    # (B, 1) heads give the same number
    col = divergence(torch.tensor(a)[:, None], torch.tensor(b)[:, None], "binary").item()
    assert col == pytest.approx(value, rel=1e-12)


def test_regression_divergence_is_mean_squared_error():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=10), rng.normal(size=10)
    assert divergence(torch.tensor(a), torch.tensor(b), "regression").item() == \
        pytest.approx(np.mean((a - b) ** 2), rel=1e-12)


def test_divergence_under_bf16_autocast_is_float32():
    torch.manual_seed(0)
    a32, b32 = torch.randn(8, 5), torch.randn(8, 5)
    lin = torch.nn.Linear(5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = lin(a32), lin(b32)
        assert a.dtype == torch.bfloat16
        for kind in ("classification", "regression"):
            value = divergence(a, b, kind)
            assert value.dtype == torch.float32
            # same as the float32 computation on the (bf16-rounded) outputs
            ref = divergence(a.float(), b.float(), kind)
            assert value.item() == pytest.approx(ref.item(), rel=1e-6)
        assert divergence(a[:, 0], b[:, 0], "binary").dtype == torch.float32


def test_divergence_rejects_unknown_kind_and_bad_shapes():
    with pytest.raises(ValueError, match="unknown divergence kind 'ranking'"):
        divergence(torch.zeros(2, 2), torch.zeros(2, 2), "ranking")
    with pytest.raises(ValueError, match=r"\(B, C\)"):
        divergence(torch.zeros(2, 3), torch.zeros(2, 4), "classification")
    with pytest.raises(ValueError, match="shape"):
        divergence(torch.zeros(2, 3), torch.zeros(2, 3), "binary")
    with pytest.raises(ValueError, match="shape"):
        divergence(torch.zeros(2), torch.zeros(3), "regression")
