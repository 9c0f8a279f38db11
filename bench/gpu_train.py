"""The training step on a GPU (and, as a smoke test, on a CPU): time, throughput, MFU, memory, syncs.

    python bench/gpu_train.py                 # CUDA: bert-base shape (random weights) and MiniLM, batches 8/16/32
    python bench/gpu_train.py --compile       # the same under torch.compile
    python bench/gpu_train.py --quick         # smoke run (CPU, CI): a tiny random BERT, batch 8, a few steps

What is timed is the pipeline's own step, `minbert.train.loop.train_step` (forward, loss, backward,
clip, fused AdamW; SMART's rows add its adversarial term and momentum copy), on batches the
pipeline's `TaskStream` draws from real SST / Quora / STS training rows (../shared/data, else
data/demo): length-bucketed, padded to a multiple of 8, one task per step in turn. Each shape
(model x batch size x SMART) gets its own warm-up steps, then timed steps (CUDA events on a GPU,
the wall clock on a CPU).

Printed: the environment (GPU, CUDA, cuDNN, torch, precision, attention backends, compile); per
shape the step time median and p10-p90, updates/s, real and padded tokens/s, MFU (model FLOPs
6 x parameters x real tokens plus attention's 12 x layers x hidden x padded length x real tokens,
over the peak stated; the parameter count excludes the embeddings), peak GPU memory, and host syncs
per step (torch.cuda's sync debug mode on a GPU; on a CPU the operations that would make the host
wait, counted as tests/test_hot_loop.py does); then the catalogue's time projected from its real
update counts (params/full.yaml's fine-tunings at their batch sizes on the real data sizes, each
update costing the measured bert-base step per task it trains, SMART's step for its SMART jobs when
measured (--smart); the frozen-encoder jobs at the full step, an upper bound now that they train on
stored embeddings; pretraining, head retraining, prediction and evaluation not counted).
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

from minbert.core.runtime import configure  # noqa: E402
from minbert.data.batches import build_task_data
from minbert.data.read import read_cs224n, target_sizes  # noqa: E402
from minbert.model.bert import BertConfig, BertModel  # noqa: E402
from minbert.model.multitask import MultitaskModel, encoder_parameters, head_parameters
from minbert.model.tokenizer import Tokenizer  # noqa: E402
from minbert.model.weights import load_encoder, packaged_minilm_folder  # noqa: E402
from minbert.params import FinetuneParams, load_params  # noqa: E402
from minbert.train import loop as T  # noqa: E402
from minbert.train.optim import build_adamw  # noqa: E402

TASKS = ("sst", "para", "sts")
RAW = {"sst": "ids-sst", "para": "quora", "sts": "sts", "cfimdb": "ids-cfimdb"}
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "is_nonzero", "equal"}
# dense peak TFLOP/s by device name (bf16 / TF32), from the vendors' data sheets
PEAKS = {"H200": (989.0, 494.7), "H100 SXM": (989.0, 494.7), "H100 80GB HBM3": (989.0, 494.7),
         "H100 PCIe": (756.0, 378.0), "H100": (989.0, 494.7), "A100": (312.0, 156.0), "L4": (121.0, 60.0),
         "A10": (125.0, 62.5), "L40S": (362.0, 183.0)}


def data_dir() -> Path:
    shared = REPO.parent / "shared" / "data" / "cs224n"
    return shared if (shared / "ids-sst-train.csv").is_file() else REPO / "data" / "demo"


def load_train(tok: Tokenizer, heads, rows: int) -> dict:
    src = data_dir()
    out = {}
    for task in TASKS:
        frame, _ = read_cs224n(src / f"{RAW[task]}-train.csv", task, on_bad_rows="drop")
        out[task] = build_task_data(task, frame.head(rows).reset_index(drop=True), tok, heads)
    return out


def model_for(shape: str) -> MultitaskModel:
    if shape == "minilm":
        encoder, _, _ = load_encoder("all-MiniLM-L6-v2")
    elif shape == "bert-base":
        torch.manual_seed(0)
        encoder = BertModel(BertConfig())            # bert-base-uncased's shape, random weights
    else:
        torch.manual_seed(0)
        encoder = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=128))
    return encoder


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in SYNC_OPS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def non_embedding_params(model: MultitaskModel) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".embeddings." not in n and p.requires_grad)


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


def measure(shape: str, encoder: BertModel, tok: Tokenizer, batch: int, smart: bool, args, device, bf16) -> dict:
    cfg = FinetuneParams(tasks=list(TASKS), batch_size=batch, lr=2e-5, epochs=1, smart={"enabled": smart},
                         heads={"pooling": "cls", "para": "cross", "sts": "cross"}, downsample={"mode": "none"})
    model = MultitaskModel(encoder, cfg.heads, list(TASKS)).to(device)
    if args.compile:
        model.encoder = torch.compile(model.encoder, dynamic=True)
    train = load_train(tok, cfg.heads, args.rows)
    optimizer = build_adamw([(encoder_parameters(model), cfg.lr), (head_parameters(model), cfg.lr)], cfg.weight_decay)
    momentum = None
    if smart:
        from minbert.train.regularisers import MomentumModel

        momentum = MomentumModel(model, cfg.smart.beta)
        momentum.module.eval()
    generators = {"smart": torch.Generator().manual_seed(1), "pcgrad": torch.Generator().manual_seed(2)}
    run = T.Run(model, tok, train, {}, cfg, 0, device, bf16, T.DistInfo(), optimizer,
                [p for p in model.parameters() if p.requires_grad], momentum, generators, Path(tempfile.gettempdir()),
                "", {}, {}, False)
    plan = T.Plan(stages=[list(TASKS)], epochs={}, total_updates=10**6, warmup=0)
    state = T.TrainState()
    totals = T.EpochTotals(list(TASKS), device)
    streams = {t: T.TaskStream(train[t], tok, batch, 11 + i, 0, T.DistInfo()) for i, t in enumerate(TASKS)}
    model.train()

    def one(k):
        task = TASKS[k % len(TASKS)]
        b = streams[task].next()
        labels = [b["labels"].numpy()]
        real = int(b["attention_mask"].sum())
        padded = b["attention_mask"].numel()
        length = b["attention_mask"].shape[1]
        return [(task, b)], labels, real, padded, length

    for k in range(args.warmup):
        bt, lb, *_ = one(k)
        T.train_step(run, state, plan, bt, lb, totals)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times, reals, pads, flops = [], [], [], []
    n_params = non_embedding_params(model)
    cfg_e = encoder.config
    for k in range(args.steps):
        bt, lb, real, padded, length = one(k)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            T.train_step(run, state, plan, bt, lb, totals)
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            T.train_step(run, state, plan, bt, lb, totals)
            times.append(time.perf_counter() - t0)
        reals.append(real)
        pads.append(padded)
        passes = 3 if not smart else 3 + 2 * 3      # forward + backward; SMART: its ascent and adversarial passes too
        flops.append(passes * (2 * n_params * real + 4 * cfg_e.num_hidden_layers * cfg_e.hidden_size * length * real))
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1000 for s, e in times]
    # host syncs in one more step
    bt, lb, *_ = one(args.steps)
    if device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                T.train_step(run, state, plan, bt, lb, totals)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
    else:
        counter = SyncCounter()
        with counter:
            T.train_step(run, state, plan, bt, lb, totals)
        syncs = counter.n
    total = sum(times)
    return {"shape": shape, "batch": batch, "smart": smart, "median": statistics.median(times),
            "p10": float(np.percentile(times, 10)), "p90": float(np.percentile(times, 90)),
            "updates_s": len(times) / total, "real_tok_s": sum(reals) / total, "pad_tok_s": sum(pads) / total,
            "flops_s": sum(flops) / total, "params": n_params,
            "peak_mem": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "syncs": syncs}


def environment(device, bf16, args) -> str:
    parts = [f"torch {torch.__version__}", f"precision {'bf16' if bf16 else 'fp32'}", f"compile {args.compile}"]
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
    """params/full.yaml's fine-tunings: each update costs the measured step per task it trains."""
    path = REPO / "params" / "full.yaml"
    import yaml

    text = (REPO / "params.yaml").read_text().replace("catalogue: demo", "catalogue: full")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "params").mkdir()
        (Path(d) / "params" / "full.yaml").write_text(path.read_text())
        (Path(d) / "params.yaml").write_text(text)
        lp = load_params(Path(d) / "params.yaml")
    src = Path(yaml.safe_load(path.read_text())["data"]["dir"])
    src = (REPO / src) if not src.is_absolute() else src
    if not (src / "ids-sst-train.csv").is_file():
        return [f"(no projection: the catalogue's data {src} is not here)"]
    rows = {t: len(read_cs224n(src / f"{RAW[t]}-train.csv", t, on_bad_rows="drop")[0]) for t in RAW}
    seconds, updates, jobs = 0.0, 0, 0
    batches = sorted({b for (_, b, _) in step_times})
    for name, exp in lp.experiments.items():
        ft = exp.finetune
        tasks = [t for t in ft.tasks if t in rows]
        sizes = target_sizes({t: rows[t] for t in tasks}, ft.downsample)
        plan = T.Plan.build(ft, tasks, sizes, exp.seed)
        b = min(batches, key=lambda x: abs(x - ft.batch_size))
        t = step_times[("bert-base", b, bool(ft.smart.enabled))] if ("bert-base", b, bool(ft.smart.enabled)) in step_times \
            else step_times[("bert-base", b, False)]
        n = sum(len(u) for ups in plan.epochs.values() for u in ups)
        seconds += n * t
        updates += plan.total_updates
        jobs += 1
    return [f"catalogue projection: {jobs} fine-tunings of params/full.yaml, {updates:,} updates on the real data "
            f"sizes, about {seconds / 3600:.2f} h of training steps on this device (bert-base shape; pretraining, "
            f"prediction and evaluation not counted)"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="bert-base,minilm")
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--smart", action="store_true", help="also time SMART steps (the catalogue's SMART jobs)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rows", type=int, default=4000, help="training rows per task the batches come from")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the encoder")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny random BERT, batch 8, 2+3 steps, CPU")
    args = ap.parse_args()
    if args.quick:
        args.shapes, args.batches, args.warmup, args.steps, args.rows, args.device = "tiny", "8", 2, 3, 64, "cpu"
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    bf16 = configure(device, args.precision)
    tok = Tokenizer(packaged_minilm_folder(), 128)
    print(environment(device, bf16, args))
    print(f"data: {data_dir()} (first {args.rows} training rows per task), lengths padded to a multiple of 8")
    peak, peak_note = peak_tflops(device, bf16, args.peak_tflops)
    print(f"MFU peak: {peak_note}{f' = {peak:g} TFLOP/s' if peak else ''}")
    print("\n| model | batch | SMART | params (non-embedding) | step ms median (p10-p90) | updates/s | real tok/s | "
          "padded tok/s | MFU | peak GPU GiB | host syncs/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    step_times = {}
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for smart in ([False, True] if args.smart else [False]):
                r = measure(shape, model_for(shape), tok, batch, smart, args, device, bf16)
                step_times[(shape, batch, smart)] = r["median"]
                mfu = f"{100 * r['flops_s'] / (peak * 1e12):.1f}%" if peak else "n/a"
                mem = f"{r['peak_mem']:.2f}" if r["peak_mem"] is not None else "n/a"
                print(f"| {shape} | {batch} | {'yes' if smart else 'no'} | {r['params'] / 1e6:.1f}M | "
                      f"{1000 * r['median']:.1f} ({1000 * r['p10']:.1f}-{1000 * r['p90']:.1f}) | {r['updates_s']:.1f} | "
                      f"{r['real_tok_s']:,.0f} | {r['pad_tok_s']:,.0f} | {mfu} | {mem} | {r['syncs']} |", flush=True)
    if any(k[0] == "bert-base" for k in step_times):
        for line in projection(step_times):
            print(line)


if __name__ == "__main__":
    main()
