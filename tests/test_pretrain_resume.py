"""Masked-LM and NLI pretraining resume exactly, as fine-tuning does (tests/test_interrupts.py): a
pretraining stage killed (SIGKILL) after its first epoch's state was saved, run again, ends with
weights and history bit-identical to an uninterrupted run; a state saved under other settings is
not resumed, and says what changed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import child_env
from test_pretrain_stage import prepared, results_with  # noqa: F401  (the module-scoped data fixture)

from minbert.model.weights import load_encoder

QUICK = {"epochs": 3, "batch_size": 16, "lr": 1.0e-3, "warmup_ratio": 0.1, "max_steps_per_epoch": 6, "dev_size": 32}
PRETRAININGS = {
    "mlm": {"kind": "mlm", **QUICK, "mlm": {"tasks": ["sst", "para"]}},
    "nli": {"kind": "nli", **QUICK, "nli": {"objective": "contrastive"}},
}


@pytest.fixture(scope="module")
def params_file(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml.safe_dump({
        "base": {"model": str(tiny_model_dir), "max_length": 32, "device": "cpu", "seed": 3, "threads": 1},
        "pretrainings": PRETRAININGS,
        "experiments": {"a": {"pretrain": "mlm"}}}), encoding="utf-8")
    return path


def stage(params_file: Path, results: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "stages.pretrain", "--params", str(params_file), "--results", str(results),
            "--name", name]


def environment(repo_root: Path) -> dict:
    return child_env(repo_root, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")


def outputs(results: Path, name: str) -> tuple[dict, bytes]:
    """The pretrained weights (encoder and, for MLM, its head) and history.csv's bytes."""
    encoder, head, _ = load_encoder(results / "pretrain" / name / "model")
    return ({**encoder.state_dict(), **{f"head.{k}": v for k, v in head.items()}},
            (results / "pretrain" / name / "history.csv").read_bytes())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRETRAININGS))
def test_a_killed_pretraining_resumes_bit_identical(params_file, prepared, tmp_path, repo_root, name):  # noqa: F811
    env = environment(repo_root)
    reference = results_with(prepared, tmp_path / "reference")
    done = subprocess.run(stage(params_file, reference, name), cwd=repo_root, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    results = results_with(prepared, tmp_path / "killed")
    state = results / "state" / "pretrain" / name
    proc = subprocess.Popen(stage(params_file, results, name), cwd=repo_root, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (state / "last.pt").is_file():
        assert proc.poll() is None, f"the pretraining ended before it saved a state:\n{proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "no state saved within 2 minutes"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (results / "pretrain" / name / "model").exists(), "the pretraining finished before it was killed"
    saved = torch.load(state / "last.pt", map_location="cpu", weights_only=True)
    assert saved["state"]["epoch"] == 1 and len(saved["state"]["history"]) == 1 and (state / "best.pt").is_file()

    again = subprocess.run(stage(params_file, results, name), cwd=repo_root, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {state / 'last.pt'} at epoch 1" in again.stderr, again.stderr[-3000:]
    assert "dev loss before training" not in again.stderr          # measured once, kept in the state
    assert not state.exists(), "the state folder outlived the finished pretraining"

    got_weights, got_history = outputs(results, name)
    want_weights, want_history = outputs(reference, name)
    assert got_history == want_history and got_history.count(b"\n") == 4
    assert got_weights.keys() == want_weights.keys()
    assert all(torch.equal(got_weights[k], want_weights[k]) for k in want_weights)
    assert (results / "pretrain" / name / "metrics.json").read_bytes() == \
        (reference / "pretrain" / name / "metrics.json").read_bytes()


def pretrain_in_process(tiny_model_dir, lr: float, state_dir, evals: int = 1) -> tuple[list, dict]:
    """Two epochs of MLM through `train` on 24 texts, dev evaluated `evals` times an epoch: (history,
    encoder weights)."""
    import minbert.train.pretrain as pretrain
    from minbert.core.runtime import Runtime
    from minbert.model.tokenizer import Tokenizer
    from minbert.params import PretrainParams
    from minbert.params.settings import PretrainSettings
    from minbert.train.mlm import MlmObjective, build_mlm_head

    torch.manual_seed(0)
    encoder, _, folder = load_encoder(tiny_model_dir)
    tok = Tokenizer(folder, 32)
    texts = tok.encode([f"sentence number {i} about a film" for i in range(24)])
    head, _ = build_mlm_head(encoder, None)
    objective = MlmObjective(encoder, head, tok, texts, texts[:8], 0.15, 1)
    pp = PretrainParams(kind="mlm", epochs=2, batch_size=8, lr=lr, warmup_ratio=0.0, evals_per_epoch=evals)
    s = PretrainSettings(model=str(tiny_model_dir), seed=1, max_length=32, pretraining=pp, device="cpu")
    history, _ = pretrain.train(objective, pp, s, Runtime(torch.device("cpu"), bf16=False), "mlm",
                                pretrain.ResumeAt(state_dir))
    return history, encoder.state_dict()


def test_evaluations_within_an_epoch_add_history_rows_and_change_no_update(tiny_model_dir):
    """Dev evaluated 3 times an epoch (the training check's curve of a short pretraining): a row at
    each third of an epoch, and at each epoch's end the dev loss of the run evaluated once an epoch
    (the same updates: evaluating draws from its own generator)."""
    once, _ = pretrain_in_process(tiny_model_dir, 1e-3, None)
    thrice, _ = pretrain_in_process(tiny_model_dir, 1e-3, None, evals=3)
    assert [r["epoch"] for r in thrice] == [0.3333, 0.6667, 1, 1.3333, 1.6667, 2]
    assert [r["dev_loss"] for r in thrice if r["epoch"] in (1, 2)] == [r["dev_loss"] for r in once]


def test_a_state_of_other_settings_is_not_resumed(tiny_model_dir, tmp_path, caplog):
    """In process, through `train`: a state left by a run with another learning rate is ignored
    with fine-tuning's one-line notice, and the run equals a fresh one."""
    state_dir = tmp_path / "state"
    pretrain_in_process(tiny_model_dir, 1e-3, state_dir)
    assert (state_dir / "last.pt").is_file()           # epoch 1's, left for the caller to remove
    with caplog.at_level("INFO", logger="minbert.train.pretrain"):
        history, weights = pretrain_in_process(tiny_model_dir, 2e-3, state_dir)
    notices = [r.getMessage() for r in caplog.records if "another configuration" in r.getMessage()]
    assert len(notices) == 1 and "settings.pretraining.lr: 0.001 -> 0.002" in notices[0], notices
    assert "\n" not in notices[0] and not any("resuming" in r.getMessage() for r in caplog.records)
    fresh_history, fresh_weights = pretrain_in_process(tiny_model_dir, 2e-3, None)
    assert history == fresh_history and all(torch.equal(weights[k], fresh_weights[k]) for k in weights)


def test_a_state_without_its_best_weights_is_not_resumed(tiny_model_dir, tmp_path, caplog):
    state_dir = tmp_path / "state"
    pretrain_in_process(tiny_model_dir, 1e-3, state_dir)
    (state_dir / "best.pt").write_bytes(b"\x00truncated")
    with caplog.at_level("INFO", logger="minbert.train.pretrain"):
        history, weights = pretrain_in_process(tiny_model_dir, 1e-3, state_dir)
    assert any("cannot be resumed (best.pt:" in r.getMessage() and "starting fresh" in r.getMessage()
               for r in caplog.records)
    assert not any("resuming" in r.getMessage() for r in caplog.records)
    fresh_history, fresh_weights = pretrain_in_process(tiny_model_dir, 1e-3, None)
    assert history == fresh_history and all(torch.equal(weights[k], fresh_weights[k]) for k in weights)
