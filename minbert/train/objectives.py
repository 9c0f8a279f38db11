"""A task's training objective: the head's output for a batch and the loss on it.

`TaskObjective` gives the gold-label loss (minbert.train.losses.task_loss); distillation
(`Distilled`) and SMART (`Smart`) are wrappers around an inner objective that change or add to its
loss, as sentence-transformers' losses wrap a model. `build_objective` stacks them as a task's
settings ask; the training loop calls `objective(batch)` and gets (loss, output).
"""
from __future__ import annotations

import torch

from minbert.core.settings import Finetune
from minbert.model.multitask import MultitaskModel
from minbert.train.losses import distill_loss, task_loss
from minbert.train.regularisers import Ascent, bregman_term, smart_adversarial_loss


def model_inputs(batch: dict) -> dict:
    """What the model reads of a batch (not the targets)."""
    return {k: v for k, v in batch.items() if k not in ("labels", "soft")}


class TaskObjective:
    """One task's training objective: the head's output for a device batch and the gold-label loss
    on it (minbert.train.losses.task_loss). `objective(batch)` returns (loss, output). Distillation
    and SMART are wrappers (`Distilled`, `Smart`) with the same three parts, each changing the loss
    its inner objective gives; `build_objective` stacks them as a task's settings ask."""

    def __init__(self, task: str, model: MultitaskModel):
        self.task, self.model = task, model
        # a loss that ranks the pair's sentence vectors reads them beside the head's output
        registry = model.registry
        self.reads_pairs = registry.losses[model.heads_cfg.loss_of(task, registry.tasks)].reads == "pairs"

    def forward(self, inputs: dict, return_embeddings: bool = False):
        """The head's output, and the pair's vectors for a loss that reads them (output, pair); with
        `return_embeddings`, the word embeddings too, for SMART (output, word, pair)."""
        if "emb" in inputs:   # a frozen encoder's stored embeddings: the heads only
            out, pair = self.model.head_forward(self.task, inputs["emb"], return_pair=True)
            return (out, None, pair) if return_embeddings else (out, pair)
        if return_embeddings:
            out, word, pair = self.model(self.task, inputs, return_embeddings=True, return_pair=True)
            return out, word, pair
        if self.reads_pairs:
            return self.model(self.task, inputs, return_pair=True)
        return self.model(self.task, inputs), None

    def loss(self, output: torch.Tensor, batch: dict, pair=None) -> torch.Tensor:
        return task_loss(self.task, self.model.heads_cfg, output, batch["labels"], pair)

    def __call__(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        output, pair = self.forward(model_inputs(batch))
        return self.loss(output, batch, pair), output


class ObjectiveWrapper(TaskObjective):
    """An objective around another: the inner one's forward and loss unless it changes them."""

    def __init__(self, inner: TaskObjective):
        super().__init__(inner.task, inner.model)
        self.inner = inner

    def forward(self, inputs: dict, return_embeddings: bool = False):
        return self.inner.forward(inputs, return_embeddings)

    def loss(self, output: torch.Tensor, batch: dict, pair=None) -> torch.Tensor:
        return self.inner.loss(output, batch, pair)


class Distilled(ObjectiveWrapper):
    """Distillation: on a batch with the teacher's outputs (`soft`), (1 - weight) x the gold-label
    loss + weight x the loss against the teacher (minbert.train.losses.distill_loss, which computes
    the gold-label part as the task objective does); the inner loss on a batch without them."""

    def __init__(self, inner: TaskObjective, distill):
        super().__init__(inner)
        self.distill = distill          # minbert.core.settings.Distill: weight, temperature

    def loss(self, output: torch.Tensor, batch: dict, pair=None) -> torch.Tensor:
        if batch.get("soft") is None:
            return self.inner.loss(output, batch, pair)
        return distill_loss(self.task, self.model.heads_cfg, output, batch["labels"], batch["soft"], self.distill, pair)


class Smart(ObjectiveWrapper):
    """SMART (minbert.train.regularisers): the inner loss plus λ_s x the adversarial smoothness term
    on the word embeddings and, with the `momentum` copy of the model, μ x the Bregman term against its
    output.
    A head trained on a frozen encoder's stored embeddings has no word embeddings to perturb: the
    inner objective alone."""

    def __init__(self, inner: TaskObjective, smart, momentum, generator: torch.Generator):
        super().__init__(inner)
        self.smart, self.momentum, self.generator = smart, momentum, generator

    def __call__(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = model_inputs(batch)
        if "emb" in inputs:
            return self.inner(batch)
        model, task, sm = self.model, self.task, self.smart
        out, word, pair = self.forward(inputs, return_embeddings=True)
        loss = self.loss(out, batch, pair)
        kind = model.registry.tasks[task].kind
        if sm.lambda_s > 0:
            adv = smart_adversarial_loss(lambda e: model(task, inputs, inputs_embeds=e), word, out, kind,
                                         Ascent(sm.step_size, sm.epsilon, sm.noise_var, sm.steps),
                                         generator=self.generator)
            loss = loss + sm.lambda_s * adv
        if self.momentum is not None:
            with torch.no_grad():
                momentum_out = self.momentum.module(task, inputs)
            loss = loss + sm.mu * bregman_term(out, momentum_out, kind)
        return loss, out


def build_objective(task: str, model: MultitaskModel, cfg: Finetune, distilled: bool, momentum=None,
                    generator: torch.Generator | None = None) -> TaskObjective:
    """The task's objective as the settings ask: the task loss, distilled when its training data
    carries a teacher's outputs (`distilled`), with SMART's terms when SMART covers the task (its
    noise drawn by `generator`, the Bregman term against the `momentum` copy)."""
    objective = TaskObjective(task, model)
    if cfg.distill is not None and distilled:
        objective = Distilled(objective, cfg.distill)
    if cfg.smart.enabled and (cfg.smart.tasks is None or task in cfg.smart.tasks):
        objective = Smart(objective, cfg.smart, momentum, generator)
    return objective
