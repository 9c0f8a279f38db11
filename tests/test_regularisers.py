"""SMART (adversarial term, momentum copy, Bregman term) and PCGrad against hand-computed
results and independent reimplementations."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn

from minbert.model.bert import BertConfig, BertModel
from minbert.train.losses import divergence
from minbert.train.regularisers import (
    Ascent,
    MomentumModel,
    bregman_term,
    pcgrad_backward,
    pcgrad_project,
    smart_adversarial_loss,
)

# ---------------------------------------------------------------- helpers

class TinyClassifier(nn.Module):
    """A 1-layer, hidden-16 BERT with a linear head on [CLS]: `forward_embeds` is SMART's f."""

    def __init__(self, n_out: int, dropout: float = 0.0):
        super().__init__()
        cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=16,
                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        self.bert = BertModel(cfg)
        self.head = nn.Linear(16, n_out)

    def forward_embeds(self, embeds, attention_mask=None):
        hidden, _ = self.bert(inputs_embeds=embeds, attention_mask=attention_mask)
        return self.head(hidden[:, 0]).squeeze(-1)

    def forward(self, input_ids, attention_mask=None):
        return self.forward_embeds(self.bert.embeddings.word(input_ids), attention_mask)


def _batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, -2:] = 0
    return ids, mask


KINDS = [("classification", 5), ("binary", 1), ("regression", 1)]


# ---------------------------------------------------------------- SMART adversarial term

@pytest.mark.parametrize("kind,n_out", KINDS)
def test_smart_term_is_exactly_zero_at_zero_perturbation(kind, n_out):
    torch.manual_seed(0)
    model = TinyClassifier(n_out).eval()
    ids, mask = _batch()
    embeds = model.bert.embeddings.word(ids)
    clean = model.forward_embeds(embeds, mask)
    term = smart_adversarial_loss(lambda e: model.forward_embeds(e, mask), embeds, clean, kind,
                                  zero_perturbation=True)
    assert term.item() == 0.0
    term.backward()  # differentiable even there (its gradient is zero)
    assert all(torch.all(p.grad == 0) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("kind,n_out", KINDS)
def test_smart_term_is_positive_and_trains_the_model_through_both_outputs(kind, n_out):
    torch.manual_seed(0)
    model = TinyClassifier(n_out).eval()
    ids, mask = _batch()
    embeds = model.bert.embeddings.word(ids)
    clean = model.forward_embeds(embeds, mask)
    calls = []

    def forward_fn(e):
        calls.append(e.detach().clone())
        return model.forward_embeds(e, mask)

    term = smart_adversarial_loss(forward_fn, embeds, clean, kind, Ascent(steps=2, epsilon=1e-3),
                                  generator=torch.Generator().manual_seed(1))
    assert term.item() > 0 and torch.isfinite(term)
    assert len(calls) == 3                                  # two ascent steps, one final pass
    # the ascent took its gradients with autograd.grad: nothing has leaked into .grad yet
    assert all(p.grad is None for p in model.parameters())
    # the final perturbation lies in the ε-ball (inf-norm)
    assert (calls[-1] - embeds.detach()).abs().max().item() <= 1e-3 * (1 + 1e-5)
    term.backward()
    assert model.head.weight.grad.abs().sum() > 0
    assert model.bert.embeddings.word.weight.grad.abs().sum() > 0


def test_smart_clean_output_keeps_its_graph():
    """Gradient of the term = gradient through f(x + δ) + gradient through f(x): check the split by
    recomputing both halves by hand with the δ the function used."""
    torch.manual_seed(0)
    model = TinyClassifier(5).eval()
    ids, mask = _batch()
    embeds = model.bert.embeddings.word(ids).detach()
    clean = model.forward_embeds(embeds, mask)
    seen = []

    def forward_fn(e):
        seen.append(e.detach().clone())
        return model.forward_embeds(e, mask)

    term = smart_adversarial_loss(forward_fn, embeds, clean, "classification", Ascent(epsilon=1e-2),
                                  generator=torch.Generator().manual_seed(0))
    (g_term,) = torch.autograd.grad(term, model.head.weight)
    adv = model.forward_embeds(seen[-1], mask)
    clean2 = model.forward_embeds(embeds, mask)
    (g_adv,) = torch.autograd.grad(divergence(adv, clean2.detach(), "classification"), model.head.weight)
    (g_clean,) = torch.autograd.grad(divergence(adv.detach(), clean2, "classification"), model.head.weight)
    torch.testing.assert_close(g_term, g_adv + g_clean, rtol=1e-4, atol=1e-9)
    assert g_clean.abs().sum() > 0


def test_smart_one_step_finds_the_exact_maximum_for_a_linear_model():
    """f(x) = <x, w> per example with MSE: max over ||δ||_∞ ≤ ε of (δ·w)² is (ε ||w||₁)², reached
    at δ = ±ε sign(w). One normalised step with step_size ≫ ε gets there from any noise."""
    rng = np.random.default_rng(0)
    w = torch.tensor(rng.uniform(0.5, 1.0, (5, 3)) * rng.choice([-1, 1], (5, 3)))
    embeds = torch.tensor(rng.normal(size=(4, 5, 3)))

    def forward_fn(e):
        return (e * w).sum((1, 2))

    eps = 1e-5
    term = smart_adversarial_loss(forward_fn, embeds, forward_fn(embeds), "regression",
                                  Ascent(epsilon=eps, step_size=1e-3, noise_var=1e-5),
                                  generator=torch.Generator().manual_seed(0))
    assert term.item() == pytest.approx((eps * w.abs().sum().item()) ** 2, rel=1e-6)
    # with no ascent, the random start is (much) weaker
    start = smart_adversarial_loss(forward_fn, embeds, forward_fn(embeds), "regression",
                                   Ascent(steps=0, epsilon=eps),
                                   generator=torch.Generator().manual_seed(0))
    assert start.item() < term.item()


def test_smart_ascent_beats_random_perturbations_of_the_same_radius():
    torch.manual_seed(0)
    model = TinyClassifier(5).eval()
    ids, mask = _batch()
    embeds = model.bert.embeddings.word(ids).detach()
    clean = model.forward_embeds(embeds, mask).detach()
    eps = 1e-3
    adversarial = smart_adversarial_loss(lambda e: model.forward_embeds(e, mask), embeds, clean,
                                         "classification", Ascent(epsilon=eps, step_size=1e-2),
                                         generator=torch.Generator().manual_seed(0)).item()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        random_corners = [
            divergence(model.forward_embeds(embeds + eps * torch.randn(embeds.shape, generator=g).sign(),
                                            mask), clean, "classification").item()
            for _ in range(20)]
    assert adversarial > max(random_corners)


def test_smart_is_reproducible_with_a_generator():
    torch.manual_seed(0)
    model = TinyClassifier(1).eval()
    ids, mask = _batch()
    embeds = model.bert.embeddings.word(ids)
    clean = model.forward_embeds(embeds, mask)
    run = lambda seed: smart_adversarial_loss(lambda e: model.forward_embeds(e, mask), embeds, clean,
                                              "binary", Ascent(steps=0, epsilon=1e-2, noise_var=1e-2),
                                              generator=torch.Generator().manual_seed(seed)).item()
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_smart_under_bf16_autocast():
    torch.manual_seed(0)
    model = TinyClassifier(5)
    ids, mask = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeds = model.bert.embeddings.word(ids)
        clean = model.forward_embeds(embeds, mask)
        term = smart_adversarial_loss(lambda e: model.forward_embeds(e, mask), embeds, clean,
                                      "classification", Ascent(epsilon=1e-2))
    assert term.dtype == torch.float32 and torch.isfinite(term)
    term.backward()
    assert torch.isfinite(model.head.weight.grad).all()


# ---------------------------------------------------------------- momentum copy / Bregman term

def test_bregman_term_zero_at_start_grows_after_a_step_and_shrinks_after_update():
    torch.manual_seed(0)
    model = TinyClassifier(5).eval()   # dropout off: student and teacher comparable exactly
    teacher = MomentumModel(model, beta=0.5)
    ids, mask = _batch()
    assert bregman_term(model(ids, mask), teacher(ids, mask), "classification").item() == 0.0

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = nn.functional.cross_entropy(model(ids, mask), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    opt.step()
    opt.zero_grad()
    after_step = bregman_term(model(ids, mask), teacher(ids, mask), "classification")
    assert after_step.item() > 0
    after_step.backward()
    # the gradient reaches the student only; the teacher is frozen
    assert model.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in teacher.module.parameters())

    teacher.update(model)
    after_update = bregman_term(model(ids, mask), teacher(ids, mask), "classification").item()
    assert 0 < after_update < after_step.item()


def test_momentum_teacher_ema_arithmetic():
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(2.0)
    teacher = MomentumModel(model, beta=0.9)
    with torch.no_grad():
        model.weight.fill_(3.0)
        model.bias.fill_(-2.0)
    # the copy is deep: changing the student did not touch it
    assert torch.all(teacher.module.weight == 1.0)
    teacher.update(model)
    torch.testing.assert_close(teacher.module.weight, torch.full((2, 3), 0.9 * 1 + 0.1 * 3))
    torch.testing.assert_close(teacher.module.bias, torch.full((2,), 0.9 * 2 + 0.1 * -2))
    teacher.update(model)
    torch.testing.assert_close(teacher.module.weight, torch.full((2, 3), 0.9 * 1.2 + 0.1 * 3))
    torch.testing.assert_close(teacher.module.bias, torch.full((2,), 0.9 * 1.6 + 0.1 * -2))


def test_momentum_teacher_keeps_the_callers_mode_and_checks_beta():
    model = TinyClassifier(1, dropout=0.5).train()
    teacher = MomentumModel(model, beta=0.99)
    assert teacher.module.training            # not forced into eval()
    teacher.module.eval()
    assert not teacher.module.training and model.training
    with pytest.raises(ValueError, match="beta"):
        MomentumModel(model, beta=1.0)
    with pytest.raises(ValueError, match="differ"):
        teacher.update(nn.Linear(2, 2))


# ---------------------------------------------------------------- PCGrad: hand-computed cases

def _t(*rows):
    return [torch.tensor(r, dtype=torch.float64) for r in rows]


def test_pcgrad_conflicting_pair_by_hand():
    g1, g2 = _t([1.0, 0.0], [-1.0, 1.0])
    p1, p2 = pcgrad_project([g1, g2])
    # g1 - (g1·g2)/|g2|² g2 = (1, 0) + ½ (-1, 1);  g2 - (g2·g1)/|g1|² g1 = (-1, 1) + (1, 0)
    torch.testing.assert_close(p1, torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(p2, torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert torch.dot(p1, g2) >= 0 and torch.dot(p2, g1) >= 0


def test_pcgrad_leaves_non_conflicting_gradients_unchanged():
    grads = _t([1.0, 0.0, 2.0], [1.0, 1.0, 0.0], [0.0, 3.0, 1.0])
    for p, g in zip(pcgrad_project(grads, torch.Generator().manual_seed(0)), grads):
        assert torch.equal(p, g)


def test_pcgrad_order_matters_for_three_tasks_by_hand():
    grads = _t([2.0, 1.0, 0.0], [-1.0, -1.0, -2.0], [-2.0, -2.0, -2.0])
    identity_others = [[1, 2], [0, 2], [0, 1]]
    # task 0 against 1 then 2: (2,1,0) + ½(-1,-1,-2) = (1.5, .5, -1); ·g2 = -2 → + (2/12)(-2,-2,-2)
    first = pcgrad_project(grads, orders=identity_others)[0]
    torch.testing.assert_close(first, torch.tensor([7 / 6, 1 / 6, -4 / 3], dtype=torch.float64))
    # against 2 then 1: (2,1,0) + ½(-2,-2,-2) = (1, 0, -1); ·g1 = 1 ≥ 0 → stays
    second = pcgrad_project(grads, orders=[[2, 1], [0, 2], [0, 1]])[0]
    torch.testing.assert_close(second, torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64))


def _reference_pcgrad(grads: np.ndarray, orders) -> np.ndarray:
    """Straight from the algorithm of Yu et al. (2020), in numpy."""
    out = []
    for i, order in enumerate(orders):
        g = grads[i].copy()
        for j in order:
            if g @ grads[j] < 0:
                g = g - (g @ grads[j]) / (grads[j] @ grads[j]) * grads[j]
        out.append(g)
    return np.stack(out)


@pytest.mark.parametrize("n_tasks", [3, 4])
def test_pcgrad_matches_reference_over_all_orders(n_tasks):
    rng = np.random.default_rng(n_tasks)
    grads = rng.normal(size=(n_tasks, 6))
    grads[1] = -grads[0] + 0.3 * rng.normal(size=6)   # make sure some pairs conflict
    tensors = [torch.tensor(g) for g in grads]
    per_task_orders = [list(itertools.permutations([j for j in range(n_tasks) if j != i]))
                       for i in range(n_tasks)]
    possible = [set() for _ in range(n_tasks)]
    for orders in itertools.product(*per_task_orders):
        ours = torch.stack(pcgrad_project(tensors, orders=[list(o) for o in orders])).numpy()
        np.testing.assert_allclose(ours, _reference_pcgrad(grads, orders), rtol=1e-12, atol=1e-12)
        for i in range(n_tasks):
            possible[i].add(tuple(np.round(ours[i], 9)))
    # random orders from a seeded generator: reproducible, always one of the possible results,
    # and different seeds reach different results where the order matters
    reached = [set() for _ in range(n_tasks)]
    for seed in range(40):
        a = pcgrad_project(tensors, torch.Generator().manual_seed(seed))
        b = pcgrad_project(tensors, torch.Generator().manual_seed(seed))
        for i in range(n_tasks):
            assert torch.equal(a[i], b[i])
            key = tuple(np.round(a[i].numpy(), 9))
            assert key in possible[i]
            reached[i].add(key)
    assert any(len(possible[i]) > 1 for i in range(n_tasks))
    assert all(reached[i] == possible[i] for i in range(n_tasks))


def test_pcgrad_projected_conflicting_pair_no_longer_conflicts():
    g = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(50):
        a, b = torch.randn(10, generator=g, dtype=torch.float64), torch.randn(10, generator=g, dtype=torch.float64)
        if torch.dot(a, b) >= 0:
            continue
        pa, pb = pcgrad_project([a, b])
        assert torch.dot(pa, b) >= -1e-12 and torch.dot(pb, a) >= -1e-12
        checked += 1
    assert checked > 10


def test_pcgrad_rejects_bad_orders():
    grads = _t([1.0, 0.0], [0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="permutation"):
        pcgrad_project(grads, orders=[[1, 1], [0, 2], [0, 1]])


# ---------------------------------------------------------------- PCGrad: backward on a model

class TwoHeads(nn.Module):
    """Shared trunk, one head per task; task 1 also uses an extra layer task 0 never touches."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 3)
        self.head0 = nn.Linear(3, 1)
        self.head1 = nn.Linear(3, 1)
        self.extra1 = nn.Linear(3, 3)

    def task_loss(self, task, x, y):
        h = torch.tanh(self.trunk(x))
        out = self.head0(h) if task == 0 else self.head1(torch.tanh(self.extra1(h)))
        return nn.functional.mse_loss(out.squeeze(-1), y)


def _two_task_losses(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, x1 = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    # opposite targets make the trunk's gradients conflict
    y0, y1 = x0.sum(1), -x1.sum(1)
    return [model.task_loss(0, x0, y0), model.task_loss(1, x1, y1)]


def test_pcgrad_backward_equals_project_of_manual_gradients():
    torch.manual_seed(0)
    model = TwoHeads()
    params = list(model.parameters())
    manual = []
    for loss in _two_task_losses(model):
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        manual.append(torch.cat([(torch.zeros_like(p) if gr is None else gr).reshape(-1)
                                 for p, gr in zip(params, grads)]))
    expected = sum(pcgrad_project(manual, torch.Generator().manual_seed(5)))

    for p in params:
        p.grad = torch.ones_like(p)   # an existing gradient is accumulated onto
    stats = pcgrad_backward(_two_task_losses(model), params, torch.Generator().manual_seed(5))
    got = torch.cat([(p.grad - 1).reshape(-1) for p in params])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)

    # parameters a task does not use count as zero gradient for that task
    # (order: trunk 12 + 3, head0 3 + 1, head1 3 + 1, extra1 9 + 3)
    assert torch.all(manual[1][15:19] == 0)             # head0 in task 1's gradient
    assert torch.all(manual[0][19:] == 0)               # head1, extra1 in task 0's gradient
    assert manual[0][15:19].abs().sum() > 0 and manual[1][19:].abs().sum() > 0
    dot = float(torch.dot(manual[0], manual[1]))
    assert stats["conflicts"] == int(dot < 0)
    cos = dot / float(manual[0].norm() * manual[1].norm())
    assert stats["cosines"][0][1] == pytest.approx(cos, rel=1e-5)
    assert stats["cosines"][0][0] == pytest.approx(1.0, rel=1e-6)
    assert stats["norms"][1] == pytest.approx(float(manual[1].norm()), rel=1e-5)


def test_pcgrad_backward_reports_conflicts_and_sets_fresh_grads():
    torch.manual_seed(0)
    model = TwoHeads()
    losses = _two_task_losses(model)
    stats = pcgrad_backward(losses, list(model.parameters()))
    assert stats["conflicts"] == 1                      # opposite targets: the tasks conflict
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_pcgrad_backward_frees_each_graph():
    torch.manual_seed(0)
    model = TwoHeads()
    losses = _two_task_losses(model)
    pcgrad_backward(losses, list(model.parameters()))
    for loss in losses:
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()


def test_pcgrad_backward_with_a_shared_graph_needs_retain_graph():
    torch.manual_seed(0)
    model = TwoHeads()
    x = torch.randn(8, 4)
    h = torch.tanh(model.trunk(x))          # one forward pass feeds both heads

    def losses():
        return [model.head0(h).pow(2).mean(), -model.head1(h).pow(2).mean()]

    with pytest.raises(RuntimeError, match="second time"):
        pcgrad_backward(losses(), list(model.parameters()))
    h = torch.tanh(model.trunk(x))
    shared = losses()
    pcgrad_backward(shared, list(model.parameters()), retain_graph=True)
    assert model.trunk.weight.grad is not None
    with pytest.raises(RuntimeError, match="second time"):   # freed after the last task
        shared[0].backward()


def test_pcgrad_backward_skips_frozen_parameters():
    torch.manual_seed(0)
    model = TwoHeads()
    model.trunk.requires_grad_(False)
    pcgrad_backward(_two_task_losses(model), list(model.parameters()))
    assert model.trunk.weight.grad is None and model.head0.weight.grad is not None


def test_smart_perturbation_gradient_under_bf16_autocast_is_the_float32_one(minilm_dir):
    """ε = 1e-5 is below bf16's resolution: computed under bf16 autocast, the ascent would follow
    rounding noise (cosine about 0.2 with the float32 gradient on MiniLM). The term runs in float32
    whatever the autocast, so the gradients agree."""
    from minbert.model.multitask import MultitaskModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder
    from minbert.params import HeadsParams

    encoder, _, folder = load_encoder(str(minilm_dir))
    torch.manual_seed(0)
    model = MultitaskModel(encoder, HeadsParams(), ["sst"]).eval()     # dropout off: deterministic passes
    tok = Tokenizer(folder, 64)
    batch = tok.pad(tok.encode(["a gripping , funny and moving film .", "dull , flat and far too long .",
                                "it is not a bad movie , just an unremarkable one ."]))

    def ascent_gradient(bf16: bool) -> torch.Tensor:
        grads = []
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out, word = model("sst", batch, return_embeddings=True)
            term = smart_adversarial_loss(lambda e: model("sst", batch, inputs_embeds=e), word, out, "classification",
                                          generator=torch.Generator().manual_seed(3), ascent_grads=grads)
        assert term.dtype == torch.float32 and torch.isfinite(term)
        return grads[0].flatten()

    fp32, bf16 = ascent_gradient(False), ascent_gradient(True)
    assert fp32.abs().max() > 0
    assert torch.nn.functional.cosine_similarity(fp32, bf16, dim=0) > 0.99
