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

from minbert.core.errors import MinBertError
from minbert.core.registry import Registry, active
from minbert.core.settings import Heads
from minbert.data.batches import TaskData
from minbert.data.views import View, view_of
from minbert.model.bert import BertModel, mean_pool
from minbert.model.blocks import Branch, HybridPairHead, SharedBlock, make_head, reaches, shared_widths
from minbert.model.embeddings import FrozenFeatures
from minbert.model.outputs import empty_outputs, predictions
from minbert.model.tokenizer import Tokenizer

HYBRID_TERM = "cross"      # the head whose output a hybrid pair task adds to its bi-encoder head's


class MultitaskModel(nn.Module):
    """One encoder and a head per task, each head the registry's class of the name the heads settings
    give it (`registry`: the one the settings were read with; default: the one in use)."""

    def __init__(self, encoder: BertModel, heads: Heads, tasks: list[str], registry: Registry | None = None):
        super().__init__()
        self.encoder = encoder
        self.heads_cfg = heads
        self.registry = registry or active()
        self.tasks: list[str] = []
        self.views: dict[str, View] = {}
        sh = heads.shared
        H = encoder.config.hidden_size
        self.shared = SharedBlock(H, shared_widths(sh.sizes, H), sh.activation, heads.dropout) if sh else None
        self.branches = nn.ModuleDict()
        self.heads = nn.ModuleDict()
        # task -> [scale, shift] fitted when training ended; [] while a head trained with a loss that
        # fixes no scale (its declaration: `calibrate`) has none yet (minbert.model.outputs)
        self.calibration: dict[str, list[float]] = {}
        self._checked: set[str] = set()      # tasks whose head's output has been checked (its first call)
        self._checked_grad: set[str] = set()  # and that it reaches the model's parameters (its first call in training)
        self.add_tasks(tasks)

    def _in_dim(self, task: str) -> int:
        if self.shared is not None and task in self.heads_cfg.shared.tasks:
            return self.shared.out_dim
        return self.encoder.config.hidden_size

    def _new_head(self, task: str) -> nn.Module:
        cfg, spec, registry = self.heads_cfg, self.registry.tasks[task], self.registry
        head = make_head(registry.implementation("head", cfg.head_of(task, registry.tasks)), self._in_dim(task), spec,
                         cfg)
        if self.views[task].name == "hybrid":
            head = HybridPairHead(head, make_head(registry.implementation("head", HYBRID_TERM), self._in_dim(task),
                                                  spec, cfg))
        if registry.losses[cfg.loss_of(task, registry.tasks)].calibrate:
            self.calibration[task] = []
        else:
            self.calibration.pop(task, None)
        self._checked.discard(task)
        return head

    def add_tasks(self, tasks: list[str]) -> None:
        """Give the model heads (and branches) for `tasks` it does not have yet."""
        for task in tasks:
            if task in self.heads:
                continue
            self.tasks.append(task)
            self.views[task] = view_of(task, self.heads_cfg, self.registry)
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
            self.shared = SharedBlock(H, shared_widths(sh.sizes, H), sh.activation, self.heads_cfg.dropout).to(self._device())
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
            if task not in self._checked:       # the head's first call: its output as the contract says
                self._check_output(task, out, len(parts[0]))
            if task not in self._checked_grad and torch.is_grad_enabled():
                self._check_gradient(task, out, parts)
            return (out, parts[:2]) if return_pair else out

    def _check_output(self, task: str, out, rows: int) -> None:
        """A head gives (B, C) for a task of C classes, else (B,), in float32 or float64; a one-line
        error naming its module and class otherwise (a user's head that breaks the contract would
        otherwise fail deep in a loss, or train nothing). Its shape and type only: no host sync."""
        spec, name = self.registry.tasks[task], self.heads_cfg.head_of(task, self.registry.tasks)
        want = (rows, spec.outputs) if spec.kind == "classification" else (rows,)
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if got != want or out.dtype not in (torch.float32, torch.float64):
            what = f"{type(out).__name__}" if got is None else f"shape {got}, {str(out.dtype).removeprefix('torch.')}"
            raise MinBertError(f"{self.registry.heads[name].where}: head '{name}' returned {what} for {rows} rows of "
                               f"{task}, which has {spec.outputs} output{'s' if spec.outputs > 1 else ''}; forward "
                               f"must return a float tensor of shape {_shape(want)} (docs/extending.md)")
        self._checked.add(task)

    def _check_gradient(self, task: str, out, parts) -> None:
        """A head's output reaches the model's parameters (its own, or the encoder's through its
        inputs) when anything can train (a one-line error naming its module and class: a detached
        output passes the shape check and trains nothing); checked once, on its first training call."""
        params = [p for p in self.heads[task].parameters() if p.requires_grad]
        inputs = [x for x in parts if isinstance(x, torch.Tensor) and x.requires_grad]
        if (params or inputs) and not reaches(out, inputs + params):
            name = self.heads_cfg.head_of(task, self.registry.tasks)
            raise MinBertError(f"{self.registry.heads[name].where}: head '{name}' returned an output for {task} that does "
                               f"not reach the model's parameters (computed outside the graph: .detach(), .item(), "
                               f"numpy, a new tensor), so it would train nothing; compute it from its inputs with torch "
                               f"operations (docs/extending.md)")
        self._checked_grad.add(task)

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
    model.eval()
    if len(data) == 0:
        out = empty_outputs(data.task, model.registry)
        return {**predictions(data.task, model.heads_cfg, out, model.calibration.get(data.task), model.registry),
                "output": out}
    features = FrozenFeatures(model, data, tokenizer, model_device(model), amp_context, batch_size, progress)
    labels = data.labels if loss is not None else None
    return features.predict(model, amp_context, batch_size, loss, labels, order=np.argsort(data.lengths(), kind="stable"))


def _shape(shape: tuple) -> str:
    return "(B, " + ", ".join(map(str, shape[1:])) + ")" if len(shape) > 1 else "(B,)"


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def head_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]


def encoder_parameters(model: MultitaskModel):
    return [(n, p) for n, p in model.named_parameters() if n.startswith("encoder.")]
