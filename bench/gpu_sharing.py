"""Several small training jobs on one GPU: one at a time, side by side by time slices, and side by
side as clients of NVIDIA's Multi-Process Service (what workflow/gpu_slot.py starts for jobs that
share a GPU), measured in the same run on the same device.

    python bench/gpu_sharing.py                    # CUDA: 6 jobs of 400 MiniLM updates, batch 8 (Quora pairs)
    python bench/gpu_sharing.py --jobs 8 --steps 600 --batch 16
    python bench/gpu_sharing.py --quick            # a CPU smoke run (tests/test_bench.py): 2 jobs, a tiny model

Each job is a process of its own that builds the pipeline's training step (bench/steps.py's OurStep:
the captured step on CUDA) and times its updates after a warm-up. Printed: the updates per second of
all jobs together in each mode and its ratio to one at a time (above 1: the GPU does more work when
shared), with each job's own rate.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# as every process of the pipeline runs (minbert/__init__.py), before torch loads OpenMP: its threads
# sleep while they wait, so that the steps timed here meet the cores as the jobs do
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def worker(args) -> None:
    """One job: build the step, warm it up, then time `--steps` updates; print its rate as JSON."""
    import torch

    from steps import OurStep, encoders

    from minbert.core.runtime import configure
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import packaged_minilm_folder

    device = torch.device(args.device)
    bf16 = configure(device, "auto")
    encoder, _ = encoders(args.shape)
    tok = Tokenizer(packaged_minilm_folder(), 128)
    step = OurStep(encoder, tok, "para", args.batch, device, bf16, rows=max(args.batch * 64, 512))
    batches = step.batches(min(args.steps, 64))
    for b in batches:                          # every batch shape captured before the clock starts
        step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(args.steps):
        step(batches[k % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({"updates_per_s": args.steps / (time.perf_counter() - t0)}), flush=True)


def run_jobs(args, n: int, together: bool, env: dict) -> tuple[float, list[float]]:
    """(updates/s of all jobs together, each job's rate): n jobs at once, or one after another."""
    cmd = [sys.executable, __file__, "--worker", "--device", args.device, "--shape", args.shape,
           "--batch", str(args.batch), "--steps", str(args.steps)]
    rates, procs = [], []
    for _ in range(n):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if together:
            procs.append(p)
        else:
            rates.append(json.loads(p.communicate()[0].strip().splitlines()[-1])["updates_per_s"])
    for p in procs:
        rates.append(json.loads(p.communicate()[0].strip().splitlines()[-1])["updates_per_s"])
    # the jobs' own timed parts overlap when together: their total rate is the sum of their rates;
    # one at a time it is the rate of one (the harmonic mean, each job doing the same work)
    total = sum(rates) if together else n / sum(1 / r for r in rates)
    return total, rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--shape", default="minilm", help="minilm, bert-base or tiny (bench/steps.py)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a CPU smoke run: 2 jobs of 3 updates of a tiny model")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.jobs, args.steps, args.batch, args.shape, args.device = 2, 3, 4, "tiny", "cpu"
    if args.worker:
        worker(args)
        return 0
    from workflow.gpu_slot import mps_env

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    rows = [("one at a time", *run_jobs(args, args.jobs, False, env)),
            ("side by side, time slices", *run_jobs(args, args.jobs, True, {**env, "MINBERT_MPS": "0"}))]
    mps = mps_env(Path(tempfile.mkdtemp(prefix="gpu-sharing-"))) if args.device == "cuda" else {}
    if mps:
        rows.append(("side by side, MPS", *run_jobs(args, args.jobs, True, {**env, **mps})))
    else:
        print("MPS: not available here (no nvidia-cuda-mps-control, no GPU, or its first client failed)")
    print(f"{args.jobs} jobs x {args.steps} updates, {args.shape}, batch {args.batch}, {args.device}")
    base = rows[0][1]
    for name, total, rates in rows:
        print(f"{name:28s} {total:9.1f} updates/s   x{total / base:5.2f}   each: "
              + " ".join(f"{r:.1f}" for r in rates))
    if mps:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env={**env, **mps},
                       capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
