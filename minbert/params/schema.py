"""The schema of params.yaml: the models of the settings the jobs read. Every key's help text is its
field's `description`, written once: docs/*.md's key tables and params.schema.json (for editors)
are generated from them (`python3 -m minbert.params.docs`).

Here: the data, pretraining, experiment, ensemble and export sections. Beside it: what every section
is built from (minbert.params.fields: `Strict`, names, seeds, `Downsample`), the fine-tuning sections
(minbert.params.finetune: heads, losses, SMART, distillation, head retraining), and the sections only
the report reads with the whole file's model (minbert.params.studies).

params.yaml has these top-level sections:

    data:         how `prepare` reads and validates the raw files (one prepare for all experiments)
    base:         the settings every experiment starts from (model, seed, device, finetune, ...)
    pretrainings: named pretraining configurations; experiments refer to them by name, so
                  experiments with the same pretraining share one pretrained output
    experiments:  named experiments, each a (deep-merged) override of `base`
    ensembles:    named ensembles over member experiments
    papers:       the reports that studies reproduce (title, overall formula, scale)
    studies:      the report's tables: a title, experiments as rows, a baseline row; a study may
                  carry its paper's table (`paper`: rows, columns, printed values, claims)
    report:       report settings
    export:       the experiments exported in the Hugging Face format

A model checks what one section can check on its own; what needs several sections (an ensemble's
members exist, a teacher trains what its student distils) is minbert.params.validate's, after
minbert.params.catalogue has expanded grids and seeds; minbert.params.load reads the files.
"""
from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from minbert.core.devices import DEVICES, PRECISIONS
from minbert.core.nli_data import NLI_DATA
from minbert.core.tasks import DEFAULT_TASKS
from minbert.params.fields import (
    LR_SCHEDULE,
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_STEPS,
    Downsample,
    Seed,
    Strict,
    known_task,
    refuse,
)
from minbert.params.finetune import FinetuneParams, RetrainHeadsParams
from minbert.params.heads import batch_statistic_problem, head_problem
from minbert.params.messages import raise_validation

Device = Literal[DEVICES]
Precision = Literal[PRECISIONS]
CLASSIFICATION_COMBINATIONS = ("mode", "mean_prob")    # how an ensemble combines (minbert.scoring.ensemble)
SIMILARITY_COMBINATIONS = ("median", "mean")
ClassificationCombination = Literal[CLASSIFICATION_COMBINATIONS]
MlmSource = Annotated[str, AfterValidator(lambda name: name if NLI_DATA.names(name) else known_task(name))]
SimilarityCombination = Literal[SIMILARITY_COMBINATIONS]

# ---------------------------------------------------------------- data (prepare)

class DataParams(Strict):
    """How `prepare` reads and checks the raw files (docs/data.md); one prepare for every experiment."""
    dir: str = Field("data/demo", description="folder of the raw files in the CS224N layout (the demo data "
                                              "ships in the repository)")
    nli_file: str | None = Field("data/demo/nli-sample.jsonl",
                                 description="SNLI/MNLI jsonl for NLI pretraining and MLM on NLI texts; "
                                             "null: no NLI data")
    include_cfimdb: bool = Field(False, description="also prepare ids-cfimdb-* (binary sentiment)")
    on_bad_rows: Literal["error", "drop"] = Field(
        "error", description="a bad row stops `prepare` with its file and line (`error`), or is left out and "
                             "counted by reason in summary.json (`drop`)")
    nli_dev_fraction: float = Field(0.1, gt=0, lt=1, description="share of NLI premise groups held out as nli-dev")
    seed: Seed = Field(11711, description="seeds the NLI train/dev split by premise group")


# ---------------------------------------------------------------- pretraining

class MlmParams(Strict):
    """Masked-LM pretraining on the tasks' texts."""
    tasks: list[MlmSource] = Field(
        list(DEFAULT_TASKS), description="whose texts to pretrain on: any of the tasks (sst, para, sts, cfimdb, "
                                         "your own) and nli")
    mask_prob: float = Field(0.15, gt=0, lt=1, description="share of word pieces chosen")
    downsample: Downsample = Field(Downsample(mode="smallest"), description="each source cut to the smallest "
                                                                            "(seeded), so no task dominates")


class NliParams(Strict):
    """Sentence-embedding pretraining on NLI pairs."""
    objective: Literal["regression", "contrastive", "triplet"] = Field(
        "contrastive", description="`regression`, `contrastive` or `triplet`")
    temperature: float = Field(0.05, gt=0, description="contrastive: cosine similarity / temperature")
    margin: float = Field(1.0, gt=0, description="triplet: Euclidean margin")
    pooling: Literal["mean", "cls"] = Field(
        "mean", description="sentence embedding: mean over non-padding tokens (SBERT) or `cls`; an experiment "
                            "starting from it must read the same `finetune.heads.pooling`")


class PretrainParams(Strict):
    """One named pretraining (docs/pretraining.md); experiments name it in `pretrain`."""
    kind: Literal["mlm", "nli", "para_first"] = Field(description="`mlm`, `nli` or `para_first`")
    model: str | None = Field(None, description="checkpoint to start from (name or folder; may be another "
                                                "pretraining's `model/`); null: the base model")
    epochs: int = Field(1, ge=1, le=MAX_EPOCHS, description="training epochs")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="examples per update")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.01, ge=0, description="AdamW; no decay on biases and LayerNorm weights")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of all the run's updates with linear warm-up")
    lr_schedule: Literal["linear", "cosine", "constant"] = Field("linear", description=LR_SCHEDULE)
    grad_clip: float | None = Field(1.0, gt=0, description="global gradient-norm clip, as in BERT's pretraining; "
                                                           "`null`: none")
    max_steps_per_epoch: int | None = Field(None, ge=1, le=MAX_STEPS, description="cut each epoch short (quick runs); the lr "
                                                                    "schedule is built on the cut epochs")
    dev_size: int | None = Field(None, ge=1, description="mlm and nli: evaluate on a seeded subset of at most this "
                                                         "many dev examples (quick runs)")
    evals_per_epoch: int = Field(1, ge=1, le=100, description="mlm and nli: dev loss evaluations per epoch, evenly "
                                                              "spaced over its updates, the last at its end: each a "
                                                              "row of history.csv and a candidate for the model kept "
                                                              "(a one-epoch pretraining needs several for the "
                                                              "report's training check to see its curve flatten)")
    precision: Precision | None = Field(
        None, description="`auto`, `bf16`, `fp16` or `fp32` for this pretraining only (e.g. `fp32` to keep a pretraining "
                          "in float32 while fine-tuning runs in bf16); null: the base's `precision`")
    finetune: dict[str, Any] = Field(
        {}, description="para_first only: what it changes in `base.finetune`, whose heads, dropout and other "
                        "settings paraphrase-first trains with, e.g. `{hidden_dropout: 0.3, heads: {para: "
                        "cross}}`; validated as a `finetune` section, and refused for the other kinds")
    mlm: MlmParams = Field(MlmParams(), description="kind mlm: its settings")
    nli: NliParams = Field(NliParams(), description="kind nli: its settings")


# ---------------------------------------------------------------- experiments

class NetworkSettings(Strict):
    """How a stage runs the network: keys of an experiment (in `base` or its own), and the part of
    the settings of every stage that runs the network (minbert.params.settings) that says so."""
    device: Device = Field("auto", description="`auto` (CUDA when there is a GPU), `cpu` or `cuda`")
    precision: Precision = Field(
        "auto", description="auto: bf16 autocast where bf16 is native (CUDA GPUs from Ampere on, CPUs with "
                            "avx512_bf16 / amx_bf16), fp16 autocast with loss scaling on a CUDA GPU without "
                            "bf16 (T4, V100), float32 elsewhere; bf16 / fp16 / fp32: that precision on every "
                            "device (fp16 trains with a gradient scaler; fp32 on CUDA multiplies matrices in "
                            "TF32)")
    deterministic: bool = Field(
        False, description="pin the algorithms (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace, the "
                           "math attention backend): a CUDA run repeats bit for bit, at some cost in speed")
    threads: int | None = Field(None, ge=1, le=1024, description="CPU threads of torch; null: its default")

    @classmethod
    def keys_of(cls, source) -> dict:
        """These settings' keys with their values in `source` (an experiment, or a stage's settings)."""
        return {k: getattr(source, k) for k in cls.model_fields}


class TrainingSettings(NetworkSettings):
    """How a stage that trains runs its steps, as well."""
    cuda_graphs: bool = Field(
        True, description="on a CUDA GPU, each training step shape is recorded once as a CUDA graph and replayed "
                          "(batches padded to a few fixed lengths; docs/finetuning.md, 'On a GPU'): the step costs "
                          "a few launches instead of a thousand; false: every kernel launched one by one")


class ExperimentParams(TrainingSettings):
    """One experiment = base deep-merged with its overrides; its keys of how the network runs (device,
    precision, ...: `TrainingSettings`) are those of every stage it runs."""
    model: str = Field("all-MiniLM-L6-v2", description="the checkpoint fine-tuned: a Hugging Face name or a folder")
    seed: Seed = Field(11711, description="seeds every random choice of the experiment (data order, heads, "
                                          "downsampling, dropout)")
    repeats: Annotated[int, Field(ge=1, le=100)] | list[Seed] = Field(
        1, description="run the experiment with several seeds, each a job of its own named <name>.seed<seed>: N "
                       "seeds (seed, seed + 1, ...) or the list of seeds; studies show the mean and spread over "
                       "them")
    max_length: int = Field(128, ge=8, le=512, description="word pieces per input (a pair's two sentences "
                                                           "together); longer inputs are cut")
    pretrain: str | None = Field(None, description="start from this pretraining's output (a name in "
                                                   "`pretrainings`); null: from `model`")
    finetune: FinetuneParams = Field(FinetuneParams(), description="multi-task fine-tuning (docs/finetuning.md)")
    retrain_heads: RetrainHeadsParams = Field(
        RetrainHeadsParams(), description="a second stage that trains heads over the frozen fine-tuned encoder")
    predict_batch_size: int = Field(128, ge=1, le=MAX_BATCH, description="batch size of the dev and test predictions")
    predict_test: bool = Field(True, description="predict the test split as well as dev; false: dev only (no claim, "
                                                 "table or submission can then read this experiment's test "
                                                 "predictions)")
    description: str = Field("", description="a sentence on the experiment, for the report and the model card")
    template: bool = Field(False, description="only the base of a study's grid: not run itself")

    @field_validator("repeats")
    @classmethod
    def _distinct_seeds(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty list of seeds; give a number of seeds or at least one seed")
            twice = next((v for k, v in enumerate(value) if v in value[:k]), None)
            if twice is not None:
                raise ValueError(f"seed {twice} is listed twice; list each seed once (the same seed gives the same "
                                 f"run again, not another sample)")
        return value

    @model_validator(mode="after")
    def _stages_run_together(self):
        """Fine-tuning and head retraining agree."""
        ft, rh = self.finetune, self.retrain_heads
        if rh.enabled and ft.freeze_encoder:
            raise refuse("retrain_heads.enabled", "the encoder is already frozen in finetune "
                                                  "(finetune.freeze_encoder); drop one of them")
        if not rh.enabled:
            return self
        for task in rh.tasks or []:
            problem = head_problem(ft.heads, task)
            if problem:
                raise refuse("finetune.heads", problem)
        batch = batch_statistic_problem(ft.heads, rh.tasks or ft.tasks, rh.batch_size, rh.downsample)
        if batch:
            raise refuse(f"retrain_heads.{batch[0]}", batch[1])
        return self


class EnsembleParams(Strict):
    """An ensemble over experiments' predictions."""
    members: list[str] = Field(description="experiments (two or more), or a repeated experiment, which stands for "
                                           "its seeds")
    classification: ClassificationCombination = Field(
        "mode", description="how classification tasks combine: the members' majority label (`mode`) or the "
                            "label of their mean probabilities (`mean_prob`)")
    similarity: SimilarityCombination = Field("median", description="how similarity scores combine")
    description: str = Field("", description="a sentence on the ensemble, for the report")

    @field_validator("members")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("an ensemble needs members (two or more experiments, or one repeated experiment)")
        return v


class ExportParams(Strict):
    """Models written in the Hugging Face format with a model card."""
    experiments: list[str] = Field(
        [], description="experiments written to results/exports/<E> in the Hugging Face format with a model card "
                        "(a repeated experiment: each seed); an export runs only for the experiments listed here")
    license: str = Field("apache-2.0", description="the model card's license (the Hub's identifiers)")
    language: str = Field("en", description="the model card's language")


# The sections a catalogue file provides; params.yaml keeps `catalogue` and `report`.
CATALOGUE_SECTIONS = ("modules", "tasks", "data", "base", "pretrainings", "experiments", "ensembles", "papers",
                      "studies", "export", "scales")

# ---------------------------------------------------------------- an experiment from base and overrides

def deep_merge(base: dict, override: dict) -> dict:
    """`base` with `override` on top, mapping by mapping (a copy: neither input changes)."""
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve_experiment(base: ExperimentParams, overrides: dict, name: str,
                       where: str = "params.yaml") -> ExperimentParams:
    """Experiment `name`: `base` (the keys it sets) deep-merged with its overrides, validated (a
    one-line error naming `experiments.<name>.<key>`)."""
    merged = deep_merge(base.model_dump(exclude_unset=True), overrides or {})
    try:
        return ExperimentParams.model_validate(merged)
    except ValidationError as err:
        raise_validation(err, ExperimentParams, where, prefix=f"experiments.{name}.")
