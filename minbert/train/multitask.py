"""The multi-task model (one encoder, one head per task), its batches, predictions and checkpoints.

What `MultitaskModel.forward(task, batch)` returns depends on the task's kind (minbert.core.tasks):
- classification (sst): (B, C) logits;
- binary (para, cfimdb): (B,) logit of the positive class;
- regression (sts): (B,) score in the head's target space (minbert.train.losses.regression_target).
How the encoder reads a task's examples (one sentence, a cross-encoded pair, each sentence of a
pair, or both) is the task's view (minbert.data.views).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from minbert.core.errors import MinBertError
from minbert.core.tasks import TASKS
from minbert.data.views import Encoded, View, encode, view_of
from minbert.model.bert import BertConfig, BertModel, mean_pool
from minbert.model.tokenizer import Tokenizer
from minbert.params import HeadsParams
from minbert.train.heads import (
    BiPairHead,
    Branch,
    ClassifierHead,
    CrossPairHead,
    HybridPairHead,
    PrototypeHead,
    SharedBlock,
)
from minbert.train.losses import regression_prediction, task_loss

CHECKPOINT_FORMAT = "minbert-multitask-1"


class MultitaskModel(nn.Module):
    def __init__(self, encoder: BertModel, heads: HeadsParams, tasks: list[str]):
        super().__init__()
        self.encoder = encoder
        self.heads_cfg = heads
        self.tasks: list[str] = []
        self.views: dict[str, View] = {}
        sh = heads.shared
        H = encoder.config.hidden_size
        self.shared = SharedBlock(H, sh.sizes or [H], sh.activation, heads.dropout) if sh else None
        self.branches = nn.ModuleDict()
        self.heads = nn.ModuleDict()
        self.calibration: dict[str, list[float]] = {}   # regression task -> [scale, shift] (correlation loss)
        self.add_tasks(tasks)

    def _in_dim(self, task: str) -> int:
        if self.shared is not None and task in self.heads_cfg.shared.tasks:
            return self.shared.out_dim
        return self.encoder.config.hidden_size

    def _new_head(self, task: str) -> nn.Module:
        cfg, view, D = self.heads_cfg, self.views[task].name, self._in_dim(task)
        hl, dp = cfg.depth(task), cfg.dropout
        if view == "single":
            if task == "sst" and cfg.sst == "prototypes":
                return PrototypeHead(D, TASKS[task].outputs, cfg.prototypes_per_label, dp)
            return ClassifierHead(D, TASKS[task].outputs, hl, dp)
        if view == "cross":
            return CrossPairHead(D, hl, dp)
        # a binary task's cosine head starts with a cosine of 0.75 as p = 0.5
        scale, bias = (10.0, -7.5) if TASKS[task].kind == "binary" else (1.0, 0.0)
        bi = BiPairHead(getattr(cfg, task), D, hl, dp, init_scale=scale, init_bias=bias, affine=cfg.cosine_affine)
        return HybridPairHead(bi, CrossPairHead(D, hl, dp)) if view == "hybrid" else bi

    def add_tasks(self, tasks: list[str]) -> None:
        """Give the model heads (and branches) for `tasks` it does not have yet."""
        for task in tasks:
            if task in self.heads:
                continue
            self.tasks.append(task)
            self.views[task] = view_of(task, self.heads_cfg)
            if task in self.heads_cfg.extra_layers and isinstance(self.encoder, BertModel):
                self.branches[task] = Branch(self.encoder, self.heads_cfg.extra_layers[task])
            self.heads[task] = self._new_head(task)

    def reset_heads(self, tasks: list[str] | None = None) -> None:
        """Re-initialise the heads of `tasks` (default: all), their branches, and the shared block
        when every task that shares it is reset: the start of head retraining. Heads are made in
        the same order as a new model makes them, so a reset model equals a freshly built one."""
        reset = set(self.tasks if tasks is None else tasks)
        if self.shared is not None and set(self.heads_cfg.shared.tasks) & set(self.tasks) <= reset:
            sh = self.heads_cfg.shared
            H = self.encoder.config.hidden_size
            self.shared = SharedBlock(H, sh.sizes or [H], sh.activation, self.heads_cfg.dropout).to(self._device())
        for task in self.tasks:
            if task in reset:
                if task in self.branches:
                    self.branches[task] = Branch(self.encoder, self.heads_cfg.extra_layers[task])
                self.heads[task] = self._new_head(task).to(self._device())

    def _device(self):
        return next(self.encoder.parameters()).device

    def embed(self, batch: dict, inputs_embeds=None, return_embeddings=False, task: str | None = None):
        """Sentence embeddings (N, H) per the pooling choice (through `task`'s branch, if it has
        one); optionally the word embeddings used."""
        out = self.encoder(batch.get("input_ids"), batch["attention_mask"], batch.get("token_type_ids"),
                           inputs_embeds=inputs_embeds, return_embeddings=return_embeddings,
                           padded=batch.get("padded"), token_index=batch.get("token_index"))
        hidden, pooled = out[0], out[1]
        if task in self.branches:
            hidden = self.branches[task](hidden, batch["attention_mask"], batch.get("padded"))
            pooled = self.encoder.pooler(hidden)
        pooling = self.heads_cfg.pooling_of(task) if task else self.heads_cfg.pooling
        if pooling == "cls":
            emb = hidden[:, 0]
        elif pooling == "mean":
            emb = mean_pool(hidden, batch["attention_mask"])
        else:
            emb = pooled
        return (emb, out[2]) if return_embeddings else emb

    def head_forward(self, task: str, emb: torch.Tensor) -> torch.Tensor:
        """Apply task's head to the embeddings of a batch stacked as its view says."""
        if self.shared is not None and task in self.heads_cfg.shared.tasks:
            emb = self.shared(emb)
        return self.heads[task](*self.views[task].split(emb))

    def forward(self, task: str, batch: dict, inputs_embeds=None, return_embeddings=False):
        if return_embeddings:
            emb, word = self.embed(batch, inputs_embeds, return_embeddings=True, task=task)
            return self.head_forward(task, emb), word
        return self.head_forward(task, self.embed(batch, inputs_embeds, task=task))


class _EncoderStub(nn.Module):
    """Only what MultitaskModel.__init__ reads from an encoder (its config)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config


# ---------------------------------------------------------------- predictions

def predictions(task: str, heads: HeadsParams, output: torch.Tensor, calibration=None) -> dict[str, np.ndarray]:
    """Head outputs -> predictions (and the probabilities of a classification or binary task);
    `calibration`: a regression head's (scale, shift) (minbert.train.losses.regression_prediction)."""
    output = output.detach().float().cpu()
    kind = TASKS[task].kind
    if kind == "classification":
        probs = output.softmax(-1)
        return {"prediction": probs.argmax(-1).numpy(), "probs": probs.numpy()}
    if kind == "binary":
        p1 = output.sigmoid()
        return {"prediction": (p1 > 0.5).long().numpy(), "probs": p1.numpy()}
    return {"prediction": regression_prediction(task, heads, output, calibration).numpy()}


# ---------------------------------------------------------------- data for one task

@dataclass
class TaskData:
    """A task's split, tokenised as its view needs: what the batches are built from."""
    task: str
    ids: list[str]
    view: View
    enc: dict[str, Encoded]                            # the view's encodings (minbert.data.views)
    labels: np.ndarray | None                          # None when the split has no labels
    frame: object = field(default=None, repr=False)    # the source DataFrame (texts, for predictions)
    symmetric: bool = False                            # pairs are read in both orders
    soft: np.ndarray | None = field(default=None, repr=False)   # a teacher's outputs (minbert.train.distill)

    def rows(self, indices, swap=None) -> Encoded:
        """The encoder inputs of `indices`, stacked part by part; `swap[k]` reads pair k as (b, a)."""
        return self.view.rows(self.enc, indices, swap if self.symmetric else None)

    def __len__(self) -> int:
        return len(self.ids)

    def lengths(self) -> list[int]:
        return self.view.lengths(self.enc)


def build_task_data(task: str, frame, tokenizer: Tokenizer, heads: HeadsParams, cache_dir=None) -> TaskData:
    view = view_of(task, heads)
    symmetric = TASKS[task].pair and heads.symmetric_pairs
    labels = None
    if "label" in frame.columns and frame["label"].notna().all() and len(frame):
        labels = frame["label"].to_numpy(dtype=TASKS[task].label_dtype)
    return TaskData(task, frame["id"].astype(str).tolist(), view, encode(tokenizer, frame, view, symmetric, cache_dir),
                    labels, frame, symmetric)


PAD_MULTIPLE = 8    # sequence lengths padded to a multiple of 8: fewer distinct shapes, tensor-core friendly


def collate(data: TaskData, indices: list[int], tokenizer: Tokenizer, swap=None) -> dict:
    """Pad a batch (its rows stacked as the task's view says) to a multiple of 8 tokens; `swap` (one
    bool per index) reads those pairs in the order (b, a). What the host knows of the padding comes
    with it (`padding_layout`)."""
    batch = tokenizer.pad(data.rows(indices, swap), multiple_of=PAD_MULTIPLE)
    batch.update(padding_layout(batch["attention_mask"]))
    if data.labels is not None:
        batch["labels"] = torch.from_numpy(data.labels[indices])
    if data.soft is not None:
        batch["soft"] = torch.from_numpy(data.soft[indices])
    return batch


def padding_layout(attention_mask: torch.Tensor) -> dict:
    """From a host mask: whether it has padding (`padded`, a Python bool) and, if so, the flat
    positions of the real tokens (`token_index`), so the encoder never reads a device mask."""
    padded = not bool(attention_mask.all())
    return {"padded": padded, **({"token_index": attention_mask.reshape(-1).nonzero().squeeze(1)} if padded else {})}


def to_device(batch: dict, device) -> dict:
    """The batch's tensors on `device` (copies that do not block the host); other values as they are."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def predict_task(model: MultitaskModel, data: TaskData, tokenizer: Tokenizer, batch_size: int, device,
                 amp_context) -> dict:
    """Run the model over a split in length order (less padding); returns outputs in input order,
    with `loss` when the split has labels. A symmetric pair task's output is the mean of the
    outputs for (a, b) and (b, a)."""
    model.eval()
    order = np.argsort(data.lengths(), kind="stable")
    passes = [False, True] if data.symmetric else [False]
    outputs = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size].tolist()
        out_b = 0.0
        for swapped in passes:
            batch = to_device(collate(data, idx, tokenizer, [swapped] * len(idx)), model_device(model))
            batch.pop("labels", None)
            batch.pop("soft", None)
            with amp_context():
                out_b = out_b + model(data.task, batch).float().cpu()
        outputs.append(out_b / len(passes))
    out = torch.cat(outputs) if outputs else torch.empty(0)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    out = out[torch.as_tensor(inverse)]
    result = predictions(data.task, model.heads_cfg, out, model.calibration.get(data.task))
    result["output"] = out
    if data.labels is not None and len(out):
        result["loss"] = float(task_loss(data.task, model.heads_cfg, out, torch.tensor(data.labels)))
    return result


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---------------------------------------------------------------- checkpoints

def checkpoint_dict(model: MultitaskModel, tokenizer: Tokenizer, **extra) -> dict:
    """The model as a plain dict of tensors and settings (what model.pt holds)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "encoder_config": model.encoder.config.to_dict(),
        "heads": model.heads_cfg.model_dump(),
        "tasks": model.tasks,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "tokenizer_json": tokenizer.to_json(),
        "max_length": tokenizer.max_length,
        "calibration": dict(model.calibration),
        **extra,
    }


def save_checkpoint(path, model: MultitaskModel, tokenizer: Tokenizer, **extra) -> None:
    from minbert.core.io import torch_save

    torch_save(checkpoint_dict(model, tokenizer, **extra), path)


def read_checkpoint(path, map_location="cpu") -> dict:
    """A model.pt as its dict, checked: a one-line error for a missing, unreadable or foreign file."""
    path = Path(path)
    if path.is_dir():
        raise MinBertError(f"{path}: is a folder; expected a checkpoint file (re-run the stage that writes it)")
    if not path.is_file():
        raise MinBertError(f"{path}: checkpoint not found; run the stage that writes it first")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise MinBertError(f"{path}: not a readable checkpoint ({type(e).__name__}); re-run the stage "
                           f"that writes it") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise MinBertError(f"{path}: not a minbert multi-task checkpoint; re-run the stage that writes it")
    return ckpt


def model_from_checkpoint(ckpt: dict, source: str = "checkpoint") -> tuple[MultitaskModel, Tokenizer]:
    try:
        encoder = BertModel(BertConfig(**ckpt["encoder_config"]))
        model = MultitaskModel(encoder, HeadsParams(**ckpt["heads"]), ckpt["tasks"])
        model.load_state_dict(ckpt["state_dict"])
        model.calibration = {t: list(v) for t, v in (ckpt.get("calibration") or {}).items()}
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise MinBertError(f"{source}: the checkpoint does not describe a model this version can build "
                           f"({type(e).__name__}); re-run the stage that writes it") from None
    return model, Tokenizer.from_json(ckpt["tokenizer_json"], ckpt["max_length"], source)


def load_checkpoint(path, map_location="cpu") -> tuple[MultitaskModel, Tokenizer, dict]:
    """Load a model.pt written by `save_checkpoint`: (model, tokenizer, the checkpoint dict)."""
    ckpt = read_checkpoint(path, map_location)
    model, tokenizer = model_from_checkpoint(ckpt, str(path))
    return model, tokenizer, ckpt


def head_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]


def encoder_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if n.startswith("encoder.")]


def load_task_data(data_dir, tasks: list[str], heads: HeadsParams, tokenizer: Tokenizer, *, splits=("train", "dev"),
                   downsample=None, seed: int = 0, cache_dir=None) -> dict[str, dict[str, TaskData]]:
    """Read the prepared splits of `tasks`, downsample the training splits, tokenise (cached).

    Returns {split: {task: TaskData}} for the splits that exist."""
    from minbert.data.read import downsample as downsample_frames
    from minbert.data.read import load_splits

    frames = {t: load_splits(data_dir, t, splits) for t in tasks}
    out: dict[str, dict[str, TaskData]] = {}
    for split in splits:
        split_frames = {t: f[split] for t, f in frames.items() if split in f}
        if split == "train" and downsample is not None:
            split_frames = downsample_frames(split_frames, downsample, seed)
        out[split] = {t: build_task_data(t, fr, tokenizer, heads, cache_dir) for t, fr in split_frames.items()}
    return out
