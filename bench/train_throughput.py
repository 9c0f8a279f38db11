"""Multi-task training throughput: our loop against a plain transformers.BertModel loop doing the same work.

    python bench/train_throughput.py            # full run (a few minutes on 2 CPU cores)
    python bench/train_throughput.py --quick    # smoke run

"The same work": the packaged all-MiniLM-L6-v2 weights, the same real SST / Quora / STS training
rows (../shared/data, else data/demo), the same batch size and number of updates, round-robin over
the three tasks (one update per task per step), the same heads (a linear layer on [CLS]: 5 logits
for SST, one logit for the cross-encoded "[CLS] a [SEP] b [SEP]" paraphrase pair, one score for the
cross-encoded STS pair), the same losses (cross-entropy, BCE, MSE on label / 5), AdamW with
gradient clipping at 1.0.

- ours: minbert's encoder and multi-task model, the sentences tokenised once up front (as the
  finetune stage does, through its token cache), `minbert.data.batches.TaskStream` batches (length-bucketed,
  so little padding), fused AdamW (`minbert.train.optim.build_adamw`).
- reference: the common CS224N starter style: randomly shuffled batches, each tokenised in the loop
  by `BertTokenizerFast(..., padding=True, truncation=True)` (padding to the longest in the batch),
  `transformers.BertModel`, `torch.optim.AdamW` with its defaults (not fused).

Rounds alternate which loop goes first, so load from other processes hits both alike; each number
is the median over rounds of training examples (sentences or pairs) per second.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from minbert.data.batches import Collator, build_task_data, to_device  # noqa: E402
from minbert.data.raw import raw_path, read_cs224n  # noqa: E402
from minbert.data.stream import TaskStream  # noqa: E402
from minbert.model.multitask import MultitaskModel  # noqa: E402
from minbert.model.tokenizer import Tokenizer  # noqa: E402
from minbert.model.weights import load_encoder, model_folder  # noqa: E402
from minbert.params import HeadsParams  # noqa: E402
from minbert.train.losses import task_loss  # noqa: E402
from minbert.train.optim import build_adamw  # noqa: E402

TASKS = ("sst", "para", "sts")
HEADS = HeadsParams(pooling="cls", para="cross", sts="cross", dropout=0.1)


def load_frames(n: int):
    """The first n training rows per task, validated as the prepare stage does."""
    shared = REPO.parent / "shared" / "data" / "cs224n"
    src = shared if raw_path(shared, "sst", "train").is_file() else REPO / "data" / "demo"
    return {t: read_cs224n(raw_path(src, t, "train"), t, on_bad_rows="drop")[0].head(n).reset_index(drop=True)
            for t in TASKS}, src


# ---------------------------------------------------------------- ours

class Ours:
    def __init__(self, folder, frames, batch_size, max_length, device, seed=0):
        encoder, _, _ = load_encoder(folder)
        self.tok = Tokenizer(folder, max_length)
        torch.manual_seed(seed)
        self.model = MultitaskModel(encoder, HEADS, list(TASKS)).to(device)
        t0 = time.perf_counter()
        self.data = {t: build_task_data(t, f, self.tok, HEADS) for t, f in frames.items()}
        self.tokenise_seconds = time.perf_counter() - t0
        collator = Collator(self.tok)
        self.streams = {t: TaskStream(d, collator, batch_size, seed + i, 0)
                        for i, (t, d) in enumerate(self.data.items())}
        m = self.model
        self.opt = build_adamw([([(n, p) for n, p in m.named_parameters()], 2e-5)], 0.01)
        self.device = device

    def update(self, task: str) -> int:
        batch = to_device(self.streams[task].next(), self.device)
        labels = batch.pop("labels")
        self.opt.zero_grad(set_to_none=True)
        task_loss(task, HEADS, self.model(task, batch), labels).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return len(labels)


# ---------------------------------------------------------------- reference (transformers)

class Reference:
    def __init__(self, folder, frames, batch_size, max_length, device, seed=0):
        from transformers import BertModel, BertTokenizerFast

        self.tok = BertTokenizerFast.from_pretrained(folder)
        self.bert = BertModel.from_pretrained(folder, add_pooling_layer=False, attn_implementation="sdpa").to(device)
        H = self.bert.config.hidden_size
        self.drop = nn.Dropout(0.1)
        self.heads = nn.ModuleDict({"sst": nn.Linear(H, 5), "para": nn.Linear(H, 1), "sts": nn.Linear(H, 1)}).to(device)
        self.params = list(self.bert.parameters()) + list(self.heads.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=2e-5, weight_decay=0.01)
        self.frames, self.bs, self.max_length, self.device = frames, batch_size, max_length, device
        self.gen = torch.Generator().manual_seed(seed)
        self.order = {t: [] for t in TASKS}

    def next_rows(self, task):
        if len(self.order[task]) < self.bs:    # reshuffle when a pass is used up (a DataLoader with shuffle)
            self.order[task] = torch.randperm(len(self.frames[task]), generator=self.gen).tolist()
        rows, self.order[task] = self.order[task][:self.bs], self.order[task][self.bs:]
        return self.frames[task].iloc[rows]

    def update(self, task: str) -> int:
        rows = self.next_rows(task)
        if task == "sst":
            enc = self.tok(rows["sentence"].tolist(), padding=True, truncation=True, max_length=self.max_length,
                           return_tensors="pt")
        else:
            enc = self.tok(rows["sentence1"].tolist(), rows["sentence2"].tolist(), padding=True, truncation=True,
                           max_length=self.max_length, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        labels = torch.tensor(rows["label"].to_numpy()).to(self.device)
        cls = self.drop(self.bert(**enc).last_hidden_state[:, 0])
        out = self.heads[task](cls)
        if task == "sst":
            loss = F.cross_entropy(out, labels.long())
        elif task == "para":
            loss = F.binary_cross_entropy_with_logits(out.squeeze(-1), labels.float())
        else:
            loss = F.mse_loss(out.squeeze(-1), labels.float() / 5.0)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        return len(rows)


# ---------------------------------------------------------------- timing

def timed_round(loop, steps: int, device) -> float:
    """Examples per second over `steps` round-robin steps (3 updates each)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    for _ in range(steps):
        for task in TASKS:
            n += loop.update(task)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def padding_share(tok_pad_batches) -> float:
    real = sum(int(b["attention_mask"].sum()) for b in tok_pad_batches)
    total = sum(b["attention_mask"].numel() for b in tok_pad_batches)
    return 1 - real / total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: small batches, 2 rounds")
    p.add_argument("--rows", type=int, default=None, help="training rows per task (default 2000, quick 200)")
    p.add_argument("--batch-size", type=int, default=None, help="default 32 (quick 8)")
    p.add_argument("--steps", type=int, default=None, help="round-robin steps per round (default 8, quick 2)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5, quick 2)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads; on a busy 2-core machine use 1 (a second thread mostly waits)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="the weights both loops start from (a name or a "
                                                               "folder with a tokenizer)")
    args = p.parse_args(argv)
    q = args.quick
    rows = args.rows or (200 if q else 2000)
    bs = args.batch_size or (8 if q else 32)
    steps = args.steps or (2 if q else 8)
    rounds = args.rounds or (2 if q else 5)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    folder = model_folder(args.model)
    frames, src = load_frames(rows)
    print(f"data: {src} ({', '.join(f'{t} {len(f)}' for t, f in frames.items())} rows); model: {folder.name}; "
          f"device {device}, {torch.get_num_threads()} threads; batch {bs}, {steps} steps x 3 tasks per round, "
          f"{rounds} rounds")
    ours = Ours(folder, frames, bs, args.max_length, device)
    print(f"ours: tokenised {sum(len(f) for f in frames.values())} rows up front in {ours.tokenise_seconds:.1f} s "
          f"(once per data set; cached on disk by the stages)")
    ref = Reference(folder, frames, bs, args.max_length, device)
    loops = {"ours": ours, "reference": ref}
    # warm-up (first-call allocations, kernel selection), not timed
    timed_round(ours, 1, device)
    timed_round(ref, 1, device)
    speeds = {k: [] for k in loops}
    for r in tqdm(range(rounds), desc="rounds", unit="round"):
        for name in (("ours", "reference") if r % 2 == 0 else ("reference", "ours")):
            speeds[name].append(timed_round(loops[name], steps, device))
    med = {k: statistics.median(v) for k, v in speeds.items()}
    # how much of each loop's batches is padding (one pass of batches per task)
    ours_batches = [ours.streams[t].next() for t in TASKS for _ in range(steps)]
    ref_batches = []
    for t in TASKS:
        for _ in range(steps):
            rws = ref.next_rows(t)
            cols = ["sentence"] if t == "sst" else ["sentence1", "sentence2"]
            ref_batches.append(ref.tok(*[rws[c].tolist() for c in cols], padding=True, truncation=True,
                                       max_length=args.max_length, return_tensors="pt"))
    print(f"{'loop':<10} {'examples/s':>11}  {'rounds':<30} padding")
    print(f"{'ours':<10} {med['ours']:>11.1f}  {' '.join(f'{s:.1f}' for s in speeds['ours']):<30} "
          f"{padding_share(ours_batches):.0%}")
    print(f"{'reference':<10} {med['reference']:>11.1f}  {' '.join(f'{s:.1f}' for s in speeds['reference']):<30} "
          f"{padding_share(ref_batches):.0%}")
    ratio = med["ours"] / med["reference"]
    print(f"ratio ours / reference: {ratio:.2f} (target >= 1.2)")
    return ratio


if __name__ == "__main__":
    main()
