"""bench/gpu_train.py runs on a CPU in CI's time (its smoke run times the pipeline's own step and
finds no host sync in it); its catalogue projection adds up params/full.yaml's real update counts."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO, child_env, shared_data_dir


def test_gpu_train_smoke_run_on_cpu():
    env = child_env(OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "bench/gpu_train.py", "--quick"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CPU,") and "torch" in lines[0] and "compile False" in lines[0]
    row = next(line for line in lines if line.startswith("| tiny | 8 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[5]) > 0 and cells[-1] == "0"           # updates/s; host syncs per step


@pytest.mark.skipif(shared_data_dir() is None, reason="the real data is not here")
def test_catalogue_projection_adds_up_the_real_update_counts():
    spec = importlib.util.spec_from_file_location("gpu_train", REPO / "bench" / "gpu_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    one = {("bert-base", b, s): 1.0 for b in (8, 16, 32) for s in (False, True)}
    line = bench.projection(one)[0]
    hours = float(line.split("about ")[1].split(" h")[0])
    double = float(bench.projection({k: 2.0 for k in one})[0].split("about ")[1].split(" h")[0])
    assert hours > 0 and double == pytest.approx(2 * hours, rel=1e-3)
