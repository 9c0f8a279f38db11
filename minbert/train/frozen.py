"""A frozen, deterministic encoder's sentence embeddings, computed once per split.

With `finetune.freeze_encoder` (the frozen baseline, and every head retraining) the encoder's
outputs are the same every epoch: only the heads (and a shared block) learn. Recomputing them is
most of such a job's time, so `FrozenFeatures` embeds each encoding of a split once, in length-sorted
batches, and the training step and the dev evaluation run the heads on the stored embeddings.

Only where the frozen encoder is deterministic: not with `frozen_encoder_dropout` (its dropout then
draws new masks every batch, as the course code does), not with SMART (its perturbation goes through
the encoder), not for a task with a trainable branch of extra layers over the encoder (003's
FREEZE_SST). The stored embeddings equal the ones the encoder gives batch by batch up to float
rounding (tests/test_frozen.py).

Prediction (minbert.model.multitask.predict_task: the predict stage, dev evaluation during training,
the Python API) runs the model in eval mode, where every encoder is deterministic, branches
included: it embeds each encoding once the same way, so a symmetric pair task's two orders share
one pass of the encoder over each sentence.
"""
from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import PAD_MULTIPLE, TaskData, padding_layout, to_device
from minbert.data.views import SWAPPED
from minbert.model.multitask import MultitaskModel, empty_outputs
from minbert.model.outputs import predictions

ENCODE_BATCH = 128


def cacheable(model: MultitaskModel, cfg, task: str) -> bool:
    """Whether `task`'s sentence embeddings are the same every time they are computed in this run."""
    return (cfg.freeze_encoder and not cfg.frozen_encoder_dropout and not cfg.smart.enabled
            and task not in model.branches)


class FrozenFeatures:
    """Sentence embeddings of every encoding a task's split needs (its view's parts, and the swapped
    cross-encoding of a symmetric pair task), computed at once with the encoder in eval mode."""

    def __init__(self, model: MultitaskModel, data: TaskData, tokenizer, device, amp, batch_size: int = ENCODE_BATCH,
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
    def predict(self, model: MultitaskModel, amp, batch_size: int = 1024, loss=None, labels=None) -> dict:
        """What minbert.model.multitask.predict_task gives (outputs, predictions, probabilities and,
        with `loss` and the split's `labels`, its loss batch by batch), from the stored embeddings;
        a symmetric pair task's output is the mean over both orders."""
        model.eval()
        n = len(next(iter(self.emb.values())))
        passes = [False, True] if self.symmetric else [False]
        outputs, total = [], 0.0
        for start in range(0, n, batch_size):
            idx = list(range(start, min(n, start + batch_size)))
            out, pair = 0.0, None
            for swapped in passes:
                with amp():
                    o, p = model.head_forward(self.task, self.rows(idx, [swapped] * len(idx)), return_pair=True)
                out, pair = out + o.float(), pair if pair is not None else p
            outputs.append(out / len(passes))
            if loss is not None and labels is not None:
                target = torch.as_tensor(np.asarray(labels)[idx])
                total += float(loss(outputs[-1].cpu(), target, tuple(x.float().cpu() for x in pair))) * len(idx)
        out = torch.cat(outputs).cpu() if outputs else empty_outputs(self.task)
        result = predictions(self.task, model.heads_cfg, out, model.calibration.get(self.task))
        result["output"] = out
        if loss is not None and labels is not None and n:
            result["loss"] = total / n
        return result
