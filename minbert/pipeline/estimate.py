"""How long a params file's pipeline will take on this machine, said before it starts
(`minbert estimate`): every training run's planned updates, as its loop will plan them
(minbert.train.training.Plan, on the training rows its data holds after its downsampling), and
every dev evaluation, pretraining step and prediction, each priced by the encoder's step time
measured here, now, at two batch sizes (t(n) = a + b·n sentences of the data's typical length,
forward and backward or forward alone).

The step time is the eager one (a GPU's captured step is faster), one job at a time, so the figure
is an estimate of the work, not of a run that shares the device between jobs. Rows come from
`results/data/summary.json` when prepare has run, else from the raw files' lines.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.tasks import TASKS
from minbert.data.downsample import target_sizes
from minbert.params.catalogue import LoadedParams

LENGTH = 32             # word pieces of a typical sentence of the CS224N data (a pair's cross-encoding: twice)
STARTUP = 6.0           # seconds a job spends starting, loading its model and data, writing its outputs
PREDICT_BATCH = 128


@dataclass
class StepCost:
    """Seconds of one encoder pass over n sentences: a + b·n (forward and backward, or forward alone)."""
    train: tuple[float, float]
    forward: tuple[float, float]

    def of(self, n: float, train: bool = True) -> float:
        a, b = self.train if train else self.forward
        return a + b * n if n else 0.0


@dataclass
class Estimate:
    seconds: dict = field(default_factory=dict)       # stage -> seconds
    updates: int = 0                                  # fine-tuning and head re-training updates
    jobs: int = 0
    longest: list = field(default_factory=list)       # [(seconds, job)], the longest first

    def add(self, stage: str, job: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds + STARTUP
        self.jobs += 1
        self.longest.append((seconds + STARTUP, f"{stage} {job}"))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def typical_length(lp: LoadedParams, model: str, sample: int = 400) -> int:
    """Word pieces of a typical sentence of the params' data (the mean over the first `sample`
    training rows of each CS224N file of the tasks its experiments train, [CLS] and [SEP] included, rounded
    up); LENGTH where the data has none. Batches are padded to their longest row but the encoder
    skips the padding, so a pass costs about what its sentences' real lengths do."""
    from minbert.core.errors import MinBertError
    from minbert.core.models import model_folder
    from minbert.data.raw import raw_path, read_cs224n
    from minbert.model.tokenizer import Tokenizer

    lengths = []
    used = {t for exp in lp.experiments.values() for t in exp.finetune.tasks}
    for name, task in TASKS.items():
        path = Path(raw_path(lp.params.data.dir, name, "train")) if task.format == "cs224n" and name in used else None
        if path is None or not path.is_file():
            continue
        try:
            frame, _ = read_cs224n(path, name, labelled=True, on_bad_rows="drop")
        except MinBertError:
            continue                                  # prepare says what is wrong with it
        if not lengths:
            tokenizer = Tokenizer(model_folder(model), 512)
        for column in task.text_columns:
            lengths += [len(ids) for ids, _ in tokenizer.encode(frame[column].head(sample).astype(str).tolist())]
    return max(4, math.ceil(sum(lengths) / len(lengths))) if lengths else LENGTH


def measure(model: str, device: str = "auto", precision: str = "auto", threads: int | None = None,
            length: int = LENGTH) -> StepCost:
    """The encoder's pass time at 8 and 32 sentences of `length` word pieces on this machine's device."""
    import torch

    from minbert.core.runtime import autocast, pick_device, precision_on, set_threads
    from minbert.model.weights import load_encoder

    set_threads(threads)
    dev = pick_device(device)
    bf16 = precision_on(precision, dev) == "bf16"
    encoder, _, _ = load_encoder(model)
    encoder.to(dev)
    fits = {}
    for train in (True, False):
        times = []
        for n in (8, 32):
            ids = torch.randint(1000, 20000, (n, length), device=dev)
            mask = torch.ones_like(ids)
            encoder.train(train)

            def step():
                with torch.set_grad_enabled(train), autocast(dev, bf16):
                    out = encoder(ids, mask)
                    hidden = out[0] if isinstance(out, tuple) else getattr(out, "last_hidden_state", out)
                    if train:
                        hidden.float().mean().backward()
            step()                                   # warm-up
            reps = 3
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / reps)
            encoder.zero_grad(set_to_none=True)
        b = max((times[1] - times[0]) / 24, 1e-9)
        fits[train] = (max(times[0] - 8 * b, 0.0), b)
    return StepCost(train=fits[True], forward=fits[False])


def train_rows(lp: LoadedParams, layout=None) -> dict[str, dict[str, int]]:
    """{split: {task: rows}} of the prepared data (summary.json), else counted in the raw files."""
    from minbert.data.raw import RAW_SPLITS, raw_path

    rows: dict[str, dict[str, int]] = {s: {} for s in RAW_SPLITS}
    for task in TASKS:
        for split in RAW_SPLITS:
            path = Path(raw_path(lp.params.data.dir, task, split))
            if path.is_file():
                with open(path, "rb") as f:
                    rows[split][task] = max(sum(1 for _ in f) - 1, 0)
    if lp.params.data.nli_file and Path(lp.params.data.nli_file).is_file():
        with open(lp.params.data.nli_file, "rb") as f:
            rows["train"]["nli"] = sum(1 for _ in f)
    return rows


def sentences(task: str, heads) -> int:
    """Sentences an example costs: 1 for one sentence, 2 for a pair (read apart, or cross-encoded at
    twice the length), 3 for a hybrid pair (both)."""
    if task not in TASKS or not TASKS[task].pair:
        return 1
    return 3 if task in getattr(heads, "hybrid", ()) else 2


def fit_seconds(cfg, tasks: list[str], sizes: dict[str, int], dev_rows: dict[str, int], cost: StepCost,
                seed: int) -> tuple[float, int]:
    """(seconds, updates) of one training run as its loop plans it."""
    from minbert.train.training import Plan

    tasks = [t for t in tasks if sizes.get(t)]
    if not tasks:
        return 0.0, 0
    target = target_sizes({t: sizes[t] for t in tasks}, cfg.downsample)
    plan = Plan.build(cfg, tasks, target, seed)
    frozen = cfg.freeze_encoder
    # a frozen encoder's outputs are computed once, but where dropout, SMART or a task's own layers
    # (extra_layers: its branch) make them differ each time (minbert.train.frozen.cacheable)
    cached = {t for t in tasks if frozen and not cfg.frozen_encoder_dropout and not cfg.smart.enabled
              and t not in cfg.heads.extra_layers}
    smart = set(cfg.smart.tasks or tasks) if cfg.smart.enabled else set()
    seconds = 0.0
    for updates in plan.epochs.values():
        for update in updates:
            for task in update:
                if task in cached:
                    continue
                n = cfg.batch_size * sentences(task, cfg.heads)
                trains = not frozen or task in cfg.heads.extra_layers      # a branch's layers train
                seconds += cost.of(n, train=trains) * (3 if task in smart else 1)
    # the cached tasks' features, once per split
    seconds += sum(cost.of(target[t] * sentences(t, cfg.heads), train=False) for t in cached)
    evaluations = len(plan.phases) * cfg.epochs * getattr(cfg, "evals_per_epoch", 1)
    cap = getattr(cfg, "dev_size", None)
    dev = {t: min(dev_rows.get(t, 0), cap or dev_rows.get(t, 0)) * sentences(t, cfg.heads) for t in tasks}
    seconds += sum(_batched(dev[t], cost) for t in cached)
    seconds += evaluations * _batched(sum(n for t, n in dev.items() if t not in cached), cost)
    return seconds, plan.total_updates


def _batched(n_sentences: float, cost: StepCost) -> float:
    batches = math.ceil(n_sentences / PREDICT_BATCH)
    return cost.of(PREDICT_BATCH, train=False) * batches


def pretrain_seconds(pre, train: dict[str, int], dev: dict[str, int], cost: StepCost, finetune, seed: int) -> float:
    """Seconds of one pretraining (`pre`; paraphrase first: one fine-tuning on para with `finetune`)."""
    if pre.kind == "mlm":
        sizes = {t: train.get(t, 0) for t in pre.mlm.tasks}
        n = sum(target_sizes(sizes, pre.mlm.downsample).values())
        return pre.epochs * math.ceil(n / pre.batch_size) * cost.of(pre.batch_size)
    if pre.kind == "nli":
        return pre.epochs * math.ceil(train.get("nli", 0) / pre.batch_size) * cost.of(3 * pre.batch_size)
    return fit_seconds(finetune.model_copy(update={"epochs": pre.epochs}), ["para"], train, dev, cost, seed)[0]


def estimate(lp: LoadedParams, cost: StepCost) -> Estimate:
    """The pipeline's work (see the module docstring), stage by stage."""
    from minbert.params.resolve import retrain_settings

    rows = train_rows(lp)
    train, dev, test = rows["train"], rows["dev"], rows["test"]
    out = Estimate()
    pretrainings = {exp.pretrain for exp in lp.experiments.values() if exp.pretrain}
    for name in sorted(pretrainings):
        out.add("pretrain", name, pretrain_seconds(lp.params.pretrainings[name], train, dev, cost, lp.base.finetune,
                                                   lp.base.seed))
    for name, exp in lp.experiments.items():
        seconds, updates = fit_seconds(exp.finetune, exp.finetune.tasks, train, dev, cost, exp.seed)
        out.add("finetune", name, seconds)
        out.updates += updates
        if exp.retrain_heads.enabled:
            rs = retrain_settings(exp)
            seconds, updates = fit_seconds(rs.train, rs.train.tasks, train, dev, cost, exp.seed)
            out.add("retrain_heads", name, seconds)
            out.updates += updates
        tasks = list(dict.fromkeys([*exp.finetune.tasks, *(exp.retrain_heads.tasks or [])]))
        n = sum((dev.get(t, 0) + (test.get(t, 0) if exp.predict_test else 0)) * sentences(t, exp.finetune.heads)
                for t in tasks)
        out.add("predict", name, _batched(n, cost))
    out.longest.sort(reverse=True)
    return out


def fmt_seconds(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def busy_note(device_type: str, load: float | None = None, cores: int | None = None) -> str | None:
    """A line saying the CPU's cores were busy when the step time was measured (the 1-minute load
    average at least half the cores this process may use), or None: a busy machine measures a slower
    step, and the estimate would price the jobs as if they had to share the cores all along."""
    import os

    if device_type != "cpu":
        return None
    load = os.getloadavg()[0] if load is None else load
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    if load < cores / 2:
        return None
    return (f"the cores were busy while the step time was measured (load average {load:.1f} on {cores} cores): "
            f"the estimate is of a machine this busy; measure again on idle cores")


def describe(est: Estimate, where: str) -> str:
    """The estimate in a few lines."""
    stages = ", ".join(f"{s} {fmt_seconds(v)}" for s, v in sorted(est.seconds.items(), key=lambda kv: -kv[1]))
    longest = "; ".join(f"{job} {fmt_seconds(s)}" for s, job in est.longest[:3])
    return (f"about {fmt_seconds(est.total)} of work on {where}, one job at a time: {est.jobs} jobs, "
            f"{est.updates:,} training updates ({stages}); the longest: {longest}")
