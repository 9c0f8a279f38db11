"""The training step on a GPU against transformers' BertModel timed in the same run (CPU: a smoke run).

    python bench/gpu_train.py                 # CUDA: bert-base shape (random weights) and MiniLM, batches 8/16/32
    python bench/gpu_train.py --device cpu --shapes tiny --batches 8 --rounds 2 --steps 3   # CPU smoke run
    python bench/gpu_train.py --quick         # the same smoke run (tests/test_bench.py runs it)
    python bench/gpu_train.py --op-count      # also the operations one step dispatches (bench/op_count.py)

Three steps run on the same batches, round after round (their order rotating), for each shape:
- ours: the pipeline's own training step (bench/steps.py's OurStep: minbert.train.loop.start_run
  builds the run; on CUDA with cuda_graphs the captured step of minbert.train.step replays it, on a
  CPU `train_step` runs eagerly with the padding removed), on the task's head and loss, clip 1.0,
  our fused AdamW;
- ref eager: transformers.BertModel (attn_implementation="sdpa"), a linear head on [CLS] and the
  task's loss, clip 1.0, torch's fused AdamW, bf16 autocast where ours uses it;
- ref graph (CUDA only): the same step, forward to AdamW(capturable=True), captured once per batch
  shape in a CUDA graph and replayed (PyTorch's whole-network capture).
The batches are the pipeline's TaskStream draws of real Quora training pairs (cross-encoded,
../shared/data, else data/demo), length-bucketed as the product pads them on that path (fixed
lengths where the step is captured), each batch warmed up for every step before timing.

Printed: the environment; per shape and batch size, each step's median and p10-p90 ms (CUDA events
per step on a GPU, the wall clock on a CPU) and the ratio ours/reference of the step time (below
1: ours is faster), the median over rounds of the per-round median ratio with its min-max; ours'
real tokens/s, MFU, peak GPU memory and host syncs per step; then the catalogue's time projected
from its real update counts (params/papers.yaml's fine-tunings at the papers' model and scale, each update at
the measured bert-base
step of the nearest batch size).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from steps import OurStep, ReferenceStep, data_dir, encoders

from minbert.core.runtime import configure
from minbert.core.tasks import TASKS
from minbert.data.downsample import target_sizes
from minbert.data.raw import raw_path, read_cs224n
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import packaged_minilm_folder
from minbert.params import load_params
from minbert.train.training import Plan

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "is_nonzero", "equal"}
# dense peak TFLOP/s by device name (bf16 / TF32), from the vendors' data sheets
PEAKS = {"H200": (989.0, 494.7), "H100 SXM": (989.0, 494.7), "H100 80GB HBM3": (989.0, 494.7),
         "H100 PCIe": (756.0, 378.0), "H100": (989.0, 494.7), "A100": (312.0, 156.0), "L4": (121.0, 60.0),
         "A10": (125.0, 62.5), "L40S": (362.0, 183.0)}


class SyncCounter(TorchDispatchMode):
    """On a CPU: the operations that would make the host wait for a GPU (tests/test_hot_loop.py)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in SYNC_OPS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def peak_tflops(device: torch.device, bf16: bool, given: float | None) -> tuple[float | None, str]:
    if given:
        return given, "given (--peak-tflops)"
    if device.type != "cuda":
        return None, "unknown for a CPU (give --peak-tflops)"
    name = torch.cuda.get_device_name(device)
    for key, (b, f) in PEAKS.items():
        if key in name:
            return (b if bf16 else f), f"{name}: {'bf16' if bf16 else 'TF32'} dense, data sheet"
    return None, f"unknown for {name} (give --peak-tflops)"


def host_syncs(step, batch, device) -> int:
    """Host syncs in one more step: torch.cuda's sync debug mode on a GPU, SyncCounter on a CPU."""
    if device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message).lower() for w in caught)
    counter = SyncCounter()
    with counter:
        step(batch)
    return counter.n


def time_steps(step, batches, device) -> list[float]:
    """Seconds per step over `batches`: CUDA events around each step on a GPU, the wall clock on a CPU."""
    if device.type == "cuda":
        events = []
        for b in batches:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(b)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1000 for s, e in events]
    out = []
    for b in batches:
        t0 = time.perf_counter()
        step(b)
        out.append(time.perf_counter() - t0)
    return out


def measure(shape: str, tok: Tokenizer, batch: int, args, device, bf16) -> dict:
    """Ours and the references on the same batches, rounds interleaved; times in seconds per step."""
    ours_encoder, ref_model = encoders(shape)
    ours = OurStep(ours_encoder, tok, args.task, batch, device, bf16, rows=args.rows)
    batches = ours.batches(args.steps)
    steps = {"ours": ours, "ref eager": ReferenceStep(ref_model, args.task, device, bf16)}
    skipped = None
    if device.type == "cuda":
        graph_model = encoders(shape)[1]
        steps["ref graph"] = ReferenceStep(graph_model, args.task, device, bf16, graph=True)
    else:
        skipped = "ref graph skipped: CUDA graphs need a CUDA device"
    for step in steps.values():      # warm-up: every batch's shape (ours and ref graph capture it here)
        for _ in range(args.warmup):
            for b in batches:
                step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = {name: [] for name in steps}
    names = list(steps)
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            times[name].append(time_steps(steps[name], batches, device))
    syncs = host_syncs(ours, batches[0], device)
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    cfg = ours_encoder.config
    n_params = sum(p.numel() for n, p in ours.tr.model.named_parameters() if ".embeddings." not in n)
    lengths = [b["attention_mask"].shape[1] for b in batches]
    flops = sum(3 * (2 * n_params * int(b["attention_mask"].sum()) + 4 * cfg.num_hidden_layers * cfg.hidden_size
                     * L * int(b["attention_mask"].sum())) for b, L in zip(batches, lengths))
    flat = {n: [t for r in v for t in r] for n, v in times.items()}
    return {"times": flat, "rounds": times, "paths": {n: s.path for n, s in steps.items()}, "skipped": skipped,
            "syncs": syncs, "peak_mem": peak_mem, "real_per_pass": real, "flops_per_pass": flops,
            "mean_length": statistics.mean(lengths), "n": len(batches)}


def ratio_cells(rounds: dict, ref: str) -> str:
    per_round = [statistics.median(o) / statistics.median(r) for o, r in zip(rounds["ours"], rounds[ref])]
    return f"{statistics.median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})"


def ms(ts: list[float]) -> str:
    return f"{1000 * statistics.median(ts):.2f} ({1000 * np.percentile(ts, 10):.2f}-{1000 * np.percentile(ts, 90):.2f})"


def environment(device, bf16) -> str:
    import transformers

    parts = [f"torch {torch.__version__}", f"transformers {transformers.__version__}",
             f"precision {'bf16' if bf16 else 'fp32'}"]
    if device.type == "cuda":
        parts = [f"GPU {torch.cuda.get_device_name(device)}", f"CUDA {torch.version.cuda}",
                 f"cuDNN {torch.backends.cudnn.version()}"] + parts
        be = torch.backends.cuda
        parts.append("attention backends: " + ", ".join(
            n for n, on in (("flash", be.flash_sdp_enabled()), ("mem_efficient", be.mem_efficient_sdp_enabled()),
                            ("cudnn", getattr(be, "cudnn_sdp_enabled", lambda: False)()),
                            ("math", be.math_sdp_enabled())) if on))
    else:
        parts = [f"CPU, {torch.get_num_threads()} threads"] + parts + ["attention backend: math (CPU SDPA)"]
    return "; ".join(parts)


def projection(step_times: dict) -> list[str]:
    """params/papers.yaml's fine-tunings at the papers' model and scale: each update costs the measured
    bert-base step per task it trains."""
    path = REPO / "params" / "papers.yaml"
    if not path.is_file():
        return ["(no projection: params/papers.yaml is not here)"]
    import yaml

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "params").mkdir()
        (Path(d) / "params" / "papers.yaml").write_text(path.read_text())
        (Path(d) / "params.yaml").write_text("catalogue: papers\nmodel: bert-base-uncased\nscale: paper\n")
        lp = load_params(Path(d) / "params.yaml")
    src = Path(yaml.safe_load(path.read_text())["data"]["dir"])
    src = (REPO / src) if not src.is_absolute() else src
    if not raw_path(src, "sst", "train").is_file():
        return [f"(no projection: the catalogue's data {src} is not here)"]
    rows = {t: len(read_cs224n(raw_path(src, t, "train"), t, on_bad_rows="drop")[0]) for t in TASKS}
    seconds, updates, jobs = 0.0, 0, 0
    batches = sorted({b for (_, b) in step_times})
    for exp in lp.experiments.values():
        ft = exp.finetune
        tasks = [t for t in ft.tasks if t in rows]
        sizes = target_sizes({t: rows[t] for t in tasks}, ft.downsample)
        plan = Plan.build(ft, tasks, sizes, exp.seed)
        b = min(batches, key=lambda x: abs(x - ft.batch_size))
        n = sum(len(u) for ups in plan.epochs.values() for u in ups)
        seconds += n * step_times[("bert-base", b)]
        updates += plan.total_updates
        jobs += 1
    line = (f"catalogue projection: {jobs} fine-tunings of params/papers.yaml (bert-base-uncased, scale paper), "
            f"{updates:,} updates on the real data "
            f"sizes, about {seconds / 3600:.2f} h of training steps on this device (bert-base shape, ours; SMART's "
            f"extra passes, pretraining, prediction and evaluation not counted)")
    return [line]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="bert-base,minilm", help="bert-base, minilm, tiny (comma-separated)")
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--task", default="para", help="whose batches and loss (para: Quora pairs, cross-encoded)")
    ap.add_argument("--steps", type=int, default=20, help="batches per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the ratio is their median")
    ap.add_argument("--warmup", type=int, default=2, help="untimed passes over the batches per step")
    ap.add_argument("--rows", type=int, default=4000, help="training rows the batches are drawn from")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--op-count", action="store_true", help="also count the operations one step dispatches "
                    "(bench/op_count.py, on the CPU, first shape and largest batch)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny random BERT, batch 8, 2 rounds of 3 "
                    "steps, CPU")
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.batches, args.warmup, args.steps, args.rounds, args.rows, args.device = \
            "tiny", "8", 1, 3, 2, 64, "cpu"
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and device.type != "cuda":
        ap.error("--device cuda: no CUDA device here")
    bf16 = configure(device, args.precision)
    tok = Tokenizer(packaged_minilm_folder(), 128)
    print(environment(device, bf16))
    print(f"data: {data_dir()}, task {args.task} (first {args.rows} training rows), {args.rounds} rounds x "
          f"{args.steps} batches per step")
    if device.type != "cuda":
        print("ref graph: skipped (CUDA graphs need a CUDA device; ours runs its CPU path: eager, padding removed)")
    peak, peak_note = peak_tflops(device, bf16, args.peak_tflops)
    print(f"MFU peak: {peak_note}{f' = {peak:g} TFLOP/s' if peak else ''}")
    refs = ["ref eager"] + (["ref graph"] if device.type == "cuda" else [])
    print("\n| model | batch | mean length | ours ms median (p10-p90) | "
          + " | ".join(f"{r} ms median (p10-p90) | ours/{r} (min-max)" for r in refs)
          + " | real tok/s (ours) | MFU (ours) | peak GPU GiB | host syncs/step |")
    print("|---|---|---|---|" + "---|---|" * len(refs) + "---|---|---|---|")
    step_times, paths = {}, None
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = measure(shape, tok, batch, args, device, bf16)
            paths = r["paths"]
            t = r["times"]
            step_times[(shape, batch)] = statistics.median(t["ours"])
            per_pass = statistics.median(t["ours"]) * r["n"]
            mfu = f"{100 * r['flops_per_pass'] / per_pass / (peak * 1e12):.1f}%" if peak else "n/a"
            mem = f"{r['peak_mem']:.2f}" if r["peak_mem"] is not None else "n/a"
            cells = " | ".join(f"{ms(t[ref])} | {ratio_cells(r['rounds'], ref)}" for ref in refs)
            print(f"| {shape} | {batch} | {r['mean_length']:.1f} | {ms(t['ours'])} | {cells} | "
                  f"{r['real_per_pass'] / per_pass:,.0f} | {mfu} | {mem} | {r['syncs']} |", flush=True)
    print("ours/ref: step time ratio (below 1: ours is faster), median over rounds of the per-round medians")
    print("paths: " + "; ".join(f"{n}: {p}" for n, p in paths.items()))
    if any(k[0] == "bert-base" for k in step_times):
        for line in projection(step_times):
            print(line)
    if args.op_count:
        from op_count import main as op_count

        op_count(["--shape", args.shapes.split(",")[0], "--task", args.task,
                  "--batch", str(max(int(b) for b in args.batches.split(","))),
                  "--precision", "bf16" if bf16 else "fp32"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
