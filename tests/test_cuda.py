"""The CUDA path, where a GPU is at hand (every test here is marked `cuda` and skips without one):
a resume is bit-identical to an uninterrupted run under `deterministic: true`, the masked-attention
backward is finite on every attention backend torch selects, the training step makes no host sync
(torch's own sync debug mode), the captured step (CUDA graphs, minbert.train.step) trains what the
uncaptured one trains, replays without a host sync and resumes, and two GPUs under torchrun follow
one; fp16 with its gradient scaler and gradient accumulation run uncaptured, saying why, and
accumulation trains what the whole batch in one captured step trains."""
from __future__ import annotations

import pytest
import torch
from conftest import child_env
from test_train import (
    assert_same_weights,
    fine_tune_once_and_under_torchrun,
    finetune_experiment,
    history,
    last_state,
    make_exp,
    state_dict,
    write_prepared,
)

import minbert.train.loop as train
from minbert.train.step import CapturedSteps

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=32)


@pytest.fixture
def deterministic_mode():
    """`deterministic: true` changes process-wide flags: put them back for the tests that follow."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
    torch.backends.cuda.enable_flash_sdp(before[3])
    torch.backends.cuda.enable_mem_efficient_sdp(before[4])


def cuda_exp(tiny_model_dir, **finetune):
    exp = make_exp(tiny_model_dir, **finetune)
    return exp.model_copy(update={"device": "cuda", "deterministic": True})


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_a_cuda_resume_is_bit_identical_under_deterministic(tiny_model_dir, prepared, tmp_path, deterministic_mode,
                                                            precision):
    exp = cuda_exp(tiny_model_dir, epochs=3).model_copy(update={"precision": precision})
    full = finetune_experiment(exp, prepared, tmp_path / "full")
    part = tmp_path / "part"
    finetune_experiment(exp, prepared, part, stop_after_epochs=1)
    state = torch.load(last_state(part), map_location="cpu", weights_only=True)
    assert state["cuda_rng"] is not None and state["description"]["runtime"]["device"] == "cuda"
    resumed = finetune_experiment(exp, prepared, part)
    assert resumed.best_dev == full.best_dev
    assert history(part).equals(history(tmp_path / "full"))
    assert_same_weights(state_dict(part / "model.pt"), state_dict(tmp_path / "full" / "model.pt"))


BACKENDS = ["MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_masked_attention_backward_is_finite_on_every_backend(backend, dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minbert.model.bert import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=128)).cuda()
    ids = torch.randint(1, 100, (4, 16), device="cuda")
    mask = torch.ones(4, 16, dtype=torch.long, device="cuda")
    mask[1, 5:] = 0
    mask[3, 1:] = 0             # one real token: a row of the attention that sees itself only
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)), torch.autocast("cuda", dtype=dtype,
                                                                     enabled=dtype != torch.float32):
            hidden, pooled = model(ids, mask)
            loss = hidden.float().pow(2).mean() + pooled.float().pow(2).mean()
        loss.backward()
    except RuntimeError as e:    # a backend this GPU / dtype / mask does not support: not selected by torch
        if "No available kernel" in str(e) or "not supported" in str(e).lower():
            pytest.skip(f"{backend} not available here: {str(e).splitlines()[0][:100]}")
        raise
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), name


def test_no_host_sync_in_the_cuda_training_step(tiny_model_dir, prepared, tmp_path, monkeypatch):
    real_step = train.train_step

    def strict(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real_step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(train, "train_step", strict)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=3, schedule="simultaneous", pcgrad=True,
                   smart={"enabled": True}).model_copy(update={"device": "cuda"})
    finetune_experiment(exp, prepared, tmp_path / "run")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_under_torchrun_follow_one(tiny_model_dir, tmp_path):
    a, b = fine_tune_once_and_under_torchrun(
        tmp_path, tiny_model_dir, {"device": "cuda", "precision": "fp32"}, child_env(),
        timeout=600, one_env={"CUDA_VISIBLE_DEVICES": "0"})
    ca, cb = (torch.load(p / "model.pt", map_location="cpu", weights_only=True) for p in (a, b))
    assert_same_weights(ca["state_dict"], cb["state_dict"], atol=1e-3)


def test_compile_trains_the_same_model_on_cuda(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=3, hidden_dropout=0.0, attention_dropout=0.0,
                   heads={"dropout": 0.0}).model_copy(update={"device": "cuda", "precision": "fp32"})
    plain = finetune_experiment(exp, prepared, tmp_path / "plain")
    compiled = finetune_experiment(exp.model_copy(update={"finetune": exp.finetune.model_copy(update={"compile": True})}),
                                   prepared, tmp_path / "compiled")
    a, b = state_dict(tmp_path / "plain" / "model.pt"), state_dict(tmp_path / "compiled" / "model.pt")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4, msg=lambda m: f"{k}: {m}")
    assert compiled.best_dev == pytest.approx(plain.best_dev, abs=1e-3)


NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "heads": {"dropout": 0.0}}


@pytest.fixture
def recorded_steps(monkeypatch):
    """The CapturedSteps each fit in the test makes (None where its steps run uncaptured)."""
    made = []
    real = train.start_run

    def recording(*args, **kwargs):
        tr, plan = real(*args, **kwargs)
        made.append(tr.captured)
        return tr, plan

    monkeypatch.setattr(train, "start_run", recording)
    return made


@pytest.mark.parametrize("precision,evals", [("fp32", 1), ("bf16", 1), ("fp32", 3)])
def test_the_captured_step_trains_what_the_uncaptured_step_trains(tiny_model_dir, prepared, tmp_path, recorded_steps,
                                                                   precision, evals):
    """evals 3: dev evaluated (eagerly, in eval mode) between replays within an epoch."""
    exp = make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=6, evals_per_epoch=evals, **NO_DROPOUT).model_copy(
        update={"device": "cuda", "precision": precision})
    captured = finetune_experiment(exp, prepared, tmp_path / "captured")
    plain = finetune_experiment(exp.model_copy(update={"cuda_graphs": False}), prepared, tmp_path / "plain")
    steps = recorded_steps[0]
    assert steps is not None and not steps.failed and recorded_steps[1] is None
    assert steps.shapes and all(s.graph is not None for s in steps.shapes.values())
    assert all(g is not None for g in steps.updates.values())
    a, b = state_dict(tmp_path / "captured" / "model.pt"), state_dict(tmp_path / "plain" / "model.pt")
    # padded against unpadded products (TF32 / bf16 rounding), the learning rate as a float32 tensor
    tol = {"fp32": (1e-2, 1e-3), "bf16": (5e-2, 5e-3)}[precision]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol[0], atol=tol[1], msg=lambda m: f"{k}: {m}")
    assert captured.best_epoch == plain.best_epoch
    for k, v in plain.best_dev.items():
        assert captured.best_dev[k] == pytest.approx(v, abs=0.05), k


def test_the_captured_step_replays_without_a_host_sync(tiny_model_dir, prepared, tmp_path, monkeypatch):
    """Once every shape has been captured (the first epoch), an update is replays and copies only."""
    replays = []
    real = CapturedSteps.step

    def strict(self, state, plan, batches, labels):
        if state.epoch >= 1:     # every shape of this run's batches was seen in the first epoch
            torch.cuda.set_sync_debug_mode("error")
            replays.append(1)
        try:
            return real(self, state, plan, batches, labels)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(CapturedSteps, "step", strict)
    exp = make_exp(tiny_model_dir, epochs=3, max_steps_per_epoch=None,
                   downsample={"mode": "fixed", "size": 24}).model_copy(update={"device": "cuda"})
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert replays


def test_a_captured_run_resumes_as_it_would_have_gone_on(tiny_model_dir, prepared, tmp_path, deterministic_mode):
    """Dropout on: the graphs draw from the CUDA generator at each replay, whose state the resumable
    state carries; a run stopped after one epoch and resumed (graphs captured anew) ends where the
    uninterrupted one does."""
    exp = cuda_exp(tiny_model_dir, epochs=3)
    full = finetune_experiment(exp, prepared, tmp_path / "full")
    part = tmp_path / "part"
    finetune_experiment(exp, prepared, part, stop_after_epochs=1)
    resumed = finetune_experiment(exp, prepared, part)
    assert resumed.best_epoch == full.best_epoch
    a, b = state_dict(part / "model.pt"), state_dict(tmp_path / "full" / "model.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")


def test_fp16_and_accumulation_run_uncaptured_and_accumulation_matches_the_captured_whole_batch(
        tiny_model_dir, prepared, tmp_path, caplog):
    ft = {"epochs": 1, "max_steps_per_epoch": 4, "batch_size": 8, "hidden_dropout": 0.0, "attention_dropout": 0.0,
          "heads": {"dropout": 0.0}}
    base = make_exp(tiny_model_dir, **ft).model_copy(update={"device": "cuda", "precision": "fp32"})
    whole = finetune_experiment(base, prepared, tmp_path / "whole")
    with caplog.at_level("INFO", logger="minbert.train.loop"):
        acc = finetune_experiment(make_exp(tiny_model_dir, gradient_accumulation_steps=2, **ft).model_copy(
            update={"device": "cuda", "precision": "fp32"}), prepared, tmp_path / "acc")
        half = finetune_experiment(base.model_copy(update={"precision": "fp16"}), prepared, tmp_path / "fp16")
    assert "gradient accumulation" in caplog.text and "gradient scaler" in caplog.text
    a, b = state_dict(tmp_path / "whole" / "model.pt"), state_dict(tmp_path / "acc" / "model.pt")
    for k in a:   # TF32 products and padded vs unpadded micro-batches: close, not equal
        torch.testing.assert_close(b[k], a[k], rtol=1e-3, atol=1e-4, msg=lambda m: f"{k}: {m}")
    assert acc.history["train_sst_loss"].tolist() == pytest.approx(whole.history["train_sst_loss"].tolist(), rel=1e-3)
    assert half.history["train_sst_loss"].tolist() == pytest.approx(whole.history["train_sst_loss"].tolist(), rel=3e-2)


def test_auto_is_bf16_on_a_gpu_with_it_and_fp16_without(monkeypatch, machine_auto):
    from minbert.core.runtime import precision_on

    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert precision_on("auto", torch.device("cuda")) == ("bf16" if native else "fp16")
