"""workflow.gpu_slot gives each concurrent job GPUs of its own (real processes, emulated GPUs: the
visible devices come from CUDA_VISIBLE_DEVICES), makes a job wait while every GPU is taken, and
runs the command as it is where no GPU is visible."""
from __future__ import annotations

import subprocess
import sys
import time

from conftest import child_env

SHOW = [sys.executable, "-c", "import os, sys, time; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'none'), "
                              "flush=True); time.sleep(float(sys.argv[1]))"]


def wrapped(tmp_path, visible, seconds, count=1):
    env = child_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.Popen([sys.executable, "-m", "workflow.gpu_slot", "--count", str(count), "--lock-dir",
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
