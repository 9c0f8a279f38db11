"""The noise of dev evaluations, measured on a real fine-tune (docs/report.md, "The evaluations' noise").

    python scripts/evaluation_noise.py [--data ../shared/data/cs224n] [--lr 1e-4 --head-lr 2e-3] [--epochs 4]

Fine-tunes the packaged MiniLM on the three leaderboard tasks with the pipeline's own stages (prepare,
finetune) at a constant rate after a short warm-up, keeping every dev evaluation's predictions, then
splits the change of each task's dev metric between two successive evaluations of the last `--last`
(where the curve has stopped improving) into its two parts: a per-row part, read from random subsets of
100 and 300 of the rows scored (its variance falls as 1 / rows), and the model's own jitter, what is left
on the whole set. The report's `report.training_check.noise` takes both, by the task's kind. About 10
minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import math
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

PARAMS = """\
data: {{dir: {data}, on_bad_rows: drop}}
base:
  model: all-MiniLM-L6-v2
  device: cpu
  seed: 11711
  max_length: 128
  predict_test: false
  finetune:
    epochs: {epochs}
    batch_size: 16
    lr: {lr}
    head_lr: {head_lr}
    warmup_ratio: 0.05
    lr_schedule: constant
    schedule: round_robin
    epoch_unit: smallest
    downsample: {{caps: {{sst: {rows}, para: {rows}, sts: {rows}}}}}
    evals_per_epoch: {evals}
    dev_size: {dev_size}
    heads: {{pooling: mean, para: concat, sts: cosine}}
experiments:
  noise: {{description: "dev scored at every evaluation, its predictions kept"}}
"""


def metric(task: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """Pearson r for a regression (sts), accuracy otherwise."""
    return float(np.corrcoef(labels, predictions)[0, 1]) if task == "sts" else float(np.mean(labels == predictions))


def decompose(task: str, labels, predictions, subsets=(100, 300), draws: int = 300, seed: int = 0) -> dict:
    """A metric's change between successive evaluations (`predictions`: one array per evaluation, the
    same rows) split into its per-row part (the sd of a subset's change about the whole set's, times the
    square root of the subset's rows, finite-population corrected) and the jitter (the rest)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    rows, rng = len(labels), np.random.default_rng(seed)
    whole = np.array([metric(task, labels, p) for p in predictions])
    change = np.diff(whole)
    parts = []
    for size in (s for s in subsets if s < rows):
        spread = []
        for _ in range(draws):
            pick = rng.choice(rows, size, replace=False)
            sub = np.array([metric(task, labels[pick], p[pick]) for p in predictions])
            spread.append((np.diff(sub) - change) ** 2)
        parts.append(float(np.mean(spread)) * size / (1 - size / rows))
    per_row = math.sqrt(np.mean(parts)) if parts else float("nan")
    jitter = math.sqrt(max(float(np.mean(change ** 2)) - per_row ** 2 / rows, 0.0))
    out = {"rows": rows, "per_row": per_row, "jitter": jitter, "change": math.sqrt(float(np.mean(change ** 2))),
           "subsets": {s: math.sqrt(p) for s, p in zip((s for s in subsets if s < rows), parts)}}
    if task != "sts":
        right = predictions == labels
        out["flips"] = float(np.mean(right[1:] != right[:-1]))
    return out


def fine_tune(args, folder: Path) -> dict:
    """Run prepare and finetune on the real data, keeping each dev evaluation's predictions."""
    from minbert.train import evaluation
    from stages import finetune, prepare

    params = folder / "params.yaml"
    params.write_text(PARAMS.format(data=Path(args.data).resolve(), epochs=args.epochs, lr=args.lr,
                                    head_lr=args.head_lr, rows=args.train_rows, evals=args.evals,
                                    dev_size=args.dev_size))
    kept: dict = {}
    scored = evaluation.task_metric

    def keep(task, prediction, labels):         # every dev evaluation passes here, task by task
        kept.setdefault(task, {"labels": np.asarray(labels), "predictions": []})["predictions"].append(
            np.asarray(prediction).copy())
        return scored(task, prediction, labels)

    evaluation.task_metric = keep
    results = str(folder / "results")
    prepare.main(["--params", str(params), "--results", results])
    finetune.main(["--params", str(params), "--results", results, "--experiment", "noise"])
    return kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/cs224n", help="the CS224N data folder")
    ap.add_argument("--lr", type=float, default=1e-4, help="the encoder's rate (constant after a 5%% warm-up)")
    ap.add_argument("--head-lr", type=float, default=2e-3, help="the heads' rate")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--evals", type=int, default=4, help="dev evaluations an epoch")
    ap.add_argument("--train-rows", type=int, default=1000, help="training rows per task")
    ap.add_argument("--dev-size", type=int, default=1100, help="dev rows scored per task")
    ap.add_argument("--last", type=int, default=12, help="the evaluations read: the last N (the curve's plateau)")
    ap.add_argument("--keep", help="a file to keep the predictions in (pickle); read again instead of training")
    args = ap.parse_args(argv)
    if args.keep and Path(args.keep).is_file():
        kept = pickle.loads(Path(args.keep).read_bytes())
    else:
        if not Path(args.data).is_dir():
            print(f"no data folder {args.data}: give --data", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="evaluation_noise.") as work:
            kept = fine_tune(args, Path(work))
        if args.keep:
            Path(args.keep).write_bytes(pickle.dumps(kept))
    for task, run in kept.items():
        got = decompose(task, run["labels"], run["predictions"][-args.last:])
        at = {rows: math.sqrt(got["jitter"] ** 2 + got["per_row"] ** 2 / rows) for rows in (300, got["rows"])}
        flips = f", flip share {got['flips']:.3f} (square root {math.sqrt(got['flips']):.3f})" if "flips" in got else ""
        print(f"{task}: {got['rows']} rows, last {args.last} evaluations: per-row part {got['per_row']:.3f} "
              f"(subsets {', '.join(f'{s}: {v:.3f}' for s, v in got['subsets'].items())}), jitter {got['jitter']:.4f}; "
              f"change between evaluations {at[300]:.4f} at 300 rows, {at[got['rows']]:.4f} at {got['rows']}{flips}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
