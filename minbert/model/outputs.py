"""What a head's output means: predictions and probabilities, and a regression head's scale.

What `MultitaskModel.forward(task, batch)` returns depends on the task's kind (minbert.core.tasks):
- classification (sst): (B, C) logits -> the argmax class and the softmax probabilities;
- binary (para, cfimdb): (B,) logit of the positive class -> 0/1 and its sigmoid (a head trained
  with a loss that fixes no scale, `ranking`, through its calibration: a logistic fit);
- regression (sts): (B,) score in the head's target space (`regression_target`), mapped back onto
  the label scale by `regression_prediction` and clipped to the label range (0-5) by `predictions`:
  every file the pipeline writes (predictions, submission files, `minbert predict`) and every score
  it computes reads these clipped values.
The training losses (minbert.train.losses) train the heads towards these same targets.

A head's `calibration` (what the model keeps per task: minbert.model.multitask) says which scale its
outputs are on: none (None), the labels'; `[scale, shift]`, a map fitted to the training labels when
training ended (a loss that fixes no scale: its declaration's `calibrate`); `[]`, a scale of its own
with no map yet (while such a head trains). Nothing here reads a loss.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from minbert.core.registry import Registry, active


def _signed_cosine_target(heads, task: str, registry: Registry) -> bool:
    """A head that reads `cosine_target` (its declaration says so: `cosine`) may predict the labels
    scaled to [-1, 1] (`cosine_target: -1_1`)."""
    return (heads.cosine_target == "-1_1"
            and "cosine_target" in registry.heads[heads.head_of(task, registry.tasks)].settings)


def regression_target(task: str, heads, label: Tensor, registry: Registry | None = None) -> Tensor:
    """Labels (e.g. STS 0-5) scaled into the space the head predicts in: [0, 1], or [-1, 1]
    (`registry`: the model's, whose tasks and heads these are; default: the one in use)."""
    registry = registry or active()
    lo, hi = registry.tasks[task].label_range
    unit = (label - lo) / (hi - lo)
    return unit * 2.0 - 1.0 if _signed_cosine_target(heads, task, registry) else unit


def empty_outputs(task: str, registry: Registry | None = None) -> Tensor:
    """A head's outputs for no rows (an empty split: a declared task without a test file)."""
    spec = (registry or active()).tasks[task]
    return torch.empty((0, spec.outputs) if spec.kind == "classification" else (0,))


def regression_prediction(task: str, heads, output: Tensor, calibration=None,
                          registry: Registry | None = None) -> Tensor:
    """The head's output mapped back onto the label scale by an affine map (unclipped: `predictions`
    clips it).

    A head trained with the correlation loss alone predicts on
    a scale of its own: it is mapped by `calibration` = (scale, shift), an affine fit to the
    training labels made when training ends (minbert.train.loop), when there is one; an affine map
    keeps r."""
    registry = registry or active()
    lo, hi = registry.tasks[task].label_range
    unit = (output + 1.0) / 2.0 if _signed_cosine_target(heads, task, registry) else output
    out = unit * (hi - lo) + lo
    if calibration:
        return out * calibration[0] + calibration[1]
    return out


def predictions(task: str, heads, output: Tensor, calibration=None,
                registry: Registry | None = None) -> dict[str, np.ndarray]:
    """Head outputs -> predictions (and the probabilities of a classification or binary task);
    `calibration`: a regression head's (scale, shift) (`regression_prediction`); `registry`: the
    model's (default: the one in use)."""
    output = output.detach().float().cpu()
    registry = registry or active()
    kind = registry.tasks[task].kind
    if kind == "classification":
        probs = output.softmax(-1)
        return {"prediction": probs.argmax(-1).numpy(), "probs": probs.numpy()}
    if kind == "binary":
        if calibration:     # the logit mapped as fitted (Platt scaling)
            output = output * calibration[0] + calibration[1]
        p1 = output.sigmoid()
        return {"prediction": (p1 > 0.5).long().numpy(), "probs": p1.numpy()}
    score = regression_prediction(task, heads, output, calibration, registry)
    if calibration != []:
        # A score outside the label range is no score a label can have (-1.15, 5.01 on ordinary pairs):
        # clipped here, where the model's scores are made, so the predictions files, the submission
        # files, `minbert predict` and the evaluation all read the same values. Pearson r moves by
        # a few thousandths on MSE-trained heads. A correlation-only head not yet calibrated predicts
        # on a scale of its own, where clipping would be meaningless.
        lo, hi = registry.tasks[task].label_range
        score = score.clamp(lo, hi)
    return {"prediction": score.numpy()}
