"""The training steps the GPU benchmark and the operation count compare, built once for both.

`OurStep`: the pipeline's own training step on one task's batches, through the product's path
(minbert.train.loop.start_run builds the run: the optimiser, the totals and, on CUDA with
`cuda_graphs`, the captured step of minbert.train.step; then `CapturedSteps.step` or
`train_step`, as `run_epoch` picks). `padded=True` on a CPU drives the captured step's parts
eagerly (`CapturedSteps(capture=False)`: the padded fixed-length batches the CUDA path uses).

`ReferenceStep`: transformers' `BertModel` (attn_implementation="sdpa") with a linear head on the
[CLS] vector and its loss for the task, the same clip and torch's fused AdamW, under bf16 autocast
where ours runs it; `graph=True` captures its whole step (forward, loss, backward, clip,
AdamW(capturable=True)) once per batch shape in a CUDA graph and replays it.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minbert.core.tasks import TASKS
from minbert.data.batches import Collator, build_task_data
from minbert.data.raw import raw_path, read_cs224n
from minbert.data.stream import TaskStream
from minbert.model.bert import BertConfig, BertModel
from minbert.model.multitask import MultitaskModel
from minbert.params import FinetuneParams
from minbert.train.loop import start_run, train_step
from minbert.train.training import FitOptions, TrainState

REPO = Path(__file__).resolve().parents[1]
HEADS = {"pooling": "cls", "para": "cross", "sts": "cross"}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def data_dir() -> Path:
    """The real CS224N files beside the repository (../shared/data/cs224n), else the demo data."""
    shared = REPO.parent / "shared" / "data" / "cs224n"
    return shared if raw_path(shared, "para", "train").is_file() else REPO / "data" / "demo"


def load_train(task: str, tok, heads, rows: int):
    frame, _ = read_cs224n(raw_path(data_dir(), task, "train"), task, on_bad_rows="drop")
    return build_task_data(task, frame.head(rows).reset_index(drop=True), tok, heads)


def encoders(shape: str):
    """(our encoder, transformers' BertModel) of one shape, with the same weights: `minilm` the
    packaged all-MiniLM-L6-v2, `bert-base` bert-base-uncased's shape with random weights, `tiny` a
    2-layer hidden-64 BERT (smoke runs)."""
    import transformers

    from minbert.model.weights import load_encoder, packaged_minilm_folder

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    if shape == "minilm":
        ours, _, _ = load_encoder("all-MiniLM-L6-v2")
        ref = transformers.BertModel.from_pretrained(str(packaged_minilm_folder()), attn_implementation="sdpa",
                                                     add_pooling_layer=False)
        return ours, ref
    torch.manual_seed(0)
    ours = BertModel(BertConfig(**(TINY if shape == "tiny" else {})))
    cfg = ours.config
    hf = transformers.BertConfig(**{k: getattr(cfg, k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "hidden_act", "pad_token_id")}, attn_implementation="sdpa")
    ref = transformers.BertModel(hf, add_pooling_layer=False)
    ref.load_state_dict({k: v for k, v in _hf_state(ours).items() if k in ref.state_dict()}, strict=False)
    return ours, ref


def _hf_state(ours: BertModel) -> dict:
    """Our encoder's weights under transformers' BertModel names (the export's conversion)."""
    from minbert.model.weights import minbert_to_hf

    return {k.removeprefix("bert."): v for k, v in minbert_to_hf(ours.state_dict()).items()}


class OurStep:
    """The pipeline's training step on batches of one task (see the module docstring)."""

    def __init__(self, encoder: BertModel, tok, task: str, batch_size: int, device: torch.device, bf16: bool,
                 rows: int = 4000, cuda_graphs: bool = True, padded: bool = False, seed: int = 11):
        cfg = FinetuneParams(tasks=[task], batch_size=batch_size, lr=2e-5, epochs=1, warmup_ratio=0.0,
                             lr_schedule="constant", heads=HEADS, downsample={"mode": "none"})
        self.task, self.tmp = task, tempfile.TemporaryDirectory()
        train = {task: load_train(task, tok, cfg.heads, rows)}
        model = MultitaskModel(encoder, cfg.heads, [task])
        options = FitOptions(Path(self.tmp.name) / "out", device=device, bf16=bf16, cuda_graphs=cuda_graphs,
                             progress=False)
        self.tr, self.plan = start_run(model, tok, train, {}, cfg, options)
        if padded and self.tr.captured is None:
            from minbert.train.step import CapturedSteps

            self.tr.captured = CapturedSteps(self.tr, capture=False)
        self.path = "captured (CUDA graphs)" if self.tr.captured is not None and self.tr.captured.capture else \
            "padded buckets, parts run eagerly" if self.tr.captured is not None else "eager, padding removed"
        self.state = TrainState()
        collator = Collator(tok, fixed_shapes=self.tr.captured is not None)
        self.stream = TaskStream(train[task], collator, batch_size, seed, 0)
        self.tr.model.train()

    def batches(self, n: int) -> list[dict]:
        return [self.stream.next() for _ in range(n)]

    def __call__(self, batch: dict) -> None:
        labels = [batch["labels"].numpy()]
        if self.tr.captured is not None:
            self.tr.captured.step(self.state, self.plan, [(self.task, batch)], labels)
        else:
            train_step(self.tr, self.state, self.plan, [(self.task, batch)], labels)
        if self.state.update % 64 == 0:   # the outputs the totals keep: one epoch's worth at most
            self.tr.totals.reset()

    @property
    def captured(self) -> bool:
        return self.tr.captured is not None and self.tr.captured.capture


def task_loss_of(task: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference's loss: cross-entropy over the classes, BCE for a binary task, MSE for a score."""
    kind = TASKS[task].kind
    if kind == "binary":
        return F.binary_cross_entropy_with_logits(logits.squeeze(-1), labels.float())
    if kind == "regression":
        return F.mse_loss(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels.long())


class ReferenceStep:
    """transformers' BertModel, a linear head, its loss, clip, torch's fused AdamW (see the module
    docstring); `graph`: the whole step captured per batch shape and replayed (CUDA only)."""

    INPUTS = ("input_ids", "attention_mask", "token_type_ids")

    def __init__(self, model, task: str, device: torch.device, bf16: bool, graph: bool = False, clip: float = 1.0):
        self.task, self.device, self.bf16, self.graph, self.clip = task, device, bf16, graph, clip
        self.model = model.to(device).train()
        outputs = TASKS[task].outputs
        torch.manual_seed(0)
        self.head = torch.nn.Sequential(torch.nn.Dropout(model.config.hidden_dropout_prob),
                                        torch.nn.Linear(model.config.hidden_size, outputs)).to(device)
        self.params = [p for p in list(self.model.parameters()) + list(self.head.parameters()) if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=2e-5, weight_decay=0.01, eps=1e-6, fused=True,
                                     capturable=graph)
        self.graphs: dict[tuple, tuple[dict, torch.cuda.CUDAGraph]] = {}
        self.path = "whole step in a CUDA graph" if graph else "eager"

    def _amp(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=not self.graph)

    def _step(self, b: dict) -> None:
        with self._amp():
            hidden = self.model(**{k: b[k] for k in self.INPUTS if k in b}).last_hidden_state
        logits = self.head(hidden[:, 0].float())
        task_loss_of(self.task, logits, b["labels"]).backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        self.opt.step()

    def __call__(self, batch: dict) -> None:
        host = {k: batch[k] for k in (*self.INPUTS, "labels") if k in batch}
        if not self.graph:
            self._step({k: v.to(self.device, non_blocking=True) for k, v in host.items()})
            self.opt.zero_grad(set_to_none=True)
            return
        key = tuple((k, tuple(v.shape)) for k, v in host.items())
        if key not in self.graphs:
            self.graphs[key] = self._capture(host)
        static, graph = self.graphs[key]
        for k, v in host.items():
            static[k].copy_(v.pin_memory(), non_blocking=True)
        graph.replay()

    def _capture(self, host: dict):
        """PyTorch's whole-network capture: warm-up on a side stream, gradients set to None so the
        captured backward allocates them in the graph's own pool, then forward to AdamW recorded."""
        static = {k: v.to(self.device) for k, v in host.items()}
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._step(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step(static)
        return static, graph


def labels_of(batch: dict) -> np.ndarray:
    return batch["labels"].numpy()
