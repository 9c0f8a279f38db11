"""The precision setting (auto | bf16 | fp16 | fp32): resolved per device, honoured everywhere, recorded in
run.json, part of the resume fingerprint with the device type; the old `bf16` key says what
replaced it; SMART's perturbation in float32 under bf16 autocast."""
from __future__ import annotations

import os

import pytest
import torch
import yaml
from test_train import finetune_experiment, make_exp, write_prepared

from minbert.core import runtime
from minbert.core.errors import MinBertError
from minbert.params import load_params

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("native,setting,expected", [
    (True, "auto", "bf16"), (False, "auto", "fp32"), (None, "auto", "fp32"),
    (False, "bf16", "bf16"), (True, "fp32", "fp32"), (False, "fp32", "fp32"), (False, "fp16", "fp16")])
def test_precision_on_a_cpu(monkeypatch, machine_auto, native, setting, expected):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    assert runtime.precision_on(setting, CPU) == expected


@pytest.mark.parametrize("supported,setting,expected", [
    (True, "auto", "bf16"), (False, "auto", "fp16"), (True, "fp32", "fp32"), (False, "bf16", "bf16"),
    (True, "fp16", "fp16")])
def test_precision_on_cuda(monkeypatch, machine_auto, supported, setting, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert runtime.precision_on(setting, CUDA) == expected


def test_fp32_on_cuda_multiplies_in_tf32(monkeypatch, machine_auto):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert runtime.configure(CUDA, "fp32") is False        # bf16 off on CUDA means off
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert runtime.configure(CUDA, "auto") is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_the_old_bf16_key_says_what_replaced_it(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"base": {"bf16": True}, "experiments": {"a": {}}}), encoding="utf-8")
    with pytest.raises(MinBertError) as err:
        load_params(path)
    msg = str(err.value)
    assert "\n" not in msg and "'base.bf16'" in msg and "precision: bf16" in msg and "precision: auto" in msg


def test_a_state_saved_in_another_precision_is_not_resumed(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """Same settings (precision: auto) resolved differently, e.g. a state from a CPU without native
    bf16 met on a GPU: the run starts fresh and says why."""
    data = write_prepared(tmp_path / "data", n_train=16, n_dev=16)
    exp = make_exp(tiny_model_dir, epochs=2, max_steps_per_epoch=2, tasks=["sst"])
    out = tmp_path / "run"
    monkeypatch.setattr(runtime, "configure_precision", lambda device, precision, deterministic=False: "fp32")
    finetune_experiment(exp, data, out, stop_after_epochs=1)
    state = torch.load(out.with_name("run.state") / "last.pt", map_location="cpu", weights_only=True)
    assert state["description"]["runtime"] == {"device": "cpu", "precision": "fp32", "world": 1}
    monkeypatch.setattr(runtime, "configure_precision", lambda device, precision, deterministic=False: "bf16")
    with caplog.at_level("WARNING", logger="minbert.train.training"):
        res = finetune_experiment(exp, data, out)
    notice = [r.getMessage() for r in caplog.records if "another configuration" in r.getMessage()]
    assert len(notice) == 1 and "runtime.precision: 'fp32' -> 'bf16'" in notice[0]
    assert len(res.history) == 2


def test_deterministic_pins_the_algorithms_and_runs_on_cpu(tiny_model_dir, tmp_path, monkeypatch):
    """`deterministic: true` runs (no op of the step lacks a deterministic kernel) and sets torch's
    deterministic mode, cuDNN without autotuning and a fixed cuBLAS workspace."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, \
        torch.backends.cudnn.benchmark
    data = write_prepared(tmp_path / "data", n_train=16, n_dev=16)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=3, schedule="simultaneous", pcgrad=True,
                   smart={"enabled": True}).model_copy(update={"deterministic": True})
    try:
        a = finetune_experiment(exp, data, tmp_path / "a")
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        b = finetune_experiment(exp, data, tmp_path / "b")
        assert a.best_dev == b.best_dev
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


@pytest.mark.parametrize("forced", ["bf16", "fp16", "fp32"])
def test_what_auto_means_can_be_set_for_a_machine(monkeypatch, forced):
    """MINBERT_AUTO_PRECISION says what `auto` picks (CI runs the bf16 path on CPUs that emulate it);
    an explicit precision is untouched, and a value other than bf16 / fp16 / fp32 is one line."""
    monkeypatch.setenv("MINBERT_AUTO_PRECISION", forced)
    for native in (True, False):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
        assert runtime.precision_on("auto", CPU) == forced
        assert runtime.precision_on("fp32", CPU) == "fp32" and runtime.precision_on("bf16", CPU) == "bf16"
    monkeypatch.setenv("MINBERT_AUTO_PRECISION", "fp8")
    with pytest.raises(MinBertError, match=r"MINBERT_AUTO_PRECISION=fp8: expected bf16, fp16 or fp32") as err:
        runtime.precision_on("auto", CPU)
    assert "\n" not in str(err.value)


def test_the_tests_fix_what_auto_means():
    """tests/conftest.py fixes `auto` for every test and every process a test starts (what the
    machine resolves unless the environment says otherwise; .ci/run's second pass says the other
    precision for the tests of numbers), so a session is one precision throughout."""
    from conftest import AUTO_PRECISION

    assert os.environ["MINBERT_AUTO_PRECISION"] == AUTO_PRECISION and AUTO_PRECISION in ("bf16", "fp16", "fp32")
    assert runtime.precision_on("auto", CPU) == AUTO_PRECISION


def test_a_test_that_compares_with_a_tolerance_is_a_test_of_numbers(request):
    """Unmarked, this test compares floats with a tolerance, so tests/conftest.py marks it `numbers`
    and .ci/run's second pass runs it with the other precision as `auto`; a test that compares
    exactly is left to the first pass."""
    from conftest import _compares_with_tolerance

    assert 0.1 + 0.2 == pytest.approx(0.3)
    assert request.node.get_closest_marker("numbers") is not None
    assert not _compares_with_tolerance(type("Item", (), {"function": test_precision_on_cuda})())
