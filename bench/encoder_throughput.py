"""Throughput of our encoder against transformers.BertModel: same weights, batches, dtype, threads.

    python bench/encoder_throughput.py            # full run (a few minutes on 2 CPU cores)
    python bench/encoder_throughput.py --quick    # smoke run

Rows: a training step (forward, backward, AdamW) and inference, each in fp32 and under bf16
autocast. Ours and the reference run interleaved, round after round (their order alternating), on
the same real SST sentences and STS pairs, so that load from other processes hits both alike;
each cell is the median over rounds of examples per second.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from minbert.core.runtime import cpu_has_native_bf16  # noqa: E402
from minbert.model.tokenizer import Tokenizer  # noqa: E402
from minbert.model.weights import load_encoder, model_folder  # noqa: E402


def find_texts(n: int) -> tuple[list[str], list[tuple[str, str]], str] | None:
    """Real SST sentences and STS pairs from ../shared/data, else the demo data, else None."""
    env = os.environ.get("MINBERT_SHARED_DATA")
    for root in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        sst, sts = root / "cs224n" / "ids-sst-train.csv", root / "cs224n" / "sts-train.csv"
        if sst.is_file() and sts.is_file():
            s = pd.read_csv(sst, sep="\t", index_col=0).head(n)
            p = pd.read_csv(sts, sep="\t", index_col=0).head(n)
            return s["sentence"].str.strip().tolist(), list(zip(p["sentence1"], p["sentence2"])), str(root)
    demo = REPO / "data" / "demo"
    singles = sorted(demo.glob("*sst*train*")) if demo.is_dir() else []
    pairs = sorted(demo.glob("*sts*train*")) if demo.is_dir() else []
    if singles and pairs:
        s = pd.read_csv(singles[0], sep=None, engine="python").head(n)
        p = pd.read_csv(pairs[0], sep=None, engine="python").head(n)
        return s["sentence"].astype(str).tolist(), list(zip(p["sentence1"], p["sentence2"])), str(demo)
    return None


def make_batches(tok: Tokenizer, singles, pairs, batch_size: int, n_batches: int):
    """Alternate single-sentence (SST) and pair (STS) batches, as multi-task training does."""
    batches = []
    for i in range(n_batches):
        lo = (i // 2) * batch_size
        if i % 2 == 0:
            batches.append(tok(singles[lo:lo + batch_size]))
        else:
            chunk = pairs[lo:lo + batch_size]
            batches.append(tok([a for a, _ in chunk], [b for _, b in chunk]))
    return batches


class Runner:
    """One model's training step and inference pass, in a uniform form for both implementations."""

    def __init__(self, name, model, is_ours):
        self.name, self.model, self.is_ours = name, model, is_ours
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def pooled(self, batch):
        out = self.model(**batch)
        return out[1] if self.is_ours else out.pooler_output

    def train_step(self, batch, autocast):
        self.model.train()
        with autocast():
            loss = self.pooled(batch).float().square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def infer(self, batch, autocast):
        self.model.eval()
        with torch.inference_mode(), autocast():
            self.pooled(batch)


def time_call(fn, batch, autocast) -> float:
    t0 = time.perf_counter()
    fn(batch, autocast)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batches", type=int, default=4, help="batches per timed pass")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; cells are medians")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", default="auto", help="comma-separated rows; auto: the fp32 rows, and the bf16 "
                    "rows where the CPU computes bf16 natively (emulated bf16 is about 4x slower than fp32)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 batches, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.rounds = 2, 2

    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    texts = find_texts(args.batches * args.batch_size)
    if texts is None:
        print("no data: neither ../shared/data (MINBERT_SHARED_DATA) nor data/demo is present; skipping")
        return 0
    singles, pairs, source = texts
    folder = model_folder(args.model)
    tok = Tokenizer(folder, max_length=args.max_length)
    batches = make_batches(tok, singles, pairs, args.batch_size, args.batches)

    ours, _, _ = load_encoder(folder)
    ref = transformers.BertModel.from_pretrained(str(folder), attn_implementation="sdpa")
    runners = [Runner("ours", ours, True), Runner("transformers", ref, False)]

    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    rows = {
        "train-fp32": ("train_step", nullcontext), "train-bf16": ("train_step", bf16),
        "infer-fp32": ("infer", nullcontext), "infer-bf16": ("infer", bf16),
    }
    native = cpu_has_native_bf16()
    if args.rows == "auto":
        chosen = [r for r in rows if r.endswith("fp32") or native]
        if not native:
            print("bf16 rows skipped: this CPU emulates bf16 (no avx512_bf16 / amx_bf16), several times slower than "
                  "fp32; ask for them with --rows train-bf16,infer-bf16")
    else:
        chosen = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in chosen if r not in rows]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {list(rows)}")

    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"model {args.model} ({folder}); data {source}; batch {args.batch_size}, {args.batches} batches "
          f"({tokens} real tokens, mean padded length "
          f"{statistics.mean(b['input_ids'].shape[1] for b in batches):.1f}); threads {args.threads}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}")

    # warm-up: untimed calls of every row for both models (allocator, oneDNN kernels)
    for row in chosen:
        method, autocast = rows[row]
        for r in runners:
            for b in batches[:2]:
                time_call(getattr(r, method), b, autocast)

    # seconds[row][name][round]: each batch runs for both models back to back (order alternating),
    # so a burst of load from other processes lands on both nearly equally
    seconds = {row: {r.name: [0.0] * args.rounds for r in runners} for row in chosen}
    n_examples = sum(b["input_ids"].shape[0] for b in batches)
    with tqdm(total=args.rounds * len(chosen) * len(batches), desc="timing", unit="batch") as bar:
        for rnd in range(args.rounds):
            for row in chosen:
                method, autocast = rows[row]
                for i, b in enumerate(batches):
                    for r in (runners if (rnd + i) % 2 == 0 else runners[::-1]):
                        seconds[row][r.name][rnd] += time_call(getattr(r, method), b, autocast)
                    bar.update()

    print(f"\n{'row':<12}{'ours ex/s':>11}{'ref ex/s':>11}{'ratio':>8}{'ratio min-max':>16}{'ref spread':>12}")
    for row in chosen:
        o, t = seconds[row]["ours"], seconds[row]["transformers"]
        per_round = [b / a for a, b in zip(o, t)]  # ours/reference throughput, round by round
        mo, mt = n_examples / statistics.median(o), n_examples / statistics.median(t)
        # spread: (slowest - fastest) / median round of the reference, how noisy the machine was
        spread = (max(t) - min(t)) / statistics.median(t)
        emulated = "  (bf16 emulated on this CPU)" if row.endswith("bf16") and not native else ""
        print(f"{row:<12}{mo:>11.1f}{mt:>11.1f}{statistics.median(per_round):>8.2f}"
              f"{min(per_round):>8.2f}-{max(per_round):<7.2f}{spread:>12.0%}{emulated}")
    print("ratio: median over rounds of ours/reference throughput; ex/s: examples over the median round time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
