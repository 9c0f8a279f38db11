"""workflow.gpu_slot gives each concurrent job GPUs of its own (real processes, emulated GPUs: the
visible devices come from CUDA_VISIBLE_DEVICES), makes a job wait while every GPU is taken, and
runs the command as it is where no GPU is visible."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import child_env

from workflow import gpu_slot

SHOW = [sys.executable, "-c", "import os, sys, time; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'none'), "
                              "flush=True); time.sleep(float(sys.argv[1]))"]


def wrapped(tmp_path, visible, seconds, count=1, per_gpu=1):
    env = child_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.Popen([sys.executable, "-m", "workflow.gpu_slot", "--count", str(count), "--per-gpu",
                             str(per_gpu), "--lock-dir",
                             str(tmp_path / "locks"), "--", *SHOW, str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_concurrent_jobs_get_their_own_gpus_and_wait_for_a_free_one(tmp_path):
    first, second = wrapped(tmp_path, "4,7", 3), wrapped(tmp_path, "4,7", 3)
    devices = {first.stdout.readline().strip(), second.stdout.readline().strip()}
    assert devices == {"4", "7"}
    t0 = time.monotonic()
    third = wrapped(tmp_path, "4,7", 0)          # both taken: waits until one is free
    got = third.stdout.readline().strip()
    assert got in {"4", "7"} and time.monotonic() - t0 > 1.0
    for p in (first, second, third):
        assert p.wait(timeout=30) == 0


def test_no_gpu_runs_the_command_as_it_is(tmp_path):
    p = wrapped(tmp_path, "", 0)
    assert p.stdout.readline().strip() == "" and p.wait(timeout=30) == 0
    assert wrapped(tmp_path, "0", 0, count=2).wait(timeout=30) == 2     # more GPUs asked than visible


def test_jobs_share_a_gpu_up_to_the_slots_it_has(tmp_path):
    """Two slots on one GPU: two jobs run on it at once, a third waits for one of them."""
    first, second = wrapped(tmp_path, "0", 3, per_gpu=2), wrapped(tmp_path, "0", 3, per_gpu=2)
    assert first.stdout.readline().strip() == "0" and second.stdout.readline().strip() == "0"
    t0 = time.monotonic()
    third = wrapped(tmp_path, "0", 0, per_gpu=2)
    assert third.stdout.readline().strip() == "0" and time.monotonic() - t0 > 1.0
    for p in (first, second, third):
        assert p.wait(timeout=30) == 0


def test_a_shared_gpu_takes_another_job_only_while_its_memory_allows(tmp_path, monkeypatch):
    """The memory guard: a GPU that runs a job already gives its second slot only while nvidia-smi
    reports enough free memory; the first job on a GPU is never held back by it."""
    import threading

    from workflow import gpu_slot

    free = {"0": 1000}
    monkeypatch.setattr(gpu_slot, "free_memory_mb", lambda: dict(free))
    lock_dir = tmp_path / "locks"
    held, files = gpu_slot.acquire(["0"], 1, lock_dir, per_gpu=2, min_free_mb=4000, poll=0.05)
    assert held == ["0"]                                     # the first: memory is not asked
    got = []
    waiter = threading.Thread(target=lambda: got.append(gpu_slot.acquire(["0"], 1, lock_dir, per_gpu=2,
                                                                        min_free_mb=4000, poll=0.05)))
    waiter.start()
    time.sleep(0.5)
    assert not got                                           # 1000 MB free: it waits
    free["0"] = 9000
    waiter.join(timeout=10)
    assert got and got[0][0] == ["0"]
    for f in files + got[0][1]:
        f.close()


def fake_mps(tmp_path, monkeypatch, probe_ok: bool) -> tuple[Path, Path]:
    """A `nvidia-cuda-mps-control` on PATH that records how it was called (and what it was told on
    stdin), and a `python` whose first CUDA client succeeds or fails."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\necho \"$* pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> {calls}\n"
                       f"[ -t 0 ] || cat >> {calls}\nexit 0\n")
    probe = bin_dir / "probe-python"
    probe.write_text(f"#!/bin/sh\necho probe >> {calls}\nexit {0 if probe_ok else 1}\n")
    for f in (control, probe):
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return probe, calls


def test_jobs_sharing_a_gpu_become_clients_of_one_mps_server_started_once(tmp_path, monkeypatch):
    probe, calls = fake_mps(tmp_path, monkeypatch, probe_ok=True)
    locks = tmp_path / "locks"
    env = gpu_slot.mps_env(locks, python=str(probe))
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(locks / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(locks / "mps-log")}
    assert gpu_slot.mps_env(locks, python=str(probe)) == env            # the second job finds it running
    assert calls.read_text().splitlines() == [f"-d pipe={locks / 'mps-pipe'}", "probe"]


def test_an_mps_server_that_cannot_serve_is_stopped_and_jobs_share_by_time_slices(tmp_path, monkeypatch):
    probe, calls = fake_mps(tmp_path, monkeypatch, probe_ok=False)
    locks = tmp_path / "locks"
    assert gpu_slot.mps_env(locks, python=str(probe)) == {}
    assert gpu_slot.mps_env(locks, python=str(probe)) == {}             # remembered: not tried again
    lines = calls.read_text().splitlines()
    assert lines[:2] == [f"-d pipe={locks / 'mps-pipe'}", "probe"] and "quit" in lines and lines.count("probe") == 1


def test_no_mps_control_no_mps(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_slot.mps_env(tmp_path / "locks") == {}


def test_jobs_share_a_gpu_by_time_slices_unless_mps_is_asked_for(tmp_path, monkeypatch):
    """Time slices are the default (the faster in bench/gpu_sharing.py's measurement on an H200);
    `--mps on` or MINBERT_MPS=1 makes the job an MPS client."""
    ran = []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(gpu_slot, "free_memory_mb", dict)
    monkeypatch.setattr(gpu_slot, "mps_env", lambda lock_dir: {"CUDA_MPS_PIPE_DIRECTORY": str(lock_dir / "mps-pipe")})
    monkeypatch.setattr(gpu_slot.os, "execvpe", lambda cmd, argv, env: ran.append(env))
    for mps_var, flag in ((None, []), ("1", []), (None, ["--mps", "on"]), ("1", ["--mps", "off"])):
        if mps_var is None:
            monkeypatch.delenv("MINBERT_MPS", raising=False)
        else:
            monkeypatch.setenv("MINBERT_MPS", mps_var)
        gpu_slot.main(["--per-gpu", "4", "--lock-dir", str(tmp_path / "locks"), *flag, "--", "true"])
    assert ["CUDA_MPS_PIPE_DIRECTORY" in env for env in ran] == [False, True, True, False]
    assert all(env["CUDA_VISIBLE_DEVICES"] == "0" for env in ran)
