#!/usr/bin/env bash
# The papers' reproduction in one GPU window (issue 47), as one command on the lent machine, from the
# project's root, after the offline kit was built here (../shared/offline-gpu/README.md:
# `bash ../shared/offline-gpu/prepare.sh`, then carry .gpu):
#
#   bash bench/gpu_window.sh [all|bench|scale]       # default all; $OUT: where the small results go
#
#   1. setup: `. .gpu/setup.sh` (once per machine, about 20 s);
#   2. bench (on the idle GPU, about 5 min): the isolated step (bench/gpu_train.py), jobs sharing
#      the GPU by time slices and by MPS (bench/gpu_sharing.py), the paper scale's real jobs beside
#      their isolated steps (bench/gpu_pipeline.py: 4 fine-tunes, the MLM pretraining, a
#      prediction), and `minbert estimate` of the scale;
#   3. scale: the paper scale (`catalogue: papers`, `scale: paper`) from a fresh results folder,
#      report included, with Snakemake, until it ends or SCALE_SECONDS pass (default: what is left of
#      WINDOW_SECONDS, 570 s, after the benchmarks); then `minbert progress` and what ran;
#   4. its small outputs under $OUT (predictions, metrics, histories, run records, logs, the report
#      pages; no checkpoints), and every figure printed in $OUT/window.log.
#
# A stand-in on a CPU (checks the script end to end; no figure of it is a GPU's):
#   GPU_WINDOW_STANDIN=1 OUT=/tmp/out bash bench/gpu_window.sh
# runs each step on the CPU with a tiny random BERT, the demo data, the benchmarks' smoke runs and the
# scale for SCALE_SECONDS (default 60 there).
set -uo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
WHAT=${1:-all}
OUT=${OUT:-$PWD/gpu-window-out}
WINDOW_SECONDS=${WINDOW_SECONDS:-570}
JOBS_PER_GPU=${JOBS_PER_GPU:-4}
STANDIN=${GPU_WINDOW_STANDIN:-0}
mkdir -p "$OUT"
LOG="$OUT/window.log"
START=$(date +%s)
say() { echo "[$(( $(date +%s) - START )) s] $*" | tee -a "$LOG"; }
left() { echo $(( WINDOW_SECONDS - ($(date +%s) - START) )); }

if [ "$STANDIN" = 1 ]; then
  say "stand-in on the CPU: a tiny model, the demo data; no figure here is a GPU's"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  SCALE_SECONDS=${SCALE_SECONDS:-60}
elif [ -f .gpu/setup.sh ]; then
  say "setup"
  # shellcheck disable=SC1091
  . .gpu/setup.sh || { say "setup failed ($?)"; exit 3; }
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import os, platform, torch
print("machine:", platform.node(), platform.processor() or platform.machine(), os.cpu_count(), "cores; torch",
      torch.__version__, "CUDA", torch.version.cuda, "; GPU",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,utilization.gpu \
  --format=csv,noheader | tee -a "$LOG"

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  if [ "$STANDIN" = 1 ]; then
    say "bench (smoke runs)"
    python3 bench/gpu_train.py --quick 2>&1 | tee -a "$LOG" | tail -8
    python3 bench/gpu_sharing.py --quick 2>&1 | tee -a "$LOG"
    python3 bench/gpu_pipeline.py --quick 2>&1 | tee -a "$LOG"
  else
    say "bench: the isolated step"
    timeout 90 python3 bench/gpu_train.py --shapes minilm --batches 8,32 --rounds 2 --steps 20 2>&1 | tee -a "$LOG"
    say "bench: jobs sharing the GPU (time slices, MPS)"
    timeout 100 python3 bench/gpu_sharing.py --jobs 4 --steps 200 2>&1 | tee -a "$LOG"
    say "bench: the paper scale's real jobs beside their isolated steps"
    timeout 200 python3 bench/gpu_pipeline.py --jobs 4 --seconds 8 --rounds 2 --ahead 64 --work "$OUT/bench-pipeline" \
      2>&1 | tee -a "$LOG"
    rm -rf "$OUT/bench-pipeline"
  fi
fi

if [ "$WHAT" = all ] || [ "$WHAT" = scale ]; then
  WORK=$(mktemp -d)
  if [ "$STANDIN" = 1 ]; then
    python3 - "$WORK" <<'PY'
import sys, torch
from pathlib import Path
sys.path.insert(0, "bench")
import yaml
from gpu_pipeline import REPO, tiny_model
work = Path(sys.argv[1])
raw = yaml.safe_load((REPO / "params" / "papers.yaml").read_text())
raw["scale"] = "paper"
raw["data"].update(dir=str(REPO / "data" / "demo"), nli_file=str(REPO / "data" / "demo" / "nli-sample.jsonl"),
                   include_cfimdb=False)                  # the demo data has no CFIMDB: 004's Objective 2 left out
raw["studies"] = [st for st in raw["studies"] if st.get("name") != "p004_objective2"]
raw["experiments"] = {k: v for k, v in raw["experiments"].items() if not k.startswith("p004_obj2")}
raw["base"].update(model=str(tiny_model(work / "tiny-bert")), device="cpu", threads=1)
(work / "paper.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
PY
    CONFIG=(gpu=0)
  else
    printf 'catalogue: papers\nscale: paper\n' > "$WORK/paper.yaml"
    CONFIG=()
  fi
  # a fresh results folder: the project's tracked files in a folder of their own, ../shared beside it
  mkdir -p "$WORK/p" && mv "$WORK"/paper.yaml "$WORK/p/" && (git ls-files -z | xargs -0 cp --parents -t "$WORK/p")
  cp -r .gpu "$WORK/p/" 2>/dev/null || true
  [ -e ../shared ] && ln -sfn "$(cd ../shared && pwd)" "$WORK/shared"
  cd "$WORK/p" || exit 4
  say "estimate"
  python3 -m minbert.cli estimate --params paper.yaml --jobs-per-gpu "$JOBS_PER_GPU" 2>&1 | tee -a "$LOG"
  SCALE_SECONDS=${SCALE_SECONDS:-$(( $(left) - 40 ))}
  say "scale: snakemake, for at most $SCALE_SECONDS s"
  T0=$(date +%s)
  timeout --signal=INT --kill-after=20 "$SCALE_SECONDS" snakemake --cores all --scheduler greedy --keep-going \
    --config params=paper.yaml jobs_per_gpu="$JOBS_PER_GPU" progress=30 "${CONFIG[@]}" > "$OUT/snakemake.log" 2>&1
  RC=$?
  say "scale: snakemake ended with status $RC after $(( $(date +%s) - T0 )) s"
  grep -E "steps \([0-9]+%\) done" "$OUT/snakemake.log" | tail -1 | tee -a "$LOG"
  python3 -m minbert.cli progress 2>&1 | tail -20 | tee -a "$LOG"
  python3 - <<'PY' 2>&1 | tee -a "$LOG"
import json, pathlib
sums, counts = {}, {}
for f in pathlib.Path("results/runs").rglob("*.json"):
    r = json.loads(f.read_text())
    stage = r.get("stage", f.parent.name)
    sums[stage] = sums.get(stage, 0) + r.get("wall_seconds", 0)
    counts[stage] = counts.get(stage, 0) + 1
print("job time by stage (run records):", ", ".join(f"{s} {sums[s]:.0f} s ({counts[s]} jobs)" for s in sorted(sums)))
PY
  # the small outputs: no checkpoints, no model folders
  tar --exclude='*.pt' --exclude='*/model' --exclude='*/model/*' --exclude='*.safetensors' --exclude='results/state' \
      --exclude='results/cache' -cf - results reports paper.yaml 2>/dev/null | tar -xf - -C "$OUT"
  say "copied the small outputs to $OUT ($(du -sh "$OUT" | cut -f1))"
  cd - >/dev/null && rm -rf "$WORK"
fi
say "done"
