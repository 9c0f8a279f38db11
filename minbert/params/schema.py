"""The schema of params.yaml: its models and constants. Every key's help text is its field's
`description`, written once here: docs/*.md's key tables and params.schema.json (for editors) are
generated from it (`python3 -m minbert.params.docs`).

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

A model checks what one section can check on its own; what needs several sections (an ensemble's
members exist, a teacher trains what its student distils) is minbert.params.validate's, after
minbert.params.catalogue has expanded grids and seeds; minbert.params.load reads the files.
"""
from __future__ import annotations

import copy
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from minbert.core.errors import MinBertError
from minbert.core.tasks import DEFAULT_TASKS, PAIR_TASKS, TASK_NAMES, TASKS, TaskName
from minbert.params.messages import close, raise_validation

# the multi-task schedules (minbert.train.schedules implements each)
SCHEDULES = ("round_robin", "drop_round_robin", "simultaneous", "task_by_task", "sequential",
             "proportional", "temperature")
# pair heads: `cross` reads the cross-encoded pair; the others embed each sentence (minbert.model.heads)
BI_ENCODER_HEADS = ("concat_uv", "concat", "concat_mult", "concat_cos", "cosine", "cosine_linear")
PAIR_HEADS = ("cross",) + BI_ENCODER_HEADS

# pair heads: cross = cross-encoder "[CLS] a [SEP] b [SEP]"; the others embed each sentence
PairHead = Literal[PAIR_HEADS]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX = 100                                  # names become file names (and Slurm job names)
SEED_MAX = 2**32 - 1                            # what every RNG in the pipeline accepts
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
PAPER_OVERALL = {"leaderboard": "overall", "mean": "mean"}   # a paper's overall formula -> metrics.json key
# what a paper column reads: its overall score (in the paper's formula) or one task's metric
PaperMetric = Literal[("overall",) + tuple(t.metric_key for t in TASKS.values())]
Split = Literal["dev", "test"]
Pooling = Literal["cls", "mean", "pooler"]
LR_SCHEDULE = "after warm-up: `linear` or `cosine` decay to 0 at the last update, or `constant`"


def _holds_bool(value) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


def _admits_bool(annotation) -> bool:
    """Whether a field's type takes true/false anywhere (bool, Any, a nested model that checks its own)."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    return any(_admits_bool(a) for a in typing.get_args(annotation) if not isinstance(a, (str, int, float)))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value, info):
        # YAML reads yes/no/on/off/true/false as booleans, and pydantic would take them as 1/0: a
        # number (a seed, a size, a list of seeds) is never given as true/false
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        if field is not None and _holds_bool(value) and not _admits_bool(field.annotation):
            raise ValueError("expected a number or text, not true/false (YAML reads yes, no, on, off as "
                             "booleans); write the value itself")
        return value


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


class Downsample(Strict):
    """How a stage subsamples its training data (seeded and stable: same seed, same rows)."""
    mode: Literal["none", "smallest", "fixed"] = Field(
        "none", description="`none` (all rows), `smallest` (every task cut to the smallest trained task) or "
                            "`fixed` (at most `size` rows per task)")
    size: int | None = Field(None, gt=0, description="rows per task, for `mode: fixed`")
    caps: dict[TaskName, Annotated[int, Field(ge=0)] | None] = Field(
        {}, description="per-task upper bounds applied after `mode`, e.g. `{para: 20000}`; they merge key by key "
                        "from `base`, and `null` lifts a cap the base sets")

    @model_validator(mode="after")
    def _size_for_fixed(self):
        if self.mode == "fixed" and self.size is None:
            raise ValueError("mode 'fixed' needs 'size'")
        return self


# ---------------------------------------------------------------- model heads

class SharedParams(Strict):
    """Dense layers shared by some tasks between the encoder and their heads (000: all tasks,
    768 -> 384, leaky ReLU; 003: Para and STS, two ReLU layers)."""
    tasks: list[TaskName] = Field(list(PAIR_TASKS), description="the tasks whose heads read the shared layers, "
                                                            "each once")
    sizes: list[Annotated[int, Field(ge=1)]] = Field(
        [], description="the layers' widths; `[]`: one layer of the encoder's width")
    activation: Literal["leaky_relu", "relu", "gelu", "tanh"] = Field(
        "leaky_relu", description="each layer is Linear, this activation, dropout")

    @field_validator("tasks")
    @classmethod
    def _some_tasks(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("needs at least one task, each once")
        return v


Depth = Annotated[int, Field(ge=0, le=4)]


class HeadsParams(Strict):
    """The heads on the encoder and their losses (docs/finetuning.md, Heads and losses)."""
    pooling: Pooling = Field("cls", description="sentence vector: `cls` (final [CLS] state), `mean` (mean over "
                                                "non-padding tokens) or `pooler` (BERT's tanh pooler on [CLS])")
    task_pooling: dict[TaskName, Pooling] = Field({}, description="another pooling for some tasks, e.g. `{sts: mean}` "
                                                              "(004: STS mean-pooled)")
    para: PairHead = Field("cross", description="the paraphrase pair head, one of the kinds below")
    sts: PairHead = Field("cross", description="the similarity pair head, one of the kinds below")
    sst: Literal["classifier", "prototypes"] = Field(
        "classifier", description="`classifier` (an MLP on the sentence vector) or `prototypes` (003's SST_TO_STS: "
                                  "the cosines of the sentence to `prototypes_per_label` training sentences of "
                                  "each label, with their labels, through a linear layer; the prototypes are "
                                  "embedded once, so the encoder must be frozen while this head trains)")
    prototypes_per_label: int = Field(100, ge=1, le=1000, description="`sst: prototypes`: training sentences per "
                                                                      "label it compares with (1-1000)")
    sts_loss: Literal["mse", "pearson", "mse+pearson"] = Field(
        "mse", description="`mse`, `pearson` (1 - Pearson r over the batch) or `mse+pearson` (their sum)")
    cosine_target: Literal["0_1", "-1_1"] = Field(
        "0_1", description="how STS labels are scaled for a `cosine` head: [0, 1] or `-1_1` for [-1, 1] (every "
                           "other head, `cosine_linear` included: [0, 1])")
    cosine_affine: bool = Field(
        True, description="`cosine` and `cosine_linear` heads learn a scale `a` and shift `b` of the cosine (para "
                          "starts at `a = 10, b = -7.5`, so a cosine of 0.75 is p 0.5; sts at 1 and 0); false: the "
                          "plain cosine (`a = 1, b = 0`, fixed; a para logit is then the cosine itself)")
    shared: SharedParams | None = Field(
        None, description="dense layers shared by some tasks between the encoder and their heads: "
                          "`{tasks, sizes, activation}` (below); null: none")
    hidden_layers: Depth | dict[TaskName, Depth] = Field(
        0, description="GELU layers (each Linear, GELU, dropout) before each head's output layer, as wide as the "
                       "head's input vector (the encoder's hidden size, or the shared layers' output): one number "
                       "(0-4) for every head, or per task, e.g. `{para: 1}` (unnamed tasks 0)")
    extra_layers: dict[TaskName, Annotated[int, Field(ge=1, le=12)]] = Field(
        {}, description="transformer layers a one-sentence task (`sst`, `cfimdb`) adds over the encoder's last "
                        "hidden states, e.g. `{sst: 4}` (1-12, at most the encoder's depth): copies of the "
                        "encoder's top layers, trained with the task's head at `head_lr`, also over a frozen "
                        "encoder (003's FREEZE_SST)")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout before each head's first layer and after each "
                                                        "hidden and shared layer")
    symmetric_pairs: bool = Field(
        False, description="pair tasks read both sentence orders: each training pair is fed as `(a, b)` or "
                           "`(b, a)`, drawn per pair and batch from the seed (so a re-run and a resumed run swap "
                           "the same pairs); at evaluation and prediction the output is the mean of the outputs "
                           "for `(a, b)` and `(b, a)` (twice the pair tasks' prediction cost). Paraphrase and "
                           "similarity are symmetric relations; a cross-encoder and the `concat*` heads are not "
                           "symmetric functions of the pair, so this is both augmentation and test-time averaging")
    hybrid: list[Literal[PAIR_TASKS]] = Field(
        [], description="pair tasks (`para`, `sts`, each once; the head must be a bi-encoder kind) that also get "
                        "a cross-encoder term: the encoder reads each sentence alone and the pair as `[CLS] a "
                        "[SEP] b [SEP]` (3 rows per pair in one batch; padding costs only attention), and the "
                        "output is the bi-encoder head's plus a linear map of the cross-encoded pooled vector. One "
                        "model with both views of the pair; with all-MiniLM-L6-v2 on the CS224N data it trained at "
                        "half the bi-encoder's speed and scored below both the cross-encoder and the bi-encoder "
                        "models (docs/results.md)")

    @model_validator(mode="after")
    def _hybrid_needs_bi_head(self):
        for task in self.hybrid:
            if getattr(self, task) == "cross":
                bi_heads = ", ".join(BI_ENCODER_HEADS)
                raise ValueError(f"hybrid lists {task}, whose head is already `cross`: give {task} a "
                                 f"bi-encoder head ({bi_heads})")
        if len(set(self.hybrid)) != len(self.hybrid):
            raise ValueError("hybrid lists a task twice")
        paired = [t for t in self.extra_layers if t in PAIR_TASKS]
        if paired:
            raise ValueError(f"extra_layers lists {paired[0]}: extra transformer layers are for one-sentence tasks "
                             f"({', '.join(t for t in TASK_NAMES if t not in PAIR_TASKS)})")
        return self

    def pooling_of(self, task: str) -> str:
        return self.task_pooling.get(task, self.pooling)

    def depth(self, task: str) -> int:
        """Hidden layers of `task`'s head."""
        return self.hidden_layers.get(task, 0) if isinstance(self.hidden_layers, dict) else self.hidden_layers


class SmartParams(Strict):
    """SMART (docs/regularisers.md): a smoothness-inducing adversarial term on the word-embedding
    output and a Bregman proximal point term against a momentum copy of the model."""
    enabled: bool = Field(False, description="add both SMART terms to the training loss")
    lambda_s: float = Field(1.0, ge=0, description="weight of the smoothness-inducing adversarial term")
    mu: float = Field(1.0, ge=0, description="weight of the Bregman proximal point term")
    beta: float = Field(0.99, ge=0, lt=1, description="momentum of the slowly updated parameter copy")
    steps: int = Field(1, ge=1, description="adversarial ascent steps (normalised)")
    step_size: float = Field(1e-3, gt=0, description="size of each ascent step")
    epsilon: float = Field(1e-5, gt=0, description="projection radius (infinity norm) around the embeddings")
    noise_var: float = Field(1e-5, gt=0, description="variance of the Gaussian noise the ascent starts from")
    tasks: list[TaskName] | None = Field(None, description="the tasks SMART regularises (trained ones); null: every "
                                                       "task")


class DistillParams(Strict):
    """Training on a teacher's outputs as well as the gold labels (knowledge distillation): the
    teacher (an experiment, a repeated experiment or an ensemble) predicts the training data first;
    each distilled task's loss is (1 - weight) x the gold-label loss + weight x the loss against the
    teacher: softened class probabilities (temperature T, the KL divergence times T^2) for sst and
    para, the teacher's scores for sts."""
    teacher: str = Field(description="an experiment, a repeated experiment (all its seeds) or an ensemble (its "
                                     "members); never the student itself, nor one that learns from the student "
                                     "through its own teachers")
    weight: float = Field(0.5, ge=0, le=1, description="share of the teacher term in the loss, 0-1: 0 trains "
                                                       "exactly as without distillation (the same weights), 1 "
                                                       "ignores the gold labels")
    temperature: float = Field(2.0, gt=0, description="T: softens the teacher's and the student's distributions "
                                                      "for the classification and binary tasks (sst, para, "
                                                      "cfimdb); unused for sts")
    tasks: list[TaskName] | None = Field(None, description="the distilled tasks; null: every trained task the teacher "
                                                       "predicts. A named task the teacher's models do not all "
                                                       "predict is an error; the other trained tasks learn from "
                                                       "the gold labels alone")


class EarlyStopping(Strict):
    """Stop a fine-tuning when its dev selection score has stopped improving (as the Hugging Face
    Trainer's EarlyStoppingCallback)."""
    patience: int = Field(3, ge=1, description="dev evaluations in a row (each of `evals_per_epoch` counts) whose "
                                               "selection score (history.csv's `dev_score`) is not above the best "
                                               "so far by more than `min_delta`; then training stops (in sequential "
                                               "fine-tuning, the task's phase stops and the next begins)")
    min_delta: float = Field(0.0, ge=0, description="the smallest rise of the selection score that counts as an "
                                                    "improvement")


class FinetuneParams(Strict):
    """Multi-task fine-tuning (docs/finetuning.md): the tasks, their schedule, the optimiser, the
    heads and the regularisers."""
    tasks: list[TaskName] = Field(list(DEFAULT_TASKS), description="the tasks trained, each once (any of `sst`, "
                                                               "`para`, `sts`, `cfimdb`)")
    schedule: Literal[SCHEDULES] = Field("round_robin", description="which tasks each update trains on "
                                                                    "(Schedules below)")
    epoch_unit: str = Field("smallest", description="one epoch is one pass over the `smallest` or `largest` task, "
                                                    "or over the named task (a trained one)")
    temperature: float = Field(2.0, gt=0, description="`schedule: temperature` only: tasks drawn with probability "
                                                      "proportional to `n_t ** (1 / temperature)` (not the "
                                                      "distillation temperature)")
    task_weights: dict[TaskName, Annotated[float, Field(ge=0)]] = Field(
        {}, description="a factor on each task's loss (unnamed tasks 1), e.g. `{sst: 2.0}`; only trained tasks")
    epochs: int = Field(3, ge=1, description="training epochs")
    batch_size: int = Field(32, ge=1, description="the global batch, also under `torchrun`")
    lr: float = Field(2e-5, gt=0, description="AdamW learning rate of the encoder")
    head_lr: float | None = Field(None, gt=0, description="AdamW learning rate of everything else (heads, shared "
                                                          "layers, extra layers); null: `lr`")
    weight_decay: float = Field(0.01, ge=0, description="AdamW; no decay on biases, LayerNorm weights and other "
                                                        "parameters of fewer than 2 dimensions")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the run's updates (all epochs, all stages "
                                                             "of `sequential`) with linear warm-up")
    lr_schedule: Literal["linear", "cosine", "constant"] = Field("linear", description=LR_SCHEDULE)
    grad_clip: float | None = Field(1.0, gt=0, description="global gradient-norm clip; `null`: none")
    hidden_dropout: float | None = Field(
        None, ge=0, lt=1, description="dropout of the embeddings and of every layer's attention and feed-forward "
                                      "outputs (`hidden_dropout_prob`, the papers' \"BERT dropout probability\"); "
                                      "it leaves attention dropout alone; null: the checkpoint's")
    attention_dropout: float | None = Field(
        None, ge=0, lt=1, description="dropout on the attention probabilities (`attention_probs_dropout_prob`); "
                                      "null: the checkpoint's")
    freeze_encoder: bool = Field(False, description="train only the heads (the frozen baseline); not together "
                                                    "with `retrain_heads.enabled`")
    frozen_encoder_dropout: bool = Field(
        False, description="with `freeze_encoder`: keep the frozen encoder's dropout active, as the course's code "
                           "does (its BERT stays in train mode); off, the frozen encoder runs deterministically, "
                           "and its sentence embeddings are computed once per split and the heads train on them "
                           "(`minbert.train.frozen`; not with SMART, nor for a task with `extra_layers`)")
    gradient_checkpointing: bool = Field(False, description="recompute each layer in the backward pass: less "
                                                            "memory, more compute")
    heads: HeadsParams = Field(HeadsParams(), description="the heads and losses (Heads and losses below)")
    smart: SmartParams = Field(SmartParams(), description="the SMART regulariser (Regularisers below)")
    pcgrad: bool = Field(False, description="PCGrad: project conflicting task gradients (with `schedule: "
                                            "simultaneous`, at least two tasks; Regularisers below)")
    downsample: Downsample = Field(Downsample(mode="smallest"), description="how the training splits are cut "
                                                                            "(Downsampling below)")
    walk_through: list[TaskName] = Field(
        [], description="trained tasks whose batches continue across epochs. Without it every epoch reshuffles "
                        "each task and starts it afresh, so a task larger than the epoch unit sees a new random "
                        "part of its data each epoch; a task walked through continues where the last epoch "
                        "stopped, in passes over all its data, so one pass spans several epochs (002: "
                        "`epoch_unit: sst`, `walk_through: [para]`, all of Quora read pass after pass)")
    distill: DistillParams | None = Field(None, description="learn from a teacher's outputs as well "
                                                            "(Distillation below); null: no teacher")
    evals_per_epoch: int = Field(1, ge=1, le=100, description="dev evaluations per epoch, evenly spaced over its "
                                                              "updates, the last at its end: each is a row of "
                                                              "history.csv (`epoch` then counts fractions of an "
                                                              "epoch) and a candidate for the model kept. More show "
                                                              "where a short run's dev curve flattens (the report's "
                                                              "training check), at the cost of one dev pass each")
    early_stopping: EarlyStopping | None = Field(
        None, description="`{patience, min_delta}`: stop when the dev selection score has not improved for `patience` "
                          "evaluations (the model kept is still the best evaluated; the lr schedule stays the one "
                          "planned for every epoch); null: train every epoch")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=64, description="split each task's batch of an update into this many micro-batches whose "
                                    "gradients add up before the one optimiser step: the same update (same "
                                    "`batch_size`, same examples, the same numbers up to float rounding) in about "
                                    "1/N of the activation memory, at the cost of N smaller passes. Not with PCGrad, "
                                    "SMART or a correlation STS loss, which need the whole batch at once")
    tracking: list[Literal["dvclive", "tensorboard"]] = Field(
        [], description="experiment trackers the run also logs to, offline: `dvclive` (DVC's: `dvc exp show` and "
                        "`dvc plots` read it) and `tensorboard`; each gets every history row and, between "
                        "evaluations, each update's lr and training losses, in the run's state folder while it runs "
                        "and beside model.pt when it has finished (docs/finetuning.md, Tracking)")
    max_steps_per_epoch: int | None = Field(None, ge=1, description="cut every epoch to at most this many updates "
                                                                    "(demo, tests, quick runs); the lr schedule is "
                                                                    "built on the cut epochs")
    checkpoint_every: int = Field(1, ge=1, description="epochs between resumable states (`last.pt`: model, "
                                                       "optimiser, SMART's teacher, RNGs; 1.3-1.8 GB on "
                                                       "bert-base): an interrupted run resumes, exactly, from the "
                                                       "last one saved")
    compile: bool = Field(False, description="`torch.compile` the encoder, in place (checkpoints unchanged): fused "
                                             "kernels and fewer launches, for a GPU (`bench/gpu_train.py "
                                             "--compile` measures it); on a CPU the compilation takes minutes")

    @field_validator("tasks")
    @classmethod
    def _nonempty_unique(cls, v):
        if not v:
            raise ValueError("needs at least one task")
        if len(set(v)) != len(v):
            raise ValueError("lists a task twice")
        return v

    @field_validator("tracking")
    @classmethod
    def _each_tracker_once(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("lists a tracker twice")
        return v

    @model_validator(mode="after")
    def _accumulation_splits_the_batch(self):
        k = self.gradient_accumulation_steps
        if k > 1:
            whole = [what for on, what in ((self.pcgrad, "PCGrad (`pcgrad`) projects whole per-task gradients"),
                                           (self.smart.enabled, "SMART perturbs the whole batch"),
                                           ("pearson" in self.heads.sts_loss and "sts" in self.tasks,
                                            f"the STS loss `{self.heads.sts_loss}` correlates over the whole batch"))
                     if on]
            if whole:
                raise ValueError(f"gradient_accumulation_steps {k}: {whole[0]}; set gradient_accumulation_steps: 1")
            if k > self.batch_size:
                raise ValueError(f"gradient_accumulation_steps {k} is more than batch_size {self.batch_size}; each "
                                 f"micro-batch needs an example")
        return self


class RetrainHeadsParams(Strict):
    """A second stage with the fine-tuned encoder frozen: the heads of `tasks` are (re)initialised
    and trained; the other heads are kept as they are (003 trains SST this way over a model
    fine-tuned on Para and STS)."""
    enabled: bool = Field(False, description="run the stage (not together with `finetune.freeze_encoder`)")
    tasks: list[TaskName] | None = Field(None, description="the heads to train; null: every fine-tuned task's. A task "
                                                       "not fine-tuned is added (003 trains SST this way over a "
                                                       "model fine-tuned on Para and STS)")
    schedule: Literal[SCHEDULES] = Field("round_robin", description="as `finetune.schedule`, with the largest task "
                                                                    "as the epoch unit")
    epochs: int = Field(2, ge=1, description="training epochs of the heads")
    batch_size: int = Field(32, ge=1, description="the global batch")
    lr: float = Field(1e-3, gt=0, description="for the heads (the encoder is frozen)")
    downsample: Downsample = Field(Downsample(mode="none"), description="full data by default, as in the papers")


# ---------------------------------------------------------------- pretraining

class MlmParams(Strict):
    """Masked-LM pretraining on the tasks' texts."""
    tasks: list[Literal[TASK_NAMES + ("nli",)]] = Field(
        list(DEFAULT_TASKS), description="whose texts to pretrain on: any of sst, para, sts, cfimdb, nli")
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
    epochs: int = Field(1, ge=1, description="training epochs")
    batch_size: int = Field(32, ge=1, description="examples per update")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.01, ge=0, description="AdamW; no decay on biases and LayerNorm weights")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of all the run's updates with linear warm-up")
    lr_schedule: Literal["linear", "cosine", "constant"] = Field("linear", description=LR_SCHEDULE)
    grad_clip: float | None = Field(1.0, gt=0, description="global gradient-norm clip, as in BERT's pretraining; "
                                                           "`null`: none")
    max_steps_per_epoch: int | None = Field(None, ge=1, description="cut each epoch short (quick runs); the lr "
                                                                    "schedule is built on the cut epochs")
    dev_size: int | None = Field(None, ge=1, description="mlm and nli: evaluate on a seeded subset of at most this "
                                                         "many dev examples (quick runs)")
    precision: Literal["auto", "bf16", "fp16", "fp32"] | None = Field(
        None, description="`auto`, `bf16`, `fp16` or `fp32` for this pretraining only (e.g. `fp32` to keep a pretraining "
                          "in float32 while fine-tuning runs in bf16); null: the base's `precision`")
    finetune: dict[str, Any] = Field(
        {}, description="para_first only: what it changes in `base.finetune`, whose heads, dropout and other "
                        "settings paraphrase-first trains with, e.g. `{hidden_dropout: 0.3, heads: {para: "
                        "cross}}`; validated as a `finetune` section, and refused for the other kinds")
    mlm: MlmParams = Field(MlmParams(), description="kind mlm: its settings")
    nli: NliParams = Field(NliParams(), description="kind nli: its settings")


# ---------------------------------------------------------------- experiments

class ExperimentParams(Strict):
    """One experiment = base deep-merged with its overrides."""
    model: str = Field("all-MiniLM-L6-v2", description="the checkpoint fine-tuned: a Hugging Face name or a folder")
    seed: Seed = Field(11711, description="seeds every random choice of the experiment (data order, heads, "
                                          "downsampling, dropout)")
    repeats: Annotated[int, Field(ge=1, le=100)] | list[Seed] = Field(
        1, description="run the experiment with several seeds, each a job of its own named <name>.seed<seed>: N "
                       "seeds (seed, seed + 1, ...) or the list of seeds; studies show the mean and spread over "
                       "them")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto` (CUDA when there is a GPU), `cpu` or `cuda`")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="auto: bf16 autocast where bf16 is native (CUDA GPUs from Ampere on, CPUs with "
                            "avx512_bf16 / amx_bf16), fp16 autocast with loss scaling on a CUDA GPU without "
                            "bf16 (T4, V100), float32 elsewhere; bf16 / fp16 / fp32: that precision on every "
                            "device (fp16 trains with a gradient scaler; fp32 on CUDA multiplies matrices in "
                            "TF32)")
    deterministic: bool = Field(
        False, description="pin the algorithms (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace, the "
                           "math attention backend): a CUDA run repeats bit for bit, at some cost in speed")
    threads: int | None = Field(None, ge=1, le=1024, description="CPU threads of torch; null: its default")
    cuda_graphs: bool = Field(
        True, description="on a CUDA GPU, each training step shape is recorded once as a CUDA graph and replayed "
                          "(batches padded to a few fixed lengths; docs/finetuning.md, 'On a GPU'): the step costs "
                          "a few launches instead of a thousand; false: every kernel launched one by one")
    max_length: int = Field(128, ge=8, le=512, description="word pieces per input (a pair's two sentences "
                                                           "together); longer inputs are cut")
    pretrain: str | None = Field(None, description="start from this pretraining's output (a name in "
                                                   "`pretrainings`); null: from `model`")
    finetune: FinetuneParams = Field(FinetuneParams(), description="multi-task fine-tuning (docs/finetuning.md)")
    retrain_heads: RetrainHeadsParams = Field(
        RetrainHeadsParams(), description="a second stage that trains heads over the frozen fine-tuned encoder")
    predict_batch_size: int = Field(128, ge=1, description="batch size of the dev and test predictions")
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


class EnsembleParams(Strict):
    """An ensemble over experiments' predictions."""
    members: list[str] = Field(description="experiments (two or more), or a repeated experiment, which stands for "
                                           "its seeds")
    classification: Literal["mode", "mean_prob"] = Field(
        "mode", description="how classification tasks combine: the members' majority label (`mode`) or the "
                            "label of their mean probabilities (`mean_prob`)")
    similarity: Literal["median", "mean"] = Field("median", description="how similarity scores combine")
    description: str = Field("", description="a sentence on the ensemble, for the report")

    @field_validator("members")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("an ensemble needs members (two or more experiments, or one repeated experiment)")
        return v


class GridAxis(Strict):
    """One axis of a study's grid: a setting and its values."""
    key: str = Field(description="an experiment setting, dotted: `finetune.hidden_dropout`")
    values: list[Any] = Field(description="the setting's values, each once")
    label: str = Field("", description="short name in the experiment names and the report; empty: the key's last "
                                       "part")

    @field_validator("values")
    @classmethod
    def _some_values(cls, v):
        if not v or len(v) != len({repr(x) for x in v}):
            raise ValueError("needs values, each once")
        return v

    @property
    def name(self) -> str:
        return self.label or self.key.rsplit(".", 1)[-1]


class GridParams(Strict):
    """A study's grid: every combination of the axes' values applied to one experiment, each an
    experiment of its own named <study>.<label><value>[.<label><value>] (e.g. dropout x lambda)."""
    experiment: str = Field(description="the experiment each cell changes")
    axes: list[GridAxis] = Field(min_length=1, max_length=2, description="one or two axes; the first varies "
                                                                         "slowest")


# ---------------------------------------------------------------- the papers' tables

class PaperDifference(Strict):
    """One setting in which this catalogue's runs of a paper differ from the paper (shown beside
    each of its tables as "differs from the paper")."""
    setting: str = Field(description="the setting, in words: \"learning rate\", \"model\"")
    paper: str = Field(description="the paper's value, as it states it (\"not stated\" where it does not)")
    ours: str = Field(description="this catalogue's value")


class PaperParams(Strict):
    """A report the catalogue reproduces: its title, its own overall formula, the scale it ran at
    (for the line under each of its tables that says how this run's scale differs) and every other
    setting in which this catalogue's runs differ from it."""
    title: str = Field(description="the paper's title")
    overall: Literal["leaderboard", "mean"] = Field(
        description="its overall score: `leaderboard`: (SST acc + Para acc + (STS r + 1) / 2) / 3; `mean`: the "
                    "plain mean of the three")
    model: str = Field("bert-base-uncased", description="the model it fine-tuned")
    epochs: int | None = Field(None, ge=1, description="the epochs of most of its rows")
    data: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="the training rows per task the paper trained its rows on, as it prints them (after its own "
                        "downsampling)")
    totals: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="where the paper prints no training rows for a task: the data set's size it prints (the scale "
                        "line says its training rows are not stated)")
    differs: list[PaperDifference] = Field(
        [], description="every setting (other than model, epochs and rows, which the scale line compares) in which "
                        "this catalogue's runs of the paper differ from it")


class PaperColumn(Strict):
    """One printed column of a paper's table."""
    name: str = Field(description="as printed: \"Overall Dev\", \"QQP\", \"DEV_TOTAL\"")
    metric: PaperMetric = Field(description="what it reads: `overall` (the paper's formula, "
                                            "`papers.<id>.overall`) or one task's metric")


class PaperRow(Strict):
    """One printed row: its label, what reproduces it (`run`: an experiment, a repeated experiment
    or an ensemble; or `best_of`: the best by dev of experiments or of studies' rows, as a paper's
    best-of-a-sweep row), and every value it prints, per split, by column name."""
    label: str = Field(description="the row's label as printed")
    run: str | None = Field(None, description="the experiment, repeated experiment or ensemble that reproduces it "
                                              "(it joins the study's rows)")
    best_of: list[str] = Field([], description="instead of `run`: experiments, ensembles or studies (their rows) "
                                               "whose best by dev stands for the row")
    from_table: str = Field("", description="a row of another table of the paper that this table's claims compare "
                                            "with (\"Table 1\"): it does not count among this table's rows")
    stand_in: str = Field("", description="when the run is not the paper's method for this row: how it differs (the "
                                          "page then names the run and shows the paper's label as what it compares "
                                          "to)")
    dev: dict[str, float] = Field({}, description="the printed dev values by column name")
    test: dict[str, float] = Field({}, description="the printed test values by column name")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.run is None) == (not self.best_of):
            raise ValueError(f"row '{self.label}': give either 'run' (an experiment or ensemble) or 'best_of' "
                             f"(experiments or studies whose best by dev stands for the row)")
        return self


class PaperClaim(Strict):
    """A finding the paper states about two of its rows, on one column. A difference: `better`
    scores higher than `worse` (the paper's difference is that of its printed values). No effect:
    `same` names the two rows the paper finds do not differ, and `margin` the largest difference
    that still counts as none (`margin_reason` says why); reproduced when our difference's interval
    lies within ±margin."""
    text: str = Field(description="the claim in a few words")
    better: str | None = Field(None, description="the label of the row the paper finds better")
    worse: str | None = Field(None, description="the label of the row it finds worse")
    same: list[str] = Field([], description="instead of better / worse, a no-effect claim: the two rows the paper "
                                            "finds do not differ (the difference is the first − the second)")
    margin: float | None = Field(None, gt=0, description="a no-effect claim: the largest difference (either sign) "
                                                         "that counts as no effect")
    margin_reason: str = Field("", description="a no-effect claim: why that margin (shown on the page)")
    column: str = Field(description="the column compared")
    split: Split = Field("dev", description="the split compared")
    quote: str = Field("", description="the paper's words that state the finding (checked against its text); "
                                       "required where the paper prints no value for one of the rows")
    proxy: str = Field("", description="when the paper does not state this comparison itself: what it states "
                                       "and why this comparison stands for it (shown on the page)")

    @model_validator(mode="after")
    def _one_kind(self):
        if self.same:
            if self.better is not None or self.worse is not None:
                raise ValueError(f"claim '{self.text}': give either 'better' and 'worse' (a difference) or 'same' "
                                 f"(no effect), not both")
            if len(self.same) != 2 or self.same[0] == self.same[1]:
                raise ValueError(f"claim '{self.text}': 'same' names two different rows")
            if self.margin is None or not self.margin_reason.strip():
                raise ValueError(f"claim '{self.text}': a no-effect claim needs 'margin' and 'margin_reason' "
                                 f"(the largest difference that counts as none, and why)")
        else:
            if self.better is None or self.worse is None:
                raise ValueError(f"claim '{self.text}': give 'better' and 'worse' (a difference) or 'same' "
                                 f"(no effect)")
            if self.margin is not None or self.margin_reason:
                raise ValueError(f"claim '{self.text}': 'margin' belongs to a no-effect claim ('same')")
        return self

    @property
    def kind(self) -> Literal["difference", "no_effect"]:
        return "no_effect" if self.same else "difference"

    @property
    def rows(self) -> tuple[str, str]:
        """The two rows compared: the difference is the first − the second."""
        return (self.same[0], self.same[1]) if self.same else (self.better, self.worse)


class StudyPaper(Strict):
    """The paper table a study reproduces, as data: which paper and table, its columns in order,
    its rows with every printed value, the summary rows it prints, and its claims."""
    id: str = Field(description="a key of `papers`")
    table: str = Field(description="the table's name in the paper: \"Table 2\", \"Figure 5\"")
    columns: list[PaperColumn] = Field(min_length=1, description="its columns in the paper's order")
    rows: list[PaperRow] = Field(min_length=1, description="its rows in the paper's order")
    printed_rows: int | None = Field(None, ge=1, description="how many rows the paper's table prints, when this study "
                                                             "carries fewer (the page says \"k of n rows\")")
    summary: dict[Literal["mean", "std"], dict[str, float]] = Field(
        {}, description="its printed Average / Std rows by column name")
    data: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="the training rows per task of this table's rows, where they differ from the paper's `data` "
                        "(as the paper prints them)")
    claims: list[PaperClaim] = Field([], description="the comparisons the paper makes between its rows")

    @model_validator(mode="after")
    def _consistent(self):
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("columns: a column name is given twice")
        labels = [r.label for r in self.rows]
        own = sum(1 for r in self.rows if not r.from_table)
        if self.printed_rows is not None and self.printed_rows < own:
            raise ValueError(f"printed_rows: {self.printed_rows} is fewer than the {own} rows of this table given")
        if len(set(labels)) != len(labels):
            dup = next(x for x in labels if labels.count(x) > 1)
            raise ValueError(f"rows: label '{dup}' is given twice")
        for r in self.rows:
            for split in ("dev", "test"):
                for col in getattr(r, split):
                    if col not in names:
                        raise ValueError(f"row '{r.label}' {split}: unknown column '{col}'{close(col, names)}")
        for kind, values in self.summary.items():
            for col in values:
                if col not in names:
                    raise ValueError(f"summary {kind}: unknown column '{col}'{close(col, names)}")
        for c in self.claims:
            for side in c.rows:
                if side not in labels:
                    raise ValueError(f"claim '{c.text}': unknown row '{side}'{close(side, labels)}")
            if c.column not in names:
                raise ValueError(f"claim '{c.text}': unknown column '{c.column}'{close(c.column, names)}")
            rows = {r.label: getattr(r, c.split) for r in self.rows}
            first, second = c.rows
            missing = [side for side in c.rows if c.column not in rows[side]]
            if missing:
                if not c.quote.strip():
                    raise ValueError(f"claim '{c.text}': the paper prints no {c.split} {c.column} for '{missing[0]}' "
                                     f"(give the 'quote' that states the finding)")
            elif c.kind == "difference" and rows[first][c.column] <= rows[second][c.column]:
                raise ValueError(f"claim '{c.text}': the paper's {first} ({rows[first][c.column]}) is not "
                                 f"above {second} ({rows[second][c.column]}) on {c.column}")
        return self

    def column(self, name: str) -> PaperColumn:
        return next(c for c in self.columns if c.name == name)

    def row(self, label: str) -> PaperRow:
        return next(r for r in self.rows if r.label == label)

    def paper_difference(self, claim: PaperClaim) -> float | None:
        """The paper's printed difference (the claim's first row − its second); None where it prints
        no value for one of them (the claim then rests on its quote)."""
        first, second = (getattr(self.row(label), claim.split).get(claim.column) for label in claim.rows)
        return None if first is None or second is None else first - second


class StudyParams(Strict):
    """One table of the report: experiments as rows, against a baseline row."""
    name: str = Field(description="the study's name (unique; its page and its grid cells are named by it)")
    title: str = Field(description="the table's title")
    experiments: list[str] = Field([], description="its rows: experiments, repeated experiments or ensembles "
                                                   "(a grid's cells and a paper table's runs are added)")
    grid: GridParams | None = Field(None, description="more rows: the grid's cells")
    summary: list[Literal["mean", "std"]] = Field([], description="rows under the table: the mean / spread of each "
                                                                  "column")
    repeats: Annotated[int, Field(ge=1, le=100)] | None = Field(None, description="seeds for every row that sets "
                                                                                  "none")
    baseline: str | None = Field(None, description="the row the others are compared with; null: the first row")
    splits: list[Literal["dev", "test"]] = Field(["dev", "test"], description="the splits the table shows")
    source: str = Field("", description="which paper table it reproduces, in words")
    paper: StudyPaper | None = Field(None, description="that table as data: rows, columns, printed values, claims")


class ReportParams(Strict):
    """The report's settings (docs/report.md)."""
    title: str = Field("Multi-task minBERT", description="the report's title")
    worst_k: int = Field(10, ge=1, description="how many of the worst-predicted dev examples each experiment's "
                                               "page lists per task")


class ExportParams(Strict):
    """Models written in the Hugging Face format with a model card."""
    experiments: list[str] = Field(
        [], description="experiments written to results/exports/<E> in the Hugging Face format with a model card "
                        "(a repeated experiment: each seed); an export runs only for the experiments listed here")
    license: str = Field("apache-2.0", description="the model card's license (the Hub's identifiers)")
    language: str = Field("en", description="the model card's language")


# The sections a catalogue file provides; params.yaml keeps `catalogue` and `report`.
CATALOGUE_SECTIONS = ("data", "base", "pretrainings", "experiments", "ensembles", "papers", "studies", "export")


class Params(Strict):
    """params.yaml (or params.yaml's `catalogue` and `report` with a catalogue file's sections)."""
    catalogue: str = Field("demo", description="`demo`: the sections of params.yaml; NAME: the sections of "
                                               "params/NAME.yaml instead")
    data: DataParams = Field(DataParams(), description="how `prepare` reads and checks the raw files")
    base: dict[str, Any] = Field({}, description="the settings every experiment starts from (an experiment's keys)")
    pretrainings: dict[str, PretrainParams] = Field({}, description="named pretrainings; experiments refer to them "
                                                                    "by name and share one output")
    experiments: dict[str, dict[str, Any]] = Field(description="named experiments, each what it changes in `base` "
                                                               "(deep-merged)")
    ensembles: dict[str, EnsembleParams] = Field({}, description="named ensembles over member experiments")
    papers: dict[str, PaperParams] = Field({}, description="the reports whose tables studies reproduce "
                                                           "(`studies[].paper`)")
    studies: list[StudyParams] = Field([], description="the report's tables")
    report: ReportParams = Field(ReportParams(), description="report settings")
    export: ExportParams = Field(ExportParams(), description="the experiments exported in the Hugging Face format")


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


def resolve_experiment(raw_base: dict, overrides: dict, name: str, where: str = "params.yaml") -> ExperimentParams:
    """Experiment `name`: `base` deep-merged with its overrides, validated (a one-line error naming
    `experiments.<name>.<key>`)."""
    merged = deep_merge(raw_base or {}, overrides or {})
    try:
        return ExperimentParams.model_validate(merged)
    except ValidationError as err:
        raise_validation(err, ExperimentParams, where, prefix=f"experiments.{name}.")


def check_name(name, where: str, what: str) -> None:
    """A name that becomes a file name (an experiment's, a grid cell's, a seed's, an ensemble's):
    a one-line error when it has other characters or is too long."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MinBertError(f"{where}: {what} name {name!r} must be letters, digits, '_', '-', '.' "
                           f"(starting with a letter or digit)")
    if len(name) > NAME_MAX:
        raise MinBertError(f"{where}: {what} name '{name[:40]}...' has {len(name)} characters; names become file "
                           f"names, keep them to {NAME_MAX}")
