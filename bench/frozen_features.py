"""Frozen-encoder training with and without the stored embeddings (minbert.train.frozen).

    python bench/frozen_features.py            # 200 training / 100 dev rows per task, 10 epochs, 2 rounds
    python bench/frozen_features.py --quick    # smoke run: 32 / 16 rows, 2 epochs, 1 round

Two jobs, each run both ways in turn (the order alternating per round, so load from other
processes hits both alike), as params/full.yaml runs them but with the packaged MiniLM: the frozen
baseline (p000_baseline: `finetune.freeze_encoder`, task-by-task, [u, v] pair heads, 10 epochs over
the smallest task) and a head retraining over a fine-tuned model (`retrain_heads`: 10 epochs,
task-by-task, the papers' default heads). `cached` is
the pipeline as it is; `uncached` runs the encoder on every batch (minbert.train.frozen.cacheable
patched to False), as before. Real SST / Quora / STS rows from ../shared/data (data/demo when
absent). Prints each job's median seconds over the rounds (the whole fit, dev evaluation included,
not the model loading) and the median of the per-round ratios uncached / cached.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import minbert.train.frozen as frozen  # noqa: E402
from minbert.data.raw import raw_path, read_cs224n  # noqa: E402
from minbert.data.read import write_split  # noqa: E402
from minbert.params import ExperimentParams  # noqa: E402
from minbert.params.resolve import finetune_settings, retrain_settings  # noqa: E402
from minbert.train.experiment import finetune_experiment, retrain_heads_experiment  # noqa: E402
from minbert.train.training import FitOptions  # noqa: E402

TASKS = ("sst", "para", "sts")


def prepare(out: Path, n_train: int, n_dev: int) -> str:
    shared = REPO.parent / "shared" / "data" / "cs224n"
    src = shared if raw_path(shared, "sst", "train").is_file() else REPO / "data" / "demo"
    for task in TASKS:
        for split, n in (("train", n_train), ("dev", n_dev)):
            frame, _ = read_cs224n(raw_path(src, task, split), task, on_bad_rows="drop")
            write_split(frame.head(n), out / f"{task}-{split}.tsv")
    return str(src)


def experiment(threads: int, epochs: int, model: str) -> ExperimentParams:
    return ExperimentParams.model_validate({
        "model": model, "device": "cpu", "precision": "fp32", "threads": threads, "seed": 11711,
        "max_length": 128,
        "finetune": {"epochs": epochs, "batch_size": 8, "lr": 1e-3, "freeze_encoder": False, "schedule": "task_by_task",
                     "downsample": {"mode": "none"}, "heads": {"para": "concat_uv", "sts": "concat_uv"}},
        "retrain_heads": {"enabled": True, "epochs": epochs, "batch_size": 8, "lr": 1e-3, "schedule": "task_by_task"}})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=200)
    ap.add_argument("--dev", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="the checkpoint both jobs fine-tune")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.train, args.dev, args.epochs, args.rounds = 32, 16, 2, 1
    exp = experiment(args.threads, args.epochs, args.model)
    frozen_exp = exp.model_copy(update={"finetune": exp.finetune.model_copy(update={"freeze_encoder": True}),
                                        "retrain_heads": exp.retrain_heads.model_copy(update={"enabled": False})})
    real_cacheable = frozen.cacheable
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = prepare(tmp / "data", args.train, args.dev)
        print(f"data: {src}, {args.train} train / {args.dev} dev rows per task, {args.epochs} epochs; "
              f"torch {torch.__version__}, threads {args.threads}, fp32", flush=True)
        # the fine-tuned model a head retraining starts from (not timed): one short unfrozen epoch
        warm = exp.model_copy(update={"finetune": exp.finetune.model_copy(update={"epochs": 1, "max_steps_per_epoch": 3})})
        finetune_experiment(finetune_settings(warm), tmp / "data", FitOptions(tmp / "ft"))
        jobs = {
            "frozen baseline": lambda out: finetune_experiment(finetune_settings(frozen_exp), tmp / "data",
                                                               FitOptions(out, resume=False)),
            "retrain heads": lambda out: retrain_heads_experiment(retrain_settings(exp), tmp / "ft" / "model.pt",
                                                                  tmp / "data", FitOptions(out, resume=False)),
        }
        for r in range(args.rounds):
            ways = ["cached", "uncached"] if r % 2 == 0 else ["uncached", "cached"]
            for job, run in jobs.items():
                for way in ways:
                    frozen.cacheable = real_cacheable if way == "cached" else (lambda *a, **k: False)
                    t0 = time.perf_counter()
                    run(tmp / f"{job}-{way}-{r}".replace(" ", "_"))
                    times.setdefault((job, way), []).append(time.perf_counter() - t0)
                    print(f"round {r + 1}: {job}, {way}: {times[(job, way)][-1]:.1f} s", flush=True)
        frozen.cacheable = real_cacheable
    print(f"\n| job | cached s | uncached s | uncached / cached (median, min-max over {args.rounds} rounds) |")
    print("|---|---|---|---|")
    for job in jobs:
        c, u = times[(job, "cached")], times[(job, "uncached")]
        ratios = [b / a for a, b in zip(c, u)]
        print(f"| {job} | {statistics.median(c):.1f} | {statistics.median(u):.1f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
