"""What each stage reads from params.yaml: its settings, resolved (base merged, catalogue applied).

Every stage's library entry point takes its settings and nothing else from the params, so a stage
cannot read a setting that is not in its job's description (minbert.pipeline.plan): the settings
below *are* that part of the description. A stage reads them back from its job file as plain data
(minbert.core.settings: the same keys, no schema), so these models and their checks are the
planner's, in no job's code. Cosmetic keys (`description`, the report's layout) are in
none of them but the report's; `predict_batch_size` only in the predictions'. How each is computed
from a params file is minbert.params.resolve, the planner's side: a job receives its settings
resolved and never runs the loader.

Every settings model but the report's derives from `Declarations`: the declarations of the user's
tasks the job works with and the user's modules its heads and losses come from, which enter the
registries before the rest is read (and are left out of the settings when there are none).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from minbert.core.layout import PREDICTED_SPLITS, TRAINING_STAGES
from minbert.params.finetune import FinetuneParams, SmartParams
from minbert.params.plateau import UntilPlateau
from minbert.params.schema import (
    ClassificationCombination,
    DataParams,
    NetworkSettings,
    PretrainParams,
    SimilarityCombination,
    TrainingSettings,
)
from minbert.params.tasks import Declarations

TrainingStage = Literal[TRAINING_STAGES]     # the training stage whose model a later stage reads
PredictedSplit = Literal[PREDICTED_SPLITS]   # a split an experiment predicts (dev always, test unless off)
# the heads a stage that loads a trained model finds in it, by name: their code is the job's code
ModelHeads = Field([], description="the heads of the model it loads")


def extras_off() -> dict:
    """What a training derived from an experiment's fine-tuning leaves out of it (head retraining,
    paraphrase-first): its regularisers, its distillation, its walk through tasks across epochs and its
    stop at the plateau (each runs its own epochs)."""
    return {"smart": SmartParams(), "pcgrad": False, "walk_through": [], "distill": None,
            "until_plateau": UntilPlateau()}


class PrepareSettings(DataParams, Declarations):
    """The data section, and the user's tasks, whose files prepare reads too."""


class EvaluateSettings(Declarations):
    """Scoring predictions needs no setting but the tasks and splits it scores (and the user's tasks
    among them)."""
    predicts: list[str]                     # the tasks whose predictions it scores
    splits: list[PredictedSplit] = list(PREDICTED_SPLITS)   # the splits predicted


class PretrainSettings(TrainingSettings, Declarations):
    model: str                              # the model the pretraining starts from
    seed: int
    max_length: int
    pretraining: PretrainParams
    finetune: FinetuneParams | None = None  # para_first only: the fine-tuning of the paraphrase task it runs


class FinetuneSettings(TrainingSettings, Declarations):
    model: str | None                       # None: it starts from `pretrain`'s output (a job input)
    pretrain: str | None = None
    seed: int
    max_length: int
    finetune: FinetuneParams


class RetrainSettings(TrainingSettings, Declarations):
    seed: int
    train: FinetuneParams                   # head retraining's effective training settings
    heads: list[str] = ModelHeads


class PredictSettings(NetworkSettings, Declarations):
    batch_size: int
    model_stage: TrainingStage              # which training stage's model predicts
    predicts: list[str]                     # the tasks of that model: one predictions file per task and split
    splits: list[PredictedSplit] = list(PREDICTED_SPLITS)   # dev, and test unless `predict_test` is off
    heads: list[str] = ModelHeads


class TeachSettings(NetworkSettings, Declarations):
    members: dict[str, TrainingStage]       # the experiments it averages -> which model
    predicts: list[str]                     # the tasks it predicts (the ones its students distil)
    similarity: SimilarityCombination = "mean"   # how a regression task's scores are combined
    heads: list[str] = ModelHeads


class ExportSettings(Declarations):
    model_stage: TrainingStage              # which training stage's model is exported
    predicts: list[str]                     # its tasks: the predictions and training data the card reads
    splits: list[PredictedSplit] = list(PREDICTED_SPLITS)   # the splits predicted
    description: str = ""                   # the experiment's, for the model card
    license: str
    language: str
    base_model: str | None = None           # the Hub id it was fine-tuned from, for the card's metadata
    start_model: str = ""                   # what it started from, as the card says it (a Hub id or a folder)
    pretraining: str | None = None          # the further pretraining between the two (name and kind)
    data: str = ""                          # data.dir, for the card
    demo_data: bool = False                 # data.dir holds the synthetic demo data (minbert.core.datasets)
    heads: list[str] = ModelHeads


class EnsembleSettings(Declarations):
    members: list[str]
    classification: ClassificationCombination
    similarity: SimilarityCombination
    predicts: list[str]                     # the tasks every member predicts: one file per task and split
    splits: list[PredictedSplit] = list(PREDICTED_SPLITS)   # the splits every member predicts
