"""Real interruptions of a running pipeline: Ctrl-C (SIGINT) and SIGKILL sent to the engine's
process group while a fine-tune is in its second epoch. The next run of the same engine resumes
the fine-tune from its last finished epoch (the resumable state lives outside the declared
outputs, so the engine's clean-up of an incomplete job leaves it alone) and ends with a model
bit-identical to an uninterrupted run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import child_env, default_signals
from test_workflow import DVC, SNAKEMAKE, make_copy, run

MODEL = "results/experiments/a/finetune/model.pt"
STATE = "results/state/finetune/a/last.pt"


def slow_params(model: str) -> dict:
    """One experiment whose fine-tune takes several seconds (five epochs), so it can be interrupted."""
    return {
        "data": {"dir": "data/demo", "nli_file": None},
        "base": {"model": model, "device": "cpu", "threads": 1, "max_length": 32, "predict_batch_size": 64,
                 "finetune": {"epochs": 5, "batch_size": 8, "max_steps_per_epoch": 30,
                              "downsample": {"mode": "fixed", "size": 240}}},
        "experiments": {"a": {}},
        "studies": [{"name": "s", "title": "one", "experiments": ["a"]}],
    }


def weights(folder: Path) -> dict:
    return torch.load(folder / MODEL, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def reference(repo_root, tmp_path_factory, tiny_model_dir):
    """The uninterrupted run's model."""
    if SNAKEMAKE is None:
        pytest.skip("snakemake is not installed")
    folder = make_copy(repo_root, tmp_path_factory.mktemp("ref") / "repo", tiny_model_dir,
                       slow_params("models/tiny"))
    run([SNAKEMAKE, "--cores", "1", MODEL], folder)
    return weights(folder)


def interrupt_when_training(cmd: list[str], folder: Path, sig: int) -> None:
    """Start `cmd` in its own process group; once the fine-tune has saved its state after an epoch,
    send `sig` to the whole group (what Ctrl-C in a terminal, or the OOM killer, does)."""
    proc = subprocess.Popen(cmd, cwd=folder, start_new_session=True, preexec_fn=default_signals, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    deadline = time.monotonic() + 600
    while not (folder / STATE).is_file():
        assert proc.poll() is None, f"{cmd} ended before the fine-tune saved a state:\n{proc.stdout.read().decode()[-3000:]}"
        assert time.monotonic() < deadline, "no state saved within 10 minutes"
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=120)
    assert not (folder / MODEL).exists(), "the fine-tune finished before the interruption"
    assert (folder / STATE).is_file(), "the resumable state did not survive the interruption"


def resumed(folder: Path) -> bool:
    log = folder / "results" / "logs" / "finetune" / "a.log"
    return "resuming from results/state/finetune/a/last.pt" in (log.read_text() if log.is_file() else "")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_snakemake_interrupted_run_resumes_bit_identical(repo_root, tmp_path, tiny_model_dir, reference, sig):
    folder = make_copy(repo_root, tmp_path / "repo", tiny_model_dir, slow_params("models/tiny"))
    interrupt_when_training([SNAKEMAKE, "--profile", "profiles/default", "--cores", "1", MODEL], folder, sig)
    if sig == signal.SIGKILL:      # a killed Snakemake leaves its lock, as after a crash
        run([SNAKEMAKE, "--unlock"], folder)
    out = run([SNAKEMAKE, "--profile", "profiles/default", "--cores", "1", MODEL], folder)
    assert resumed(folder), out[-3000:]
    got = weights(folder)
    assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
    assert not (folder / "results" / "state" / "finetune" / "a").exists()


@pytest.mark.slow
@pytest.mark.skipif(DVC is None, reason="dvc is not installed")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_dvc_interrupted_repro_resumes_bit_identical(repo_root, tmp_path, tiny_model_dir, reference, sig):
    folder = make_copy(repo_root, tmp_path / "repo", tiny_model_dir, slow_params("models/tiny"))
    run(["git", "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "copy"], folder)
    interrupt_when_training([DVC, "repro", "finetune-a"], folder, sig)
    out = run([DVC, "repro", "finetune-a"], folder)
    assert "resuming from results/state/finetune/a/last.pt" in out, out[-3000:]
    got = weights(folder)
    assert all(torch.equal(got[k], reference[k]) for k in got)


@pytest.mark.slow
def test_a_run_killed_in_another_folder_resumes_under_snakemake_and_a_hand_run_elsewhere_keeps_it(
        repo_root, tmp_path, tiny_model_dir, reference):
    """Issue 51: the working folder was part of a job's identity (its code named relative to it from
    inside the project, absolute from elsewhere), so a killed hand run resumed in the project started
    afresh ("saved for another configuration (code .../minbert/core/__init__.py added ...)") and a
    finished one ran again from another folder. The fine-tune started by hand from one folder and
    killed resumes under Snakemake in the project, bit-identical to an uninterrupted run; the same
    hand command from a third folder then finds it done."""
    folder = tmp_path / "repo"
    params = slow_params(str(folder / "models" / "tiny"))
    params["data"]["dir"] = str(folder / "data" / "demo")
    make_copy(repo_root, folder, tiny_model_dir, params)
    env = {**child_env(folder), "PYTHONDONTWRITEBYTECODE": "1"}
    by_hand = ["--params", str(folder / "params.yaml"), "--results", str(folder / "results")]
    elsewhere, third = tmp_path / "elsewhere", tmp_path / "third"
    elsewhere.mkdir()
    third.mkdir()
    r = subprocess.run([sys.executable, "-m", "stages.prepare", *by_hand], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    finetune = [sys.executable, "-m", "stages.finetune", "--experiment", "a", *by_hand]
    proc = subprocess.Popen(finetune, cwd=elsewhere, env=env, start_new_session=True, preexec_fn=default_signals,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (folder / STATE).is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "the fine-tune saved no state"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    assert not (folder / MODEL).exists() and (folder / STATE).is_file()
    out = run([SNAKEMAKE, "--profile", "profiles/default", "--cores", "1", MODEL], folder)
    log = (folder / "results/logs/finetune/a.log").read_text()
    assert resumed(folder) and "another configuration" not in log, (log + out)[-3000:]
    got = weights(folder)
    assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
    made = (folder / MODEL).stat().st_mtime_ns
    r = subprocess.run(finetune, cwd=third, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "finetune@a: up to date" in r.stderr, r.stderr[-3000:]
    assert (folder / MODEL).stat().st_mtime_ns == made
