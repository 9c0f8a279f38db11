"""What work costs on this machine, measured through the pipeline's own code, for `minbert estimate`
(minbert.pipeline.estimate): a training update of the path the jobs will take (the batch drawn as
the loop draws it, the step captured on CUDA where the run allows it, eager otherwise), an evaluation
pass, the checkpoints a run writes, and a job's start-up in a fresh Python."""
from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.io import torch_save
from minbert.core.models import model_folder
from minbert.core.tasks import TASKS
from minbert.params.catalogue import LoadedParams
from minbert.params.finetune import FinetuneParams
from minbert.train.points import EVAL_BATCH_SIZE as EVAL_BATCH   # what the estimate prices: the loop's batches

LENGTH = 32             # word pieces of a typical sentence of the CS224N data (a pair's cross-encoding: twice)


@dataclass
class StepCost:
    """What work costs here (`measure`): seconds of one training update over n sentences (a + b·n:
    its batch drawn, the step), of an evaluation batch of n (a + b·n), of a checkpoint (the
    resumable state and a best model written), of a network job's start-up (Python, its imports,
    the model loaded) and another job's, and of recording a CUDA graph (0 off CUDA)."""
    train: tuple[float, float]
    forward: tuple[float, float]
    checkpoint: float = 0.0
    startup: float = 0.0
    light_startup: float = 0.0
    capture: float = 0.0
    length: float = 0.0             # word pieces of the sentences measured (0: unknown; every task weighs 1)
    lengths: dict = field(default_factory=dict)   # task -> word pieces of its typical sentence (`task_lengths`)

    def of(self, n: float, train: bool = True) -> float:
        a, b = self.train if train else self.forward
        return a + b * n if n else 0.0

    def weight(self, task: str, max_length: int | None = None) -> float:
        """What a sentence of `task` costs against a measured one: its typical length (cut to
        `max_length`) over the length measured; 1 where either is unknown (a long review weighs
        several SST sentences)."""
        n = self.lengths.get(task)
        if not n or not self.length:
            return 1.0
        return min(n, max_length or n) / self.length


def typical_length(lp: LoadedParams, model: str, sample: int = 400) -> int:
    """Word pieces of a typical sentence of the params' data: the mean of `task_lengths` over the
    leaderboard's tasks where the experiments train any (a task of long texts, CFIMDB's reviews, is
    priced by its own length, StepCost.weight), over all their tasks otherwise, rounded up; LENGTH
    where the data has none."""
    lengths = task_lengths(lp, model, sample)
    counts = {t: n for t, (n, _) in lengths.items()}
    chosen = [t for t in lengths if t in LEADERBOARD] or list(lengths)
    total = sum(counts[t] for t in chosen)
    return max(4, math.ceil(sum(lengths[t][1] * counts[t] for t in chosen) / total)) if total else LENGTH


LEADERBOARD = ("sst", "para", "sts")


def task_lengths(lp: LoadedParams, model: str, sample: int = 400) -> dict[str, tuple[int, float]]:
    """Per task its experiments train: (sentences read, their mean word pieces), over the first
    `sample` training rows of its CS224N file, [CLS] and [SEP] included. Batches are padded to their
    longest row but the encoder skips the padding, so a pass costs about what its sentences' real
    lengths do."""
    from minbert.data.raw import raw_path, read_cs224n
    from minbert.model.tokenizer import Tokenizer

    out: dict[str, tuple[int, float]] = {}
    tokenizer = None
    used = {t for exp in lp.experiments.values() for t in exp.finetune.tasks}
    for name, task in TASKS.items():
        path = Path(raw_path(lp.params.data.dir, name, "train")) if task.format == "cs224n" and name in used else None
        if path is None or not path.is_file():
            continue
        try:
            frame, _ = read_cs224n(path, name, labelled=True, on_bad_rows="drop")
        except MinBertError:
            continue                                  # prepare says what is wrong with it
        tokenizer = tokenizer or Tokenizer(model_folder(model), 512)
        lengths = [len(ids) for column in task.text_columns
                   for ids, _ in tokenizer.encode(frame[column].head(sample).astype(str).tolist())]
        if lengths:
            out[name] = (len(lengths), sum(lengths) / len(lengths))
    return out


def _startup(code: str, cpu: bool = False) -> float:
    """Seconds a fresh Python takes to run `code` (a stage's imports): what each job pays first; its
    CPU seconds with `cpu`."""
    def used() -> float:
        if not cpu:
            return time.perf_counter()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    t0 = used()
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, timeout=300)
    return used() - t0


class _Probe:
    """A fine-tuning run of one model on sentences of one length, measured (`measure`)."""

    def __init__(self, model: str, device, precision: str, length: int, cuda_graphs: bool, clock):
        import pandas as pd
        import torch

        from minbert.model.tokenizer import Tokenizer
        from minbert.model.weights import load_encoder

        self.device, self.precision, self.cuda_graphs, self.clock = device, precision, cuda_graphs, clock
        self.cuda = device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if self.cuda else (lambda: None)
        t0 = clock()
        self.encoder, _, folder = load_encoder(model)
        self.load_seconds = clock() - t0
        self.tok = Tokenizer(folder, max(16, length))
        self.frame = pd.DataFrame({"id": [str(i) for i in range(512)],
                                   "sentence": [" ".join(["the"] * (length - 2))] * 512,
                                   "label": np.random.default_rng(0).integers(0, 5, 512)})

    def updates(self, n: int, tmp: Path, checkpoint: bool = False) -> tuple[float, float, float]:
        """(the first two updates' seconds, an update's, and with `checkpoint` a checkpoint's) at
        batches of n sentences: minbert.train.loop's own start_run, batches and update."""
        from minbert.data.batches import build_task_data
        from minbert.model.checkpoint import checkpoint_dict
        from minbert.model.multitask import MultitaskModel
        from minbert.train import loop
        from minbert.train.training import FitOptions, TrainState

        cfg = FinetuneParams(tasks=["sst"], batch_size=n, epochs=1, downsample={"mode": "none"})
        self.heads = cfg.heads
        self.net = MultitaskModel(self.encoder, cfg.heads, ["sst"])
        options = FitOptions(tmp / f"out{n}", device=self.device, bf16=self.precision == "bf16",
                             fp16=self.precision == "fp16", progress=False, cuda_graphs=self.cuda_graphs)
        data = {"sst": build_task_data("sst", self.frame, self.tok, cfg.heads)}
        tr, plan = loop.start_run(self.net, self.tok, data, {}, cfg, options)
        state, clock = TrainState(), self.clock
        streams = loop.epoch_streams(tr, state, plan)
        loop.train_mode(tr)

        def update():
            loop.update(tr, state, plan, *loop.draw_update(streams, ("sst",)))
        t0 = clock()
        update()                                 # the first: eager, the shape probed (and recorded on CUDA)
        update()                                 # the second: the update recorded on CUDA
        self.sync()
        first = clock() - t0
        if self.cuda:                            # a captured update: a mean over many, no sync between
            t0 = clock()
            for _ in range(20):
                update()
            self.sync()
            each = (clock() - t0) / 20
        else:                                    # the median of single updates: a busy machine's outliers out
            times = []
            for _ in range(5):
                t0 = clock()
                update()
                times.append(clock() - t0)
            each = sorted(times)[2]
        if not checkpoint:
            return first, each, 0.0
        t0 = clock()
        loop.save_state(tr, state)
        torch_save(checkpoint_dict(self.net, self.tok), tmp / "best.pt")
        return first, each, clock() - t0

    def evaluation(self, rows: int) -> float:
        """Seconds of the evaluation pass (predict_task, batches of 128) over `rows` sentences."""
        from minbert.core.runtime import autocast
        from minbert.data.batches import build_task_data
        from minbert.model.multitask import predict_task

        self.net.eval()
        part = build_task_data("sst", self.frame.head(rows), self.tok, self.heads)
        amp = lambda: autocast(self.device, self.precision)
        predict_task(self.net, part, self.tok, EVAL_BATCH, self.device, amp)          # warm
        t0 = self.clock()
        predict_task(self.net, part, self.tok, EVAL_BATCH, self.device, amp)
        self.sync()
        return self.clock() - t0


def measure(model: str, device: str = "auto", precision: str = "auto", threads: int | None = None,
            length: int = LENGTH, cuda_graphs: bool = True, cpu_time: bool = False) -> StepCost:
    """This machine's costs (StepCost) through the pipeline's own code: a fine-tuning run of the model
    on sentences of `length` word pieces (minbert.train.loop; each update its batch drawn and the
    step the run takes here, captured on CUDA unless `cuda_graphs` is off) at 8 and 32 sentences
    (the median of 5 updates each on a CPU), its evaluation pass over 128 and 512, its checkpoints
    written, and the start-up of a job in a fresh Python. `cpu_time`: in CPU seconds (every
    thread's) instead of wall seconds: on a CPU that other work shares, about what one thread a job
    would take on idle cores."""
    from minbert.core.runtime import configure_precision, pick_device, set_threads

    set_threads(threads)
    dev = pick_device(device)
    probe = _Probe(model, dev, configure_precision(dev, precision), length, cuda_graphs,
                   time.process_time if cpu_time else time.perf_counter)
    with tempfile.TemporaryDirectory() as tmp:
        first, t8, _ = probe.updates(8, Path(tmp))
        _, t32, checkpoint = probe.updates(32, Path(tmp), checkpoint=True)
    e128, e512 = probe.evaluation(128), probe.evaluation(512)
    b, fb = max((t32 - t8) / 24, 1e-9), max((e512 - e128) / 384, 1e-9)
    capture = max(first - 2 * t8, 0.0) if probe.cuda and cuda_graphs else 0.0
    startup = _startup("import minbert.train.experiment, minbert.scoring.predict", cpu_time) + probe.load_seconds
    light = _startup("import minbert.scoring.evaluate, minbert.scoring.ensemble", cpu_time)
    return StepCost(train=(max(t8 - 8 * b, 0.0), b), forward=(max(e128 - 128 * fb, 0.0), fb), checkpoint=checkpoint,
                    startup=startup, light_startup=light, capture=capture)


def busy_note(device_type: str, load: float | None = None, cores: int | None = None) -> str | None:
    """A line saying the CPU's cores were busy when the step time was measured (the 1-minute load
    average at least half the cores this process may use), or None: a busy machine measures a slower
    step, and the estimate would price the jobs as if they had to share the cores all along."""
    if device_type != "cpu":
        return None
    load = os.getloadavg()[0] if load is None else load
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    if load < cores / 2:
        return None
    return (f"the cores were busy while the step time was measured (load average {load:.1f} on {cores} cores): "
            f"the estimate is of a machine this busy; measure again on idle cores")
