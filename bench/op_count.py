"""Operations dispatched per training step, ours against transformers' BertModel: no GPU needed.

    python bench/op_count.py                      # MiniLM, a batch of 32 Quora pairs, fp32
    python bench/op_count.py --shape tiny --batch 8 --top 10

On a GPU a small model's step is bound by kernel launches, about one per operation, so the
number of operations a step dispatches is a device-free proxy for its launch cost. Each step runs
once to warm up (the padded path probes which parameters its task trains then), then once under a
`TorchDispatchMode` that counts every ATen operation reaching the kernels (forward, backward,
clip, AdamW; the backward pass's too), in total and without views (views launch no kernel).

Rows: ours through the training path a CPU runs (padding removed, minbert.train.loop.train_step),
ours through the padded fixed-length path of the CUDA step (minbert.train.step's parts, run eagerly:
what a CUDA graph would record), and the reference (bench/steps.py's ReferenceStep: transformers'
BertModel with SDPA attention, a linear head on [CLS], BCE, clip, fused AdamW). All on the same rows
(the first batch the pipeline's TaskStream draws of the task), each path padding them its own way.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from steps import OurStep, ReferenceStep, data_dir, encoders

from minbert.core.runtime import configure
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import packaged_minilm_folder


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while active: all of them, and those that are no view."""

    def __init__(self):
        super().__init__()
        self.total, self.not_views = 0, 0
        self.by_name: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        if not func.is_view:
            self.not_views += 1
            self.by_name[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_step(step, batch) -> OpCounter:
    step(batch)                     # warm-up: first-use work (the padded path's probe) stays out
    counter = OpCounter()
    with counter:
        step(batch)
    return counter


def measure(shape: str, task: str, batch_size: int, device: torch.device, bf16: bool, rows: int) -> list[dict]:
    tok = Tokenizer(packaged_minilm_folder(), 128)
    out = []
    for padded in (False, True):
        ours = OurStep(encoders(shape)[0], tok, task, batch_size, device, bf16, rows=rows, cuda_graphs=False,
                       padded=padded)
        batch = ours.batches(1)[0]
        if not padded:
            eager_batch = batch
        c = count_step(ours, batch)
        out.append({"name": "ours", "path": ours.path, "length": batch["input_ids"].shape[1], "counter": c})
    ref = ReferenceStep(encoders(shape)[1], task, device, bf16)
    c = count_step(ref, eager_batch)
    out.append({"name": "transformers", "path": ref.path, "length": eager_batch["input_ids"].shape[1], "counter": c})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="minilm", choices=["minilm", "bert-base", "tiny"])
    ap.add_argument("--task", default="para", help="the task whose batch is counted (para: Quora pairs)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rows", type=int, default=512, help="training rows the batch is drawn from")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--top", type=int, default=0, help="also list each row's most frequent operations")
    args = ap.parse_args(argv)
    device = torch.device("cpu")
    bf16 = configure(device, args.precision)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"op count: {args.shape}, task {args.task}, batch {args.batch}, {'bf16 autocast' if bf16 else 'fp32'}, "
          f"data {data_dir()}; torch {torch.__version__}")
    rows = measure(args.shape, args.task, args.batch, device, bf16, args.rows)
    ref = rows[-1]["counter"]
    print("\n| step | path | padded length | ops total | not views | ours/ref (total) | ours/ref (not views) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["counter"]
        print(f"| {r['name']} | {r['path']} | {r['length']} | {c.total} | {c.not_views} | "
              f"{c.total / ref.total:.2f} | {c.not_views / ref.not_views:.2f} |")
    if args.top:
        for r in rows:
            top = ", ".join(f"{n} {k}" for n, k in r["counter"].by_name.most_common(args.top))
            print(f"{r['name']} ({r['path']}), most frequent non-view ops: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
