"""A job's start-up on a CPU, this tree against an older one measured in the same run.

    python bench/startup.py                      # against commit 28500f9, 5 rounds
    python bench/startup.py --old <rev> --rounds 3
    python bench/startup.py --quick              # 1 round (tests/test_bench.py runs it)

Two measures, each a fresh Python process, the two trees' runs alternating round by round (the
order swapping too) so that load from other processes hits both alike:
- first update: from the launch of `python -m stages.finetune --experiment tiny` to the end of its
  first AdamW update (torch's fused Adam kernel call, which both trees' optimisers end in, is
  wrapped in the child to note the time and exit there), on a tiny fine-tuning of the packaged
  MiniLM on the demo data (batch 8, fp32, 2 threads); the results folder is a fresh copy of one
  the tree's own prepare stage wrote, so every run starts a job from scratch;
- `python -X importtime -m stages.evaluate --help`: its wall time, the sum of its imports' own
  times, and whether torch is among them (a stage that only reads predictions needs no torch).
The old tree is `git archive`d into a temporary folder and run with PYTHONPATH pointing there.
Printed: each measure's median (min-max) for both trees and the ratio new/old (median over
rounds of the per-round ratios, min-max): below 1, this tree starts faster.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# the child: wrap the fused Adam kernel call (torch.optim.AdamW(fused=True) and our AdamW both end
# there), note the time after the first update and leave at once
CHILD = """
import os, runpy, sys, time
import torch.optim.adam as adam
real = adam._fused_adam
def first_update(*args, **kwargs):
    real(*args, **kwargs)
    with open(os.environ["STARTUP_MARK"], "w") as f:
        f.write(repr(time.time()))
    os._exit(0)
adam._fused_adam = first_update
sys.argv = ["stages.finetune"] + sys.argv[1:]
runpy.run_module("stages.finetune", run_name="__main__", alter_sys=True)
"""


def params(path: Path) -> Path:
    demo = REPO / "data" / "demo"
    path.write_text(yaml.safe_dump({
        "data": {"dir": str(demo), "nli_file": str(demo / "nli-sample.jsonl")},
        "base": {"model": "all-MiniLM-L6-v2", "device": "cpu", "precision": "fp32", "threads": 2, "seed": 3,
                 "max_length": 32, "predict_batch_size": 16,
                 "finetune": {"epochs": 1, "batch_size": 8, "lr": 1e-4, "warmup_ratio": 0.0,
                              "max_steps_per_epoch": 2, "downsample": {"mode": "fixed", "size": 24}}},
        "experiments": {"tiny": {}}}), encoding="utf-8")
    return path


def env_for(tree: Path, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "2", **extra}


def old_tree(rev: str, where: Path) -> Path:
    """The tree of `rev`, unpacked (git archive) under `where`."""
    out = where / f"tree-{rev}"
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def prepare(tree: Path, params_file: Path, results: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "stages.prepare", "--params", str(params_file), "--results",
                          str(results)], cwd=tree, env=env_for(tree), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"prepare failed in {tree}:\n{out.stderr[-2000:]}")


def first_update(tree: Path, params_file: Path, prepared: Path, work: Path) -> float:
    """Seconds from the launch of the finetune stage to the end of its first update."""
    results = work / "results"
    shutil.rmtree(results, ignore_errors=True)
    shutil.copytree(prepared, results)
    mark = work / "mark"
    mark.unlink(missing_ok=True)
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, "--experiment", "tiny", "--params", str(params_file),
                          "--results", str(results)], cwd=tree, env=env_for(tree, STARTUP_MARK=str(mark)),
                         capture_output=True, text=True, check=False)
    if not mark.is_file():
        raise SystemExit(f"the finetune stage in {tree} ended (status {out.returncode}) before its first update:\n"
                         f"{out.stderr[-2000:]}")
    return float(mark.read_text()) - t0


def evaluate_help(tree: Path) -> tuple[float, float, bool]:
    """(wall seconds, the imports' own seconds summed, whether torch was imported) of
    `python -X importtime -m stages.evaluate --help`."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "stages.evaluate", "--help"], cwd=tree,
                         env=env_for(tree), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"stages.evaluate --help failed in {tree}:\n{out.stderr[-2000:]}")
    own, torch = 0, False
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
            own += int(self_us)
            torch |= name == "torch"
    return wall, own / 1e6, torch


def summary(new: list[float], old: list[float]) -> str:
    ratios = [a / b for a, b in zip(new, old)]
    return (f"{statistics.median(new):.2f} ({min(new):.2f}-{max(new):.2f}) | "
            f"{statistics.median(old):.2f} ({min(old):.2f}-{max(old):.2f}) | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="28500f9", help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one round")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 1
    cpu = sorted(set(Path("/proc/cpuinfo").read_text().split()) & {"avx512_bf16", "avx2", "amx_bf16"}) \
        if Path("/proc/cpuinfo").is_file() else []
    print(f"start-up: this tree ({REPO}) against {args.old}; {os.cpu_count()} CPUs, flags {' '.join(cpu) or 'n/a'}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {sys.version.split()[0]}; "
          f"{args.rounds} rounds")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        trees = {"new": REPO, "old": old_tree(args.old, d)}
        params_file = params(d / "params.yaml")
        prepared = {}
        for name, tree in trees.items():
            prepared[name] = d / f"prepared-{name}"
            prepare(tree, params_file, prepared[name])
        got = {(m, n): [] for m in ("first", "wall", "imports") for n in trees}
        torch_imported = {}
        for rnd in range(args.rounds):
            for name in (["new", "old"] if rnd % 2 == 0 else ["old", "new"]):
                work = d / f"run-{name}"
                work.mkdir(exist_ok=True)
                got[("first", name)].append(first_update(trees[name], params_file, prepared[name], work))
                wall, own, torch_imported[name] = evaluate_help(trees[name])
                got[("wall", name)].append(wall)
                got[("imports", name)].append(own)
    print("\n| measure | new s median (min-max) | old s median (min-max) | new/old (min-max) |")
    print("|---|---|---|---|")
    for key, label in (("first", "launch to first update (finetune, tiny MiniLM run)"),
                       ("wall", "`python -X importtime -m stages.evaluate --help`, wall"),
                       ("imports", "its imports, sum of their own times")):
        print(f"| {label} | {summary(got[(key, 'new')], got[(key, 'old')])} |")
    print(f"stages.evaluate imports torch: new {'yes' if torch_imported['new'] else 'no'}, "
          f"old {'yes' if torch_imported['old'] else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
