"""The multi-task model: one encoder, one head per task, and its pass over a split.

What `MultitaskModel.forward(task, batch)` returns, and how it becomes a prediction, is
minbert.model.outputs; how the encoder reads a task's examples (one sentence, a cross-encoded pair,
each sentence of a pair, or both) is the task's view (minbert.data.views); batches are
minbert.data.batches; checkpoints (model.pt) are minbert.model.checkpoint.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from minbert.core.extensions import HEADS
from minbert.core.tasks import TASKS
from minbert.data.batches import TaskData
from minbert.data.views import View, view_of
from minbert.model.bert import BertModel, mean_pool
from minbert.model.heads import (
    BiPairHead,
    Branch,
    ClassifierHead,
    CrossPairHead,
    HybridPairHead,
    PrototypeHead,
    SharedBlock,
)
from minbert.model.outputs import predictions
from minbert.model.tokenizer import Tokenizer
from minbert.params.finetune import HeadsParams


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
        hl, dp, name, outputs = cfg.depth(task), cfg.dropout, cfg.head_of(task), TASKS[task].outputs
        if name in HEADS:            # a head of the user's (minbert.core.extensions)
            return HEADS[name](D, outputs, hl, dp)
        if view == "single":
            if name == "prototypes":
                return PrototypeHead(D, outputs, cfg.prototypes_per_label, dp)
            return ClassifierHead(D, outputs, hl, dp)
        if view == "cross":
            return CrossPairHead(D, hl, dp, outputs)
        # a binary task's cosine head starts with a cosine of 0.75 as p = 0.5
        scale, bias = (10.0, -7.5) if TASKS[task].kind == "binary" else (1.0, 0.0)
        bi = BiPairHead(name, D, hl, dp, init_scale=scale, init_bias=bias, affine=cfg.cosine_affine, outputs=outputs)
        return HybridPairHead(bi, CrossPairHead(D, hl, dp, outputs)) if view == "hybrid" else bi

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
                           padded=batch.get("padded"), token_index=batch.get("token_index"),
                           unpad=batch.get("unpad", True))
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

    def head_forward(self, task: str, emb: torch.Tensor, return_pair: bool = False):
        """Apply task's head to the embeddings of a batch stacked as its view says (with `return_pair`,
        also the pair's two sentence vectors u, v the head read, for a loss that ranks them). The
        heads run in float32 whatever the autocast: they cost nothing next to the encoder, and a
        regression head's scores (nearly equal for similar pairs) would otherwise be rounded to
        bf16's three digits, which scrambles their order and any calibration fitted on them."""
        with torch.autocast(emb.device.type, enabled=False):
            emb = emb.float()
            if self.shared is not None and task in self.heads_cfg.shared.tasks:
                emb = self.shared(emb)
            parts = self.views[task].split(emb)
            out = self.heads[task](*parts)
            return (out, parts[:2]) if return_pair else out

    def forward(self, task: str, batch: dict, inputs_embeds=None, return_embeddings=False, return_pair=False):
        """The head's output; with `return_embeddings` also the word embeddings (SMART), with
        `return_pair` also the pair's sentence vectors (`head_forward`): (output, [word], [pair])."""
        if not (return_embeddings or return_pair):
            return self.head_forward(task, self.embed(batch, inputs_embeds, task=task))
        emb, word = self.embed(batch, inputs_embeds, return_embeddings=True, task=task)
        out = self.head_forward(task, emb, return_pair)
        head, pair = out if return_pair else (out, None)
        return (head,) + ((word,) if return_embeddings else ()) + ((pair,) if return_pair else ())


@torch.no_grad()
def predict_task(model: MultitaskModel, data: TaskData, tokenizer: Tokenizer, batch_size: int, device,
                 amp_context, progress=None, loss=None) -> dict:
    """Run the model over a split; returns outputs in input order. In eval mode the encoder is
    deterministic, so each encoding a split needs is embedded once (length-sorted, `batch_size` rows at
    a time: minbert.model.embeddings.FrozenFeatures), and the heads then run over the rows in length order:
    a symmetric pair task's output is the mean of the outputs for (a, b) and (b, a), its sentences
    encoded once for both orders. `progress(n)`: called as rows are done. `loss(output, labels, pair)`:
    the loss of a labelled split, computed batch by batch (as training computes it: a loss over the
    batch stays one over batches, and a ranking loss costs a batch's square, not the split's), their
    mean by rows as `loss`."""
    from minbert.model.embeddings import FrozenFeatures

    model.eval()
    if len(data) == 0:
        out = empty_outputs(data.task)
        return {**predictions(data.task, model.heads_cfg, out, model.calibration.get(data.task)), "output": out}
    features = FrozenFeatures(model, data, tokenizer, model_device(model), amp_context, batch_size, progress)
    labels = data.labels if loss is not None else None
    return features.predict(model, amp_context, batch_size, loss, labels, order=np.argsort(data.lengths(), kind="stable"))


def empty_outputs(task: str) -> torch.Tensor:
    """A head's outputs for no rows (an empty split: a declared task without a test file)."""
    return torch.empty((0, TASKS[task].outputs) if TASKS[task].kind == "classification" else (0,))


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def head_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]


def encoder_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if n.startswith("encoder.")]
