"""The training step on a CUDA device: fixed shapes, each captured once in a CUDA graph and replayed.

A small model's step is bound by kernel launches and the Python between them, not by the GPU
(MiniLM at batch 32: about a thousand launches a step). So on CUDA a step is cut into parts whose
shapes are known ahead, each recorded once as a CUDA graph and then replayed with one launch:
- per task and batch shape (batches padded to a few fixed lengths, minbert.data.batches.bucket_length):
  the forward pass, the loss, its running totals (minbert.train.training.EpochTotals) and the
  backward pass, which adds into gradient tensors that live for the whole run;
- per set of tasks an update trains: gradient clipping, fused AdamW (minbert.train.optim, learning
  rates read from device tensors) over exactly the parameters those tasks give a gradient to (as
  AdamW skips parameters without one), and zeroing those gradients.
The optimiser's state stays the run's optimiser's, so checkpoints and resuming are as on every
other device. A shape first seen is warmed up eagerly on a side stream (with the RNGs
put back afterwards), captured, then replayed; dropout draws fresh masks at every replay (the
CUDA generator's offset advances). `capture=False` runs the very same parts eagerly: how the
tests check, on any device, that the parts compute the ordinary step.

Where the run needs what a graph cannot hold (PCGrad's per-task gradients, SMART's inner ascent
and momentum copy, the all-reduce under torchrun, a compiled encoder, gradient checkpointing,
gradient accumulation, fp16's loss scaling),
`why_not_captured` says so and the ordinary step (minbert.train.loop.train_step) runs.
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from minbert.core.settings import Finetune
from minbert.train.optim import set_lr

log = logging.getLogger("minbert.train.step")
WARMUP_STEPS = 2     # eager passes on a side stream before a capture (library handles, autograd's caches)
MAX_GRAPHS = 96      # captured forward-backward shapes per run; further shapes run eagerly


def why_not_captured(cfg: Finetune, world: int, precision: str = "bf16") -> str | None:
    """Why this run's steps cannot be captured (None: they can); `precision`: the one that runs."""
    if world > 1:
        return "data parallel runs all-reduce their gradients between the backward pass and the update"
    if cfg.pcgrad:
        return "PCGrad projects each task's gradient separately"
    if cfg.smart.enabled:
        return "SMART's inner ascent and momentum copy run outside a graph"
    if cfg.compile:
        return "the encoder is compiled (finetune.compile)"
    if cfg.gradient_checkpointing:
        return "gradient checkpointing recomputes activations in the backward pass"
    if cfg.gradient_accumulation_steps > 1:
        return "gradient accumulation weighs each micro-batch by its share of a batch whose size varies"
    if precision == "fp16":
        return "fp16's gradient scaler reads the gradients' overflow check on the host before each step"
    return None


class _Shape:
    """One captured forward-backward: its static inputs, its output, its graph."""

    def __init__(self, host: dict, device: torch.device):
        self.inputs = {k: torch.empty_like(v, device=device) if torch.is_tensor(v) else v for k, v in host.items()}
        self.output: torch.Tensor | None = None
        self.graph = None

    def load(self, host: dict) -> None:
        """Copy a host batch into the static inputs (pinned, so the copy does not block the host)."""
        for k, v in host.items():
            if torch.is_tensor(v):
                src = v.pin_memory() if v.device.type == "cpu" and self.inputs[k].device.type == "cuda" else v
                self.inputs[k].copy_(src, non_blocking=True)


def signature(task: str, batch: dict) -> tuple:
    """What fixes a step's graph: the task, each tensor's name, shape and dtype, the other values."""
    return (task,) + tuple(sorted((k, tuple(v.shape), str(v.dtype)) if torch.is_tensor(v) else (k, v)
                                  for k, v in batch.items()))


class CapturedSteps:
    """The training steps of one run (minbert.train.training.Training), in parts captured once each."""

    def __init__(self, tr, capture: bool = True):
        self.tr, self.capture = tr, capture
        self.device = tr.device
        self.params = list(tr.params)
        # gradients that live for the whole run: captured backward passes add into them
        self.grads = {p: torch.zeros_like(p) for p in self.params}
        for p in self.params:
            p.grad = self.grads[p]
        self.groups = tr.optimizer.param_groups
        self.lr = torch.zeros(len(self.groups), dtype=torch.float32, device=self.device)
        self.update = torch.zeros((), dtype=torch.long, device=self.device)
        self.touched: dict[str, set] = {}           # task -> the parameters its loss gives a gradient to
        self.shapes: dict[tuple, _Shape] = {}
        self.updates: dict[frozenset, object] = {}  # set of tasks -> the captured update (or None: eager)
        self.seen: set[frozenset] = set()           # sets of tasks updated once (eagerly) so far
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.failed = False

    # ------------------------------------------------------------ one update

    def step(self, state, plan, batches: list[tuple[str, dict]], labels: list[np.ndarray]) -> float:
        """One update of the tasks in `batches` (host batches of fixed shapes); returns the lr."""
        tr = self.tr
        lr = set_lr(tr.optimizer, state.update - state.phase_start, *plan.schedule(state.phase), tr.cfg.lr_schedule)
        rates = torch.tensor([g["lr"] for g in self.groups], dtype=torch.float32)
        self.lr.copy_(rates.pin_memory() if self.device.type == "cuda" else rates, non_blocking=True)
        self.update.fill_(state.update)
        for (task, host), y in zip(batches, labels):
            shape = self._shape(task, host)
            shape.load(host)
            if shape.graph is not None:
                shape.graph.replay()
            else:
                shape.output = self._forward_backward(task, shape.inputs)
            tr.totals.add_outputs(task, shape.output.detach().float().clone(), y)
        tasks = frozenset(task for task, _ in batches)
        update = self._update(tasks)
        if update is not None:
            update.replay()
        else:
            self._apply(tasks)
        state.update += 1
        return lr

    def _forward_backward(self, task: str, inputs: dict) -> torch.Tensor:
        """Forward, loss, the totals' device part, backward (adding into the run's gradients)."""
        tr = self.tr
        with self._amp():
            loss, out = tr.objective(task)(inputs)
        tr.totals.add_loss(task, loss, int(inputs["labels"].shape[0]), self.update, tr.totals.flagged)
        if loss.requires_grad:      # a task whose head has no parameter over a frozen encoder learns nothing
            (tr.cfg.task_weights.get(task, 1.0) * loss).backward()
        return out

    def _apply(self, tasks: frozenset) -> None:
        """Clip, AdamW over the parameters `tasks` train, and their gradients back to zero."""
        trained = set().union(*(self.touched[t] for t in tasks))
        params = [p for p in self.params if p in trained]
        grads = [self.grads[p] for p in params]
        if self.tr.cfg.grad_clip:
            torch.nn.utils.clip_grads_with_norm_(params, self.tr.cfg.grad_clip,
                                                 torch.nn.utils.get_total_norm(grads, foreach=True), foreach=True)
        # a replayed graph reads the learning rates from the device; run eagerly, the floats (to the bit)
        self.tr.optimizer.step(params=trained, grads=self.grads, lrs=self.lr if self.capture else None)
        torch._foreach_zero_(grads)

    # ------------------------------------------------------------ shapes and their graphs

    def _shape(self, task: str, host: dict) -> _Shape:
        key = signature(task, host)
        shape = self.shapes.get(key)
        if shape is not None:
            return shape
        shape = _Shape(host, self.device)
        shape.load(host)
        if task not in self.touched:
            self._probe(task, shape.inputs)
        if self.capture and not self.failed and len(self.shapes) < MAX_GRAPHS:
            self._capture(task, shape)
        self.shapes[key] = shape
        return shape

    @contextlib.contextmanager
    def _rng_kept(self):
        """Passes that must not change what the run draws next: every RNG put back afterwards."""
        cpu = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        try:
            yield
        finally:
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, self.device)

    def _probe(self, task: str, inputs: dict) -> None:
        """Which parameters `task`'s loss gives a gradient to: one pass with no gradients at all."""
        for p in self.params:
            p.grad = None
        with self._rng_kept():
            scratch = _ScratchTotals(self.tr.totals)
            with scratch.active(self.tr):
                self._forward_backward(task, inputs)
        self.touched[task] = {p for p in self.params if p.grad is not None}
        for p in self.params:
            p.grad = self.grads[p]
        for p in (q for q in self.params if q in self.touched[task]):
            self.tr.optimizer.state_of(p)   # its state exists before a graph records its update

    def _capture(self, task: str, shape: _Shape) -> None:
        """Warm up, then record the forward-backward of `shape` as a graph."""
        try:
            self._warm_up(task, shape)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                shape.output = self._forward_backward(task, shape.inputs)
            shape.graph = graph
        except Exception as e:   # a graph it cannot hold: the same parts run eagerly from now on
            self._give_up(f"capturing the {task} step failed ({type(e).__name__}: {str(e)[:200]})")

    def _warm_up(self, task: str, shape: _Shape) -> None:
        """A few eager passes (on a side stream on CUDA, as capturing wants) that leave no trace: the
        gradients this update's earlier tasks added, the totals and every RNG are as they were."""
        grads = list(self.grads.values())
        kept = [g.clone() for g in grads]
        cuda = self.device.type == "cuda"
        side = torch.cuda.Stream(self.device) if cuda else None
        if cuda:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with self._rng_kept(), (torch.cuda.stream(side) if cuda else contextlib.nullcontext()):
            scratch = _ScratchTotals(self.tr.totals)
            with scratch.active(self.tr):
                for _ in range(WARMUP_STEPS):
                    self._forward_backward(task, shape.inputs)
        if cuda:
            torch.cuda.current_stream(self.device).wait_stream(side)
        torch._foreach_copy_(grads, kept)

    def _update(self, tasks: frozenset):
        """The captured update of `tasks` (clip, AdamW, zeroing): run eagerly the first time (it
        warms up the kernels, as capturing wants), recorded the second and replayed from then on."""
        if tasks in self.updates:
            return self.updates[tasks]
        if tasks not in self.seen:
            self.seen.add(tasks)
            return None
        graph = None
        if self.capture and not self.failed:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self._apply(tasks)
            except Exception as e:
                graph = None
                self._give_up(f"capturing the update failed ({type(e).__name__}: {str(e)[:200]})")
        self.updates[tasks] = graph
        return graph

    def _give_up(self, why: str) -> None:
        log.warning("%s; the training steps run uncaptured from here", why)
        self.failed = True
        for shape in self.shapes.values():
            shape.graph = None
        self.updates = {k: None for k in self.updates}

    def _amp(self):
        """bf16 autocast as the run asks, without its cache of cast weights (a captured graph must
        cast them at every replay: the weights change between replays)."""
        if not self.tr.options.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)


class _ScratchTotals:
    """Totals that warm-up and probe passes add into, so the epoch's own stay as they were."""

    def __init__(self, totals):
        self.totals = totals
        self.loss, self.first_bad, self.flagged = (totals.loss.clone(), totals.first_bad.clone(),
                                                   totals.flagged.clone())

    @contextlib.contextmanager
    def active(self, tr):
        try:
            yield
        finally:
            self.totals.loss.copy_(self.loss)
            self.totals.first_bad.copy_(self.first_bad)
            self.totals.flagged.copy_(self.flagged)
