"""The multi-task model (one encoder, one head per task), its batches, losses, predictions and
checkpoints.

Output conventions (what `MultitaskModel.forward` returns):
- sst:  (B, 5) logits
- para: (B,) logit of "is a paraphrase"
- sts:  (B,) score in the head's target space (see `sts_target` / `sts_prediction`)
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import MinBertError
from .heads import BiPairHead, CrossPairHead, HybridPairHead, SentimentHead, SharedLayer
from .model import BertConfig, BertModel, mean_pool
from .params import HeadsParams
from .tokenizer import Tokenizer

PAIR_TASKS = ("para", "sts")
STS_MAX = 5.0
# SMART's divergence per task: softmax logits, one Bernoulli logit, a real-valued score
OUTPUT_KIND = {"sst": "classification", "para": "binary", "sts": "regression"}


def is_cross(heads: HeadsParams, task: str) -> bool:
    return task in PAIR_TASKS and getattr(heads, task) == "cross"


def is_hybrid(heads: HeadsParams, task: str) -> bool:
    return task in heads.hybrid


class MultitaskModel(nn.Module):
    def __init__(self, encoder: BertModel, heads: HeadsParams, tasks: list[str]):
        super().__init__()
        self.encoder = encoder
        self.heads_cfg = heads
        self.tasks = list(tasks)
        H, hl, dp = encoder.config.hidden_size, heads.hidden_layers, heads.dropout
        self.shared = SharedLayer(H, dp) if heads.shared_layer else None
        self.heads = nn.ModuleDict()
        for task in self.tasks:
            if task == "sst":
                self.heads[task] = SentimentHead(H, hl, dp)
            elif is_cross(heads, task):
                self.heads[task] = CrossPairHead(H, hl, dp)
            else:
                kind = getattr(heads, task)
                # para with a cosine head: a cosine of 0.75 starts as p = 0.5
                scale, bias = (10.0, -7.5) if task == "para" else (1.0, 0.0)
                bi = BiPairHead(kind, H, hl, dp, init_scale=scale, init_bias=bias)
                self.heads[task] = HybridPairHead(bi, CrossPairHead(H, hl, dp)) if is_hybrid(heads, task) else bi

    def reset_heads(self) -> None:
        """Re-initialise every head (and the shared layer): the start of head retraining."""
        template = MultitaskModel(_EncoderStub(self.encoder.config), self.heads_cfg, self.tasks)
        self.heads.load_state_dict(template.heads.state_dict())
        if self.shared is not None:
            self.shared.load_state_dict(template.shared.state_dict())

    def embed(self, batch: dict, inputs_embeds=None, return_embeddings=False):
        """Sentence embeddings (N, H) per the pooling choice; optionally the word embeddings used."""
        out = self.encoder(batch.get("input_ids"), batch["attention_mask"], batch.get("token_type_ids"),
                           inputs_embeds=inputs_embeds, return_embeddings=return_embeddings)
        hidden, pooled = out[0], out[1]
        pooling = self.heads_cfg.pooling
        if pooling == "cls":
            emb = hidden[:, 0]
        elif pooling == "mean":
            emb = mean_pool(hidden, batch["attention_mask"])
        else:
            emb = pooled
        return (emb, out[2]) if return_embeddings else emb

    def head_forward(self, task: str, emb: torch.Tensor) -> torch.Tensor:
        """Apply task's head to sentence embeddings (bi-encoder batches hold a's then b's, hybrid
        batches then the cross-encoded pairs)."""
        if task == "sst":
            return self.heads[task](emb)
        if self.shared is not None:
            emb = self.shared(emb)
        if is_cross(self.heads_cfg, task):
            return self.heads[task](emb)
        if is_hybrid(self.heads_cfg, task):
            u, v, c = emb.chunk(3, 0)
            return self.heads[task](u, v, c)
        u, v = emb.chunk(2, 0)
        return self.heads[task](u, v)

    def forward(self, task: str, batch: dict, inputs_embeds=None, return_embeddings=False):
        if return_embeddings:
            emb, word = self.embed(batch, inputs_embeds, return_embeddings=True)
            return self.head_forward(task, emb), word
        return self.head_forward(task, self.embed(batch, inputs_embeds))


class _EncoderStub(nn.Module):
    """Only what MultitaskModel.__init__ reads from an encoder (its config)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config


# ---------------------------------------------------------------- targets, losses, predictions

def sts_target(heads: HeadsParams, label: torch.Tensor) -> torch.Tensor:
    """Scale 0-5 similarity labels into the space the STS head predicts in."""
    if heads.sts in ("cosine",) and heads.cosine_target == "-1_1":
        return label / (STS_MAX / 2) - 1.0
    return label / STS_MAX


def sts_prediction(heads: HeadsParams, output: torch.Tensor) -> torch.Tensor:
    """Map the STS head's output back to the 0-5 scale (clipped)."""
    if heads.sts in ("cosine",) and heads.cosine_target == "-1_1":
        out = (output + 1.0) * (STS_MAX / 2)
    else:
        out = output * STS_MAX
    return out.clamp(0.0, STS_MAX)


def task_loss(task: str, heads: HeadsParams, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    output = output.float()
    if task == "sst":
        return F.cross_entropy(output, labels.long())
    if task == "para":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    target = sts_target(heads, labels.float())
    if heads.sts_loss == "mse":
        return F.mse_loss(output, target)
    from .losses import pearson_loss

    if heads.sts_loss == "pearson":
        return pearson_loss(output, target)
    return F.mse_loss(output, target) + pearson_loss(output, target)


def predictions(task: str, heads: HeadsParams, output: torch.Tensor) -> dict[str, np.ndarray]:
    """Turn head outputs into predictions (and probabilities for the classification tasks)."""
    output = output.detach().float().cpu()
    if task == "sst":
        probs = output.softmax(-1)
        return {"prediction": probs.argmax(-1).numpy(), "probs": probs.numpy()}
    if task == "para":
        p1 = output.sigmoid()
        return {"prediction": (p1 > 0.5).long().numpy(), "probs": p1.numpy()}
    return {"prediction": sts_prediction(heads, output).numpy()}


# ---------------------------------------------------------------- data for one task

@dataclass
class TaskData:
    """A task's split, tokenised: what the batches are built from."""
    task: str
    ids: list[str]
    encoded: list[tuple[list[int], list[int]]]          # single or cross-encoded pairs
    encoded_b: list[tuple[list[int], list[int]]] | None  # second sentences (bi-encoder pairs)
    labels: np.ndarray | None                          # None when the split has no labels
    frame: object = field(default=None, repr=False)    # the source DataFrame (texts, for predictions)
    # cross-encoded pairs in the other order, "[CLS] b [SEP] a [SEP]" (heads.symmetric_pairs)
    encoded_swap: list[tuple[list[int], list[int]]] | None = field(default=None, repr=False)
    symmetric: bool = False                            # pairs are read in both orders
    # hybrid heads: the cross-encoded pairs besides the sentences (encoded, encoded_b)
    encoded_cross: list[tuple[list[int], list[int]]] | None = field(default=None, repr=False)

    def rows(self, indices, swap=None) -> list[tuple[list[int], list[int]]]:
        """The encoder inputs of `indices`: a bi-encoder batch stacks the first sentences, then
        the second ones (2B rows); a hybrid batch then the cross-encoded pairs (3B rows).
        `swap[k]` reads pair k in the order (b, a)."""
        if swap is None or not self.symmetric:
            swap = [False] * len(indices)
        if self.encoded_b is None:
            return [self.encoded_swap[i] if s else self.encoded[i] for i, s in zip(indices, swap)]
        first = [self.encoded_b[i] if s else self.encoded[i] for i, s in zip(indices, swap)]
        second = [self.encoded[i] if s else self.encoded_b[i] for i, s in zip(indices, swap)]
        if self.encoded_cross is None:
            return first + second
        cross = [self.encoded_swap[i] if s else self.encoded_cross[i] for i, s in zip(indices, swap)]
        return first + second + cross

    def __len__(self) -> int:
        return len(self.encoded)

    def lengths(self) -> list[int]:
        if self.encoded_b is None:
            return [len(ids) for ids, _ in self.encoded]
        if self.encoded_cross is not None:
            return [len(ids) for ids, _ in self.encoded_cross]
        return [max(len(a[0]), len(b[0])) for a, b in zip(self.encoded, self.encoded_b)]


def build_task_data(task: str, frame, tokenizer: Tokenizer, heads: HeadsParams, cache_dir=None) -> TaskData:
    from .batching import encode_cached

    enc_swap, enc_cross, symmetric = None, None, task in PAIR_TASKS and heads.symmetric_pairs
    if task in ("sst", "cfimdb"):
        enc, enc_b = encode_cached(tokenizer, frame["sentence"].tolist(), cache_dir=cache_dir), None
    elif is_cross(heads, task):
        a, b = frame["sentence1"].tolist(), frame["sentence2"].tolist()
        enc, enc_b = encode_cached(tokenizer, a, b, cache_dir=cache_dir), None
        if symmetric:
            enc_swap = encode_cached(tokenizer, b, a, cache_dir=cache_dir)
    else:
        a, b = frame["sentence1"].tolist(), frame["sentence2"].tolist()
        enc, enc_b = encode_cached(tokenizer, a, cache_dir=cache_dir), encode_cached(tokenizer, b, cache_dir=cache_dir)
        if is_hybrid(heads, task):
            enc_cross = encode_cached(tokenizer, a, b, cache_dir=cache_dir)
            if symmetric:
                enc_swap = encode_cached(tokenizer, b, a, cache_dir=cache_dir)
    labels = None
    if "label" in frame.columns and frame["label"].notna().all() and len(frame):
        labels = frame["label"].to_numpy(dtype=np.float32 if task == "sts" else np.int64)
    return TaskData(task, frame["id"].astype(str).tolist(), enc, enc_b, labels, frame, enc_swap, symmetric, enc_cross)


def collate(data: TaskData, indices: list[int], tokenizer: Tokenizer, swap=None) -> dict[str, torch.Tensor]:
    """Pad a batch; bi-encoder batches stack the a-sentences then the b-sentences: (2B, T).
    `swap` (one bool per index) reads those pairs in the order (b, a)."""
    batch = tokenizer.pad(data.rows(indices, swap))
    if data.labels is not None:
        batch["labels"] = torch.from_numpy(data.labels[indices])
    return batch


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


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
            with amp_context():
                out_b = out_b + model(data.task, batch).float().cpu()
        outputs.append(out_b / len(passes))
    out = torch.cat(outputs) if outputs else torch.empty(0)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    out = out[torch.as_tensor(inverse)]
    result = predictions(data.task, model.heads_cfg, out)
    if data.labels is not None and len(out):
        result["loss"] = float(task_loss(data.task, model.heads_cfg, out, torch.tensor(data.labels)))
    return result


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---------------------------------------------------------------- checkpoints

def save_checkpoint(path, model: MultitaskModel, tokenizer: Tokenizer, **extra) -> None:
    from .io import torch_save

    torch_save({
        "format": "minbert-multitask-1",
        "encoder_config": model.encoder.config.to_dict(),
        "heads": model.heads_cfg.model_dump(),
        "tasks": model.tasks,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "tokenizer_json": tokenizer._tok.to_str(),
        "max_length": tokenizer.max_length,
        **extra,
    }, path)


def load_checkpoint(path, map_location="cpu") -> tuple[MultitaskModel, Tokenizer, dict]:
    """Load a model.pt written by `save_checkpoint`: (model, tokenizer, the checkpoint dict)."""
    path = Path(path)
    if not path.is_file():
        raise MinBertError(f"{path}: checkpoint not found; run the stage that writes it first")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise MinBertError(f"{path}: not a readable checkpoint ({type(e).__name__}); re-run the stage") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "minbert-multitask-1":
        raise MinBertError(f"{path}: not a minbert multi-task checkpoint")
    encoder = BertModel(BertConfig(**ckpt["encoder_config"]))
    model = MultitaskModel(encoder, HeadsParams(**ckpt["heads"]), ckpt["tasks"])
    model.load_state_dict(ckpt["state_dict"])
    tokenizer = tokenizer_from_json(ckpt["tokenizer_json"], ckpt["max_length"])
    return model, tokenizer, ckpt


def tokenizer_from_json(tokenizer_json: str, max_length: int) -> Tokenizer:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        return Tokenizer(d, max_length)


def head_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]


def encoder_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if n.startswith("encoder.")]



def load_task_data(data_dir, tasks: list[str], heads: HeadsParams, tokenizer: Tokenizer, *, splits=("train", "dev"),
                   downsample=None, seed: int = 0, cache_dir=None) -> dict[str, dict[str, TaskData]]:
    """Read the prepared splits of `tasks`, downsample the training splits, tokenise (cached).

    Returns {split: {task: TaskData}} for the splits that exist."""
    from .data import downsample as downsample_frames
    from .data import load_splits

    frames = {t: load_splits(data_dir, t) for t in tasks}
    out: dict[str, dict[str, TaskData]] = {}
    for split in splits:
        split_frames = {t: f[split] for t, f in frames.items() if split in f}
        if split == "train" and downsample is not None:
            split_frames = downsample_frames(split_frames, downsample, seed)
        out[split] = {t: build_task_data(t, fr, tokenizer, heads, cache_dir) for t, fr in split_frames.items()}
    return out
