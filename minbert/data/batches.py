"""A task's split as batches: its tokenised examples and labels (`TaskData`), a padded batch
(`collate`) with what the host knows of its padding, and the prepared splits loaded and tokenised
(`load_task_data`). A training run draws its batches through minbert.data.stream.
`tokenizer` is the model's (minbert.model.tokenizer.Tokenizer): it encodes and pads."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minbert.core.settings import Heads
from minbert.core.tasks import TASKS
from minbert.data.views import Encoded, View, encode, view_of


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


def build_task_data(task: str, frame, tokenizer, heads: Heads, cache_dir=None) -> TaskData:
    view = view_of(task, heads)
    symmetric = TASKS[task].pair and heads.symmetric_pairs
    labels = None
    if "label" in frame.columns and frame["label"].notna().all() and len(frame):
        labels = frame["label"].to_numpy(dtype=TASKS[task].label_dtype)
    return TaskData(task, frame["id"].astype(str).tolist(), view, encode(tokenizer, frame, view, symmetric, cache_dir),
                    labels, frame, symmetric)


PAD_MULTIPLE = 8    # sequence lengths padded to a multiple of 8: fewer distinct shapes, tensor-core friendly
# Fixed lengths a batch is padded to where shapes must be known ahead (a CUDA graph per shape):
# the smallest that holds the batch's longest row, capped at the tokenizer's max_length.
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)


def bucket_length(longest: int, max_length: int) -> int:
    """The fixed length a batch whose longest row has `longest` tokens is padded to."""
    cap = max(longest, max_length)
    return next((min(b, cap) for b in LENGTH_BUCKETS if b >= longest), cap)


def collate(data: TaskData, indices: list[int], tokenizer, swap=None, fixed_shapes: bool = False) -> dict:
    """Pad a batch (its rows stacked as the task's view says); `swap` (one bool per index) reads
    those pairs in the order (b, a). By default the rows are padded to a multiple of 8 tokens and
    what the host knows of the padding comes with them (`padding_layout`), so the encoder skips the
    padding; with `fixed_shapes`, to a length bucket (`bucket_length`) and computed padded, so a
    batch's shape is one of a few known ahead."""
    rows = data.rows(indices, swap)
    if fixed_shapes:
        longest = max(len(ids) for ids, _ in rows)
        batch = tokenizer.pad(rows, length=bucket_length(longest, tokenizer.max_length))
        batch.update(padded=True, unpad=False)
    else:
        batch = tokenizer.pad(rows, multiple_of=PAD_MULTIPLE)
        batch.update(padding_layout(batch["attention_mask"]))
    if data.labels is not None:
        batch["labels"] = torch.from_numpy(data.labels[indices])
    if data.soft is not None:
        batch["soft"] = torch.from_numpy(data.soft[indices])
    return batch


class Collator:
    """`collate` with a tokenizer and a padding policy fixed: how a run turns rows into batches."""

    def __init__(self, tokenizer, fixed_shapes: bool = False):
        self.tokenizer, self.fixed_shapes = tokenizer, fixed_shapes

    def __call__(self, data: TaskData, indices: list[int], swap=None) -> dict:
        return collate(data, indices, self.tokenizer, swap, self.fixed_shapes)


def padding_layout(attention_mask: torch.Tensor) -> dict:
    """From a host mask: whether it has padding (`padded`, a Python bool) and, if so, the flat
    positions of the real tokens (`token_index`), so the encoder never reads a device mask."""
    padded = not bool(attention_mask.all())
    return {"padded": padded, **({"token_index": attention_mask.reshape(-1).nonzero().squeeze(1)} if padded else {})}


def to_device(batch: dict, device) -> dict:
    """The batch's tensors on `device` (copies that do not block the host); other values as they are."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def task_frames(data_dir, tasks: list[str], splits=("train", "dev"), downsample=None, seed: int = 0,
                dev_size: int | None = None) -> dict[str, dict]:
    """{split: {task: frame}} of the prepared splits of `tasks` that exist: the training splits
    downsampled, each dev split cut to a seeded subset of at most `dev_size` rows, in file order."""
    from minbert.data.downsample import downsample as downsample_frames
    from minbert.data.read import load_splits

    frames = {t: load_splits(data_dir, t, splits) for t in tasks}
    out: dict[str, dict] = {}
    for split in splits:
        split_frames = {t: f[split] for t, f in frames.items() if split in f}
        if split == "train" and downsample is not None:
            split_frames = downsample_frames(split_frames, downsample, seed)
        if split == "dev" and dev_size is not None:
            split_frames = {t: fr if len(fr) <= dev_size else fr.sample(n=dev_size, random_state=seed).sort_index()
                            for t, fr in split_frames.items()}
        out[split] = split_frames
    return out


def load_task_data(data_dir, tasks: list[str], heads: Heads, tokenizer, *, splits=("train", "dev"),
                   downsample=None, seed: int = 0, cache_dir=None) -> dict[str, dict[str, TaskData]]:
    """Read the prepared splits of `tasks`, downsample the training splits, tokenise (cached).

    Returns {split: {task: TaskData}} for the splits that exist."""
    return _tokenised(task_frames(data_dir, tasks, splits, downsample, seed), tokenizer, heads, cache_dir)


def load_training_data(cfg, data_dir, tokenizer, seed: int, cache_dir=None) -> dict[str, dict[str, TaskData]]:
    """A training run's train and dev splits as its settings cut them (`cfg`: FinetuneParams): its
    tasks' training rows downsampled, each dev split cut to `cfg.dev_size` rows; tokenised (cached)."""
    frames = task_frames(data_dir, cfg.tasks, ("train", "dev"), cfg.downsample, seed, cfg.dev_size)
    return _tokenised(frames, tokenizer, cfg.heads, cache_dir)


def _tokenised(frames: dict[str, dict], tokenizer, heads: Heads, cache_dir) -> dict[str, dict[str, TaskData]]:
    return {split: {t: build_task_data(t, fr, tokenizer, heads, cache_dir) for t, fr in fs.items()}
            for split, fs in frames.items()}

