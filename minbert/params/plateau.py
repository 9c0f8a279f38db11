"""The plateau rule's settings, shared by the report's training check (`report.training_check`,
minbert.params.studies) and the fine-tuning loop that stops on it (`finetune.until_plateau`): the noise of
a dev evaluation, and the loop's own rule, whose unset keys are the check's (`with_check_rule`, at load),
so that a run stops where the check would pass its curve."""
from __future__ import annotations

import math

from pydantic import Field, model_validator

from minbert.params.fields import Strict


class NoiseParts(Strict):
    """How much a task's dev metric changes between two successive evaluations of a model that has
    stopped improving: the square root of jitter^2 + rows_part^2 / the dev rows scored."""
    jitter: float = Field(ge=0, description="the model's own move between evaluations, whatever the rows scored")
    rows: float = Field(gt=0, description="the part that falls as the square root of the dev rows scored (for an "
                                          "accuracy, the square root of the share of rows whose prediction flips)")


class EvaluationNoise(Strict):
    """The noise of dev evaluations, by the task's kind (docs/report.md, "The evaluations' noise":
    measured on real fine-tunes of the packaged MiniLM)."""
    classification: NoiseParts = Field(NoiseParts(jitter=0.022, rows=0.46), description="a classification's "
                                                                                        "accuracy (SST-5)")
    binary: NoiseParts = Field(NoiseParts(jitter=0.022, rows=0.36), description="a binary task's accuracy (Quora, "
                                                                                "CFIMDB)")
    regression: NoiseParts = Field(NoiseParts(jitter=0.003, rows=0.13), description="a regression's Pearson r (STS)")


THE_CHECKS = "null: `report.training_check`'s"
RULE_KEYS = ("tolerance", "window", "fit", "window_evaluations", "min_evaluations", "noise")


class UntilPlateau(Strict):
    """Train each phase until its dev curve has settled, by the rule the report's training check reads
    (minbert.train.plateau), `finetune.epochs` being the cap (docs/finetuning.md, "Until the plateau")."""
    enabled: bool = Field(False, description="after each dev evaluation, end the phase once its selection score "
                                             "(history.csv's `dev_score`) reads flat at its evaluations' noise and "
                                             "no trained task's own dev metric reads still rising; `epochs` is the "
                                             "cap (the learning-rate schedule is planned over it)")
    tolerance: float | None = Field(None, gt=0, description="the rise one more `window` of training may still bring "
                                                            "(score units); " + THE_CHECKS + " (its largest)")
    window: float | None = Field(None, gt=0, lt=1, description="the last share of the phase's learning-rate budget "
                                                               "so far whose trend is read; " + THE_CHECKS)
    fit: float | None = Field(None, gt=0, lt=1, description="the last share of that budget the trend is fitted over "
                                                            "(at least the window); " + THE_CHECKS)
    window_evaluations: int | None = Field(None, ge=1, description="the fewest evaluations within the window; "
                                                                   + THE_CHECKS)
    min_evaluations: int | None = Field(None, ge=3, description="the fewest evaluations of the phase before it may "
                                                                "stop; " + THE_CHECKS)
    noise: EvaluationNoise | None = Field(None, description="how much each kind of task's dev metric moves between "
                                                            "two evaluations, for the dev rows the run scores "
                                                            "(`dev_size`); " + THE_CHECKS)

    @model_validator(mode="after")
    def _fit_covers_the_window(self):
        if self.fit is not None and self.window is not None and self.fit < self.window:
            raise ValueError(f"fit ({self.fit:g}) is below window ({self.window:g}): the trend is fitted over at least "
                             f"the window")
        return self


def with_check_rule(rule: UntilPlateau, check) -> UntilPlateau:
    """`rule` with each key it leaves unset (null) taken from the training check's settings `check`
    (TrainingCheckParams; `tolerance`: its largest), so that a run stops where the check would pass it;
    a rule switched off stays as it is (its keys are never read)."""
    if not rule.enabled:
        return rule
    unset = {k: getattr(check, k) for k in RULE_KEYS if getattr(rule, k) is None}
    return UntilPlateau.model_validate({**rule.model_dump(exclude_none=True), **{
        k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in unset.items()}})


def evaluations_needed(rule: UntilPlateau) -> int:
    """The fewest dev evaluations a phase needs before the rule can read it flat: `min_evaluations`, and
    `window_evaluations` within its last `window` of evenly spaced ones (a filled rule)."""
    return max(rule.min_evaluations, math.ceil(rule.window_evaluations / rule.window))
