"""A deterministic encoder's sentence embeddings of a split, each encoding embedded once.

In eval mode every encoder is deterministic (a branch of extra layers too), and a frozen encoder
without dropout gives the same outputs every epoch: `FrozenFeatures` embeds each encoding a task's
split needs once, in length-sorted batches, and the heads then run on the stored embeddings. Used by
prediction (minbert.model.multitask.predict_task: the predict stage, dev evaluation during training,
the Python API), so a symmetric pair's two orders share one encoder pass per sentence, and by the
training loop for a frozen encoder (minbert.train.frozen). The stored embeddings equal the ones the
encoder gives batch by batch up to float rounding (tests/test_frozen.py). `model` is the multi-task
model (minbert.model.multitask.MultitaskModel, which uses this module): what is read of it is its
`embed` and `head_forward`, its heads settings and its calibration.
"""
from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import PAD_MULTIPLE, TaskData, padding_layout, to_device
from minbert.data.views import SWAPPED
from minbert.model.outputs import empty_outputs, predictions

ENCODE_BATCH = 128


class FrozenFeatures:
    """Sentence embeddings of every encoding a task's split needs (its view's parts, and the swapped
    cross-encoding of a symmetric pair task), computed at once with the encoder in eval mode."""

    def __init__(self, model, data: TaskData, tokenizer, device, amp, batch_size: int = ENCODE_BATCH,
                 progress=None):
        """`batch_size`: rows of one encoding embedded at a time; `progress(n)`: called as rows are done
        (a row counts once all its encodings are)."""
        self.task, self.view = data.task, data.view
        self.batch_size, self._progress, self._done = batch_size, progress, 0
        self.labels, self.soft, self.symmetric = data.labels, data.soft, data.symmetric
        self.emb: dict[str, torch.Tensor] = {}
        training = model.encoder.training
        model.encoder.eval()
        try:
            with torch.no_grad():
                parts = data.view.encodings(data.symmetric)
                for k, part in enumerate(parts):
                    self.emb[part] = self._embed(model, data.enc[part], tokenizer, device, amp, k, len(parts))
        finally:
            model.encoder.train(training)

    def _embed(self, model, rows, tokenizer, device, amp, k: int = 0, n_parts: int = 1) -> torch.Tensor:
        order = np.argsort([len(ids) for ids, _ in rows], kind="stable")
        chunks, index = [], []
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            batch = tokenizer.pad([rows[i] for i in idx], multiple_of=PAD_MULTIPLE)
            batch.update(padding_layout(batch["attention_mask"]))
            with amp():
                chunks.append(model.embed(to_device(batch, device), task=self.task))
            index.append(idx)
            if self._progress is not None:            # rows whose every encoding is embedded
                done = (k * len(order) + start + len(idx)) // n_parts
                self._progress(done - self._done)
                self._done = done
        emb = torch.cat(chunks)
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[np.concatenate(index)] = np.arange(len(order))
        return emb[torch.from_numpy(inverse).to(emb.device)]             # back to row order: (N, H)

    def rows(self, indices, swap=None) -> torch.Tensor:
        """The embeddings the encoder would give for `indices` (pairs k with swap[k] read as (b, a)),
        stacked part by part as the view's batches are: (len(parts) * B, H)."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64)).to(next(iter(self.emb.values())).device)
        parts = []
        for p in self.view.parts:
            straight = self.emb[p].index_select(0, idx)
            if swap is not None and self.symmetric and p in SWAPPED and any(swap):
                mask = torch.as_tensor(swap, dtype=torch.bool).to(straight.device)[:, None]
                straight = torch.where(mask, self.emb[SWAPPED[p]].index_select(0, idx), straight)
            parts.append(straight)
        return torch.cat(parts)

    def batch(self, indices, swap=None) -> dict:
        """A training batch: the stored embeddings (`emb`), labels and soft targets as collate gives them."""
        batch = {"emb": self.rows(indices, swap)}
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[indices])
        if self.soft is not None:
            batch["soft"] = torch.from_numpy(self.soft[indices])
        return batch

    @torch.no_grad()
    def predict(self, model, amp, batch_size: int = 1024, loss=None, labels=None, order=None) -> dict:
        """What minbert.model.multitask.predict_task gives (outputs, predictions, probabilities and,
        with `loss` and the split's `labels`, its loss batch by batch), from the stored embeddings;
        a symmetric pair task's output is the mean over both orders. `order`: the rows in the order
        their batches take them (default: as stored); the outputs come back in row order."""
        model.eval()
        n = len(next(iter(self.emb.values())))
        order = np.arange(n) if order is None else np.asarray(order)
        passes = [False, True] if self.symmetric else [False]
        outputs, total = [], 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size].tolist()
            out, pair = 0.0, None
            for swapped in passes:
                with amp():
                    o, p = model.head_forward(self.task, self.rows(idx, [swapped] * len(idx)), return_pair=True)
                out, pair = out + o.float().cpu(), pair if pair is not None else p
            outputs.append(out / len(passes))
            if loss is not None and labels is not None:
                target = torch.as_tensor(np.asarray(labels)[idx])
                total += float(loss(outputs[-1], target, tuple(x.float().cpu() for x in pair))) * len(idx)
        out = torch.cat(outputs) if outputs else empty_outputs(self.task, model.registry)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        out = out[torch.from_numpy(inverse)]                                 # back to row order
        result = predictions(self.task, model.heads_cfg, out, model.calibration.get(self.task), model.registry)
        result["output"] = out
        if loss is not None and labels is not None and n:
            result["loss"] = total / n
        return result
