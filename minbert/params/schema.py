"""The schema of params.yaml: validated before anything runs.

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

Errors are one line naming the key (and the nearest valid key for a typo).
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from minbert.core.errors import MinBertError
from minbert.core.tasks import DEFAULT_TASKS, PAIR_TASKS, TASK_NAMES, TASKS, TaskName

# the multi-task schedules (minbert.train.schedules implements each)
SCHEDULES = ("round_robin", "drop_round_robin", "simultaneous", "task_by_task", "sequential",
             "proportional", "temperature")
# pair heads: `cross` reads the cross-encoded pair; the others embed each sentence (minbert.train.heads)
BI_ENCODER_HEADS = ("concat_uv", "concat", "concat_mult", "concat_cos", "cosine", "cosine_linear")
PAIR_HEADS = ("cross",) + BI_ENCODER_HEADS

Task = TaskName
# pair heads: cross = cross-encoder "[CLS] a [SEP] b [SEP]"; the others embed each sentence
PairHead = Literal[PAIR_HEADS]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX = 100                                  # names become file names (and Slurm job names)
SEED_MAX = 2**32 - 1                            # what every RNG in the pipeline accepts
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# ---------------------------------------------------------------- data (prepare)

class DataParams(Strict):
    dir: str = "data/demo"                     # folder in the CS224N layout (demo data ships in the repo)
    nli_file: str | None = "data/demo/nli-sample.jsonl"  # SNLI/MNLI jsonl; None: no NLI data
    include_cfimdb: bool = False               # also prepare ids-cfimdb-* (binary sentiment)
    on_bad_rows: Literal["error", "drop"] = "error"
    nli_dev_fraction: float = Field(0.1, gt=0, lt=1)
    seed: Seed = 11711                         # seeds the NLI train/dev split by premise group


class Downsample(Strict):
    """How a stage subsamples its training data (seeded and stable: same seed, same rows)."""
    mode: Literal["none", "smallest", "fixed"] = "none"
    size: int | None = Field(None, gt=0)       # rows per task, for mode=fixed
    # per-task upper bounds applied after `mode`; null lifts a cap (caps merge key by key from base)
    caps: dict[Task, Annotated[int, Field(ge=0)] | None] = {}

    @model_validator(mode="after")
    def _size_for_fixed(self):
        if self.mode == "fixed" and self.size is None:
            raise ValueError("mode 'fixed' needs 'size'")
        return self


# ---------------------------------------------------------------- model heads

class SharedParams(Strict):
    """Dense layers shared by some tasks between the encoder and their heads (000: all tasks,
    768 -> 384, leaky ReLU; 003: Para and STS, two ReLU layers)."""
    tasks: list[Task] = list(PAIR_TASKS)
    sizes: list[Annotated[int, Field(ge=1)]] = []   # layer widths; [] = one layer of the encoder's width
    activation: Literal["leaky_relu", "relu", "gelu", "tanh"] = "leaky_relu"

    @field_validator("tasks")
    @classmethod
    def _some_tasks(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("needs at least one task, each once")
        return v


Pooling = Literal["cls", "mean", "pooler"]


class HeadsParams(Strict):
    pooling: Pooling = "cls"
    task_pooling: dict[Task, Pooling] = {}      # another pooling for some tasks (004: STS mean-pooled)
    para: PairHead = "cross"
    sts: PairHead = "cross"
    # sst: a classifier on the sentence vector, or 003's SST_TO_STS: the cosines of the sentence to
    # `prototypes_per_label` training sentences of each label (and their labels) -> a linear layer;
    # the prototypes are embedded once, so the encoder must be frozen while this head trains
    sst: Literal["classifier", "prototypes"] = "classifier"
    prototypes_per_label: int = Field(100, ge=1, le=1000)
    sts_loss: Literal["mse", "pearson", "mse+pearson"] = "mse"
    cosine_target: Literal["0_1", "-1_1"] = "0_1"   # how STS 0-5 is scaled for the `cosine` head (not cosine_linear)
    cosine_affine: bool = True                  # cosine heads learn a scale and shift (false: the plain cosine)
    shared: SharedParams | None = None          # dense layers shared by some tasks
    hidden_layers: Annotated[int, Field(ge=0, le=4)] | dict[Task, Annotated[int, Field(ge=0, le=4)]] = 0
    # transformer layers a one-sentence task's branch adds on top of the encoder (003's FREEZE_SST:
    # 4), initialised as copies of the encoder's top layers; trained with the task's head
    extra_layers: dict[Task, Annotated[int, Field(ge=1, le=12)]] = {}
    dropout: float = Field(0.1, ge=0, lt=1)
    # pair tasks see both sentence orders: each training pair is read as (a, b) or (b, a) at
    # random (seeded), and a prediction is the mean of the outputs for (a, b) and (b, a)
    symmetric_pairs: bool = False
    # pair tasks whose bi-encoder head gets a cross-encoder term as well: the encoder also reads
    # "[CLS] a [SEP] b [SEP]", and the output is the bi-encoder head's plus a linear map of that
    # pooled vector (one model, both views of the pair)
    hybrid: list[Literal[PAIR_TASKS]] = []

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
    enabled: bool = False
    lambda_s: float = Field(1.0, ge=0)          # weight of the smoothness-inducing adversarial term
    mu: float = Field(1.0, ge=0)                # weight of the Bregman proximal point term
    beta: float = Field(0.99, ge=0, lt=1)       # momentum of the slowly updated parameter copy
    steps: int = Field(1, ge=1)                 # adversarial ascent steps
    step_size: float = Field(1e-3, gt=0)
    epsilon: float = Field(1e-5, gt=0)          # projection radius (inf-norm)
    noise_var: float = Field(1e-5, gt=0)
    tasks: list[Task] | None = None             # the tasks SMART regularises; None: every task


class DistillParams(Strict):
    """Training on a teacher's outputs as well as the gold labels (knowledge distillation): the
    teacher (an experiment, a repeated experiment or an ensemble) predicts the training data first;
    each distilled task's loss is (1 - weight) x the gold-label loss + weight x the loss against the
    teacher: softened class probabilities (temperature T, the KL divergence times T^2) for sst and
    para, the teacher's scores for sts."""
    teacher: str
    weight: float = Field(0.5, ge=0, le=1)
    temperature: float = Field(2.0, gt=0)
    tasks: list[Task] | None = None             # None: every task both train / predict


class FinetuneParams(Strict):
    tasks: list[Task] = list(DEFAULT_TASKS)
    schedule: Literal[SCHEDULES] = "round_robin"
    epoch_unit: str = "smallest"                # smallest | largest | <task>: one epoch = one pass over it
    temperature: float = Field(2.0, gt=0)       # for schedule=temperature
    task_weights: dict[Task, Annotated[float, Field(ge=0)]] = {}
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0)
    head_lr: float | None = Field(None, gt=0)   # None: same as lr
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    lr_schedule: Literal["linear", "cosine", "constant"] = "linear"
    grad_clip: float | None = Field(1.0, gt=0)
    hidden_dropout: float | None = Field(None, ge=0, lt=1)     # overrides the checkpoint's hidden dropout
    attention_dropout: float | None = Field(None, ge=0, lt=1)  # overrides its attention dropout
    freeze_encoder: bool = False                # the frozen-encoder baseline
    # a frozen encoder keeps its dropout active, as the course's code does (its BERT stays in
    # train mode); off, the frozen encoder runs deterministically
    frozen_encoder_dropout: bool = False
    gradient_checkpointing: bool = False
    heads: HeadsParams = HeadsParams()
    smart: SmartParams = SmartParams()
    pcgrad: bool = False
    downsample: Downsample = Downsample(mode="smallest")
    # tasks whose batches continue across epochs instead of restarting each epoch: with a smaller
    # task as the epoch unit, one pass over such a task spans several epochs (002: all of Quora)
    walk_through: list[Task] = []
    distill: DistillParams | None = None        # learn from a teacher's outputs too
    max_steps_per_epoch: int | None = Field(None, ge=1)
    # epochs between resumable states (last.pt: model, optimiser, SMART's teacher, RNGs; 1.3-1.8 GB
    # on bert-base): an interrupted run resumes, exactly, from the last one saved
    checkpoint_every: int = Field(1, ge=1)
    # torch.compile the encoder (fused kernels, fewer launches: for a GPU; measure with
    # bench/gpu_train.py --compile); the weights and checkpoints are the same modules
    compile: bool = False

    @field_validator("tasks")
    @classmethod
    def _nonempty_unique(cls, v):
        if not v:
            raise ValueError("needs at least one task")
        if len(set(v)) != len(v):
            raise ValueError("lists a task twice")
        return v


class RetrainHeadsParams(Strict):
    """A second stage with the fine-tuned encoder frozen: the heads of `tasks` are (re)initialised
    and trained; the other heads are kept as they are (003 trains SST this way over a model
    fine-tuned on Para and STS)."""
    enabled: bool = False
    tasks: list[Task] | None = None             # the heads to train; None: every fine-tuned task's
    schedule: Literal[SCHEDULES] = "round_robin"
    epochs: int = Field(2, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    downsample: Downsample = Downsample(mode="none")   # the papers retrain heads on full data


# ---------------------------------------------------------------- pretraining

class MlmParams(Strict):
    tasks: list[Literal[TASK_NAMES + ("nli",)]] = list(DEFAULT_TASKS)
    mask_prob: float = Field(0.15, gt=0, lt=1)
    downsample: Downsample = Downsample(mode="smallest")


class NliParams(Strict):
    objective: Literal["regression", "contrastive", "triplet"] = "contrastive"
    temperature: float = Field(0.05, gt=0)      # contrastive: cosine / temperature
    margin: float = Field(1.0, gt=0)            # triplet: Euclidean margin
    pooling: Literal["mean", "cls"] = "mean"    # sentence embedding: mean over tokens (SBERT) or [CLS]


class PretrainParams(Strict):
    kind: Literal["mlm", "nli", "para_first"]
    model: str | None = None                    # None: the base model
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    lr_schedule: Literal["linear", "cosine", "constant"] = "linear"
    grad_clip: float | None = Field(1.0, gt=0)  # global gradient-norm clip (MLM, NLI), as in BERT's pretraining
    max_steps_per_epoch: int | None = Field(None, ge=1)
    dev_size: int | None = Field(None, ge=1)    # cap on dev examples (a seeded subset), for quick runs
    precision: Literal["auto", "bf16", "fp32"] | None = None   # None: the base's `precision`
    # para_first: what it changes in base.finetune, whose heads, dropout and optimiser it trains
    # with (e.g. {hidden_dropout: 0.3, heads: {para: cross}})
    finetune: dict[str, Any] = {}
    mlm: MlmParams = MlmParams()
    nli: NliParams = NliParams()


# ---------------------------------------------------------------- experiments

class ExperimentParams(Strict):
    """One experiment = base deep-merged with its overrides."""
    model: str = "all-MiniLM-L6-v2"
    seed: Seed = 11711
    # run the experiment with several seeds, each a job of its own named <name>.seed<seed>: N seeds
    # (seed, seed + 1, ...) or the list of seeds; studies show the mean and spread over them
    repeats: Annotated[int, Field(ge=1, le=100)] | list[Seed] = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 autocast where bf16 is native (CUDA GPUs from Ampere on, CPUs with avx512_bf16 /
    # amx_bf16), float32 elsewhere; bf16 / fp32: that precision on every device (fp32 on CUDA
    # multiplies matrices in TF32)
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # pin the algorithms (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace, the math
    # attention backend): a CUDA run repeats bit for bit, at some cost in speed
    deterministic: bool = False
    threads: int | None = Field(None, ge=1, le=1024)
    max_length: int = Field(128, ge=8, le=512)
    pretrain: str | None = None                 # name in `pretrainings`
    finetune: FinetuneParams = FinetuneParams()
    retrain_heads: RetrainHeadsParams = RetrainHeadsParams()
    predict_batch_size: int = Field(128, ge=1)
    description: str = ""
    template: bool = False                      # only the base of a study's grid: not run itself


class EnsembleParams(Strict):
    members: list[str]
    classification: Literal["mode", "mean_prob"] = "mode"
    similarity: Literal["median", "mean"] = "median"
    description: str = ""

    @field_validator("members")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("an ensemble needs members (two or more experiments, or one repeated experiment)")
        return v


class GridAxis(Strict):
    key: str                                    # an experiment setting, dotted: finetune.hidden_dropout
    values: list[Any]
    label: str = ""                             # short name in the experiment names and the report; default: the key's last part

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
    experiment: str                             # the experiment each cell changes
    axes: list[GridAxis] = Field(min_length=1, max_length=2)


# ---------------------------------------------------------------- the papers' tables

PAPER_OVERALL = {"leaderboard": "overall", "mean": "mean"}   # a paper's overall formula -> metrics.json key
# what a paper column reads: its overall score (in the paper's formula) or one task's metric
PaperMetric = Literal[("overall",) + tuple(t.metric_key for t in TASKS.values())]
Split = Literal["dev", "test"]


class PaperParams(Strict):
    """A report the catalogue reproduces: its title, its own overall formula and the scale it ran
    at (for the line under each of its tables that says how this run's scale differs)."""
    title: str
    # leaderboard: (SST acc + Para acc + (STS r + 1) / 2) / 3; mean: the plain mean of the three
    overall: Literal["leaderboard", "mean"]
    model: str = "bert-base-uncased"
    epochs: int | None = Field(None, ge=1)      # the epochs of most of its rows
    # rows per task as the paper prints them (its training split where it gives one)
    data: dict[Task, Annotated[int, Field(ge=1)]] = {}


class PaperColumn(Strict):
    name: str                                   # as printed: "Overall Dev", "QQP", "DEV_TOTAL"
    metric: PaperMetric                         # overall: the paper's formula (`papers.<id>.overall`)


class PaperRow(Strict):
    """One printed row: its label, what reproduces it (`run`: an experiment, a repeated experiment
    or an ensemble; or `best_of`: the best by dev of experiments or of studies' rows, as a paper's
    best-of-a-sweep row), and every value it prints, per split, by column name."""
    label: str
    run: str | None = None
    best_of: list[str] = []
    dev: dict[str, float] = {}
    test: dict[str, float] = {}

    @model_validator(mode="after")
    def _one_source(self):
        if (self.run is None) == (not self.best_of):
            raise ValueError(f"row '{self.label}': give either 'run' (an experiment or ensemble) or 'best_of' "
                             f"(experiments or studies whose best by dev stands for the row)")
        return self


class PaperClaim(Strict):
    """A comparison the paper makes between two of its rows: `better` scores higher than `worse`
    on `column` (the paper's difference is that of its printed values)."""
    text: str                                   # the claim in a few words
    better: str                                 # row labels
    worse: str
    column: str
    split: Split = "dev"


class StudyPaper(Strict):
    """The paper table a study reproduces, as data: which paper and table, its columns in order,
    its rows with every printed value, the summary rows it prints, and its claims."""
    id: str                                     # a key of `papers`
    table: str                                  # "Table 2", "Figure 5"
    columns: list[PaperColumn] = Field(min_length=1)
    rows: list[PaperRow] = Field(min_length=1)
    summary: dict[Literal["mean", "std"], dict[str, float]] = {}   # printed Average / Std rows
    claims: list[PaperClaim] = []

    @model_validator(mode="after")
    def _consistent(self):
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("columns: a column name is given twice")
        labels = [r.label for r in self.rows]
        if len(set(labels)) != len(labels):
            dup = next(x for x in labels if labels.count(x) > 1)
            raise ValueError(f"rows: label '{dup}' is given twice")
        for r in self.rows:
            for split in ("dev", "test"):
                for col in getattr(r, split):
                    if col not in names:
                        raise ValueError(f"row '{r.label}' {split}: unknown column '{col}'{_close(col, names)}")
        for kind, values in self.summary.items():
            for col in values:
                if col not in names:
                    raise ValueError(f"summary {kind}: unknown column '{col}'{_close(col, names)}")
        for c in self.claims:
            for side in (c.better, c.worse):
                if side not in labels:
                    raise ValueError(f"claim '{c.text}': unknown row '{side}'{_close(side, labels)}")
            if c.column not in names:
                raise ValueError(f"claim '{c.text}': unknown column '{c.column}'{_close(c.column, names)}")
            rows = {r.label: getattr(r, c.split) for r in self.rows}
            if c.column not in rows[c.better] or c.column not in rows[c.worse]:
                raise ValueError(f"claim '{c.text}': the paper prints no {c.split} {c.column} for "
                                 f"'{c.better if c.column not in rows[c.better] else c.worse}'")
            if rows[c.better][c.column] <= rows[c.worse][c.column]:
                raise ValueError(f"claim '{c.text}': the paper's {c.better} ({rows[c.better][c.column]}) is not "
                                 f"above {c.worse} ({rows[c.worse][c.column]}) on {c.column}")
        return self

    def column(self, name: str) -> PaperColumn:
        return next(c for c in self.columns if c.name == name)

    def row(self, label: str) -> PaperRow:
        return next(r for r in self.rows if r.label == label)

    def paper_difference(self, claim: PaperClaim) -> float:
        return (getattr(self.row(claim.better), claim.split)[claim.column]
                - getattr(self.row(claim.worse), claim.split)[claim.column])


class StudyParams(Strict):
    name: str
    title: str
    experiments: list[str] = []
    grid: GridParams | None = None              # more rows: the grid's cells
    summary: list[Literal["mean", "std"]] = []  # rows under the table: the mean / spread of each column
    repeats: Annotated[int, Field(ge=1, le=100)] | None = None   # seeds for every row that sets none
    baseline: str | None = None                 # None: the first row
    splits: list[Literal["dev", "test"]] = ["dev", "test"]
    source: str = ""                            # which paper table it reproduces
    paper: StudyPaper | None = None             # that table as data: rows, columns, printed values, claims


class ReportParams(Strict):
    title: str = "Multi-task minBERT"
    worst_k: int = Field(10, ge=1)


class ExportParams(Strict):
    # experiments written to results/exports/<E> in the Hugging Face format with a model card (a
    # repeated experiment: each seed); an export runs only for the experiments listed here
    experiments: list[str] = []
    license: str = "apache-2.0"                 # the model card's license (the Hub's identifiers)
    language: str = "en"


class Params(Strict):
    catalogue: str = "demo"                     # demo: the sections below; NAME: params/NAME.yaml's sections
    data: DataParams = DataParams()
    base: dict[str, Any] = {}
    pretrainings: dict[str, PretrainParams] = {}
    experiments: dict[str, dict[str, Any]]
    ensembles: dict[str, EnsembleParams] = {}
    papers: dict[str, PaperParams] = {}        # the reports whose tables studies reproduce (`studies[].paper`)
    studies: list[StudyParams] = []
    report: ReportParams = ReportParams()
    export: ExportParams = ExportParams()


# ---------------------------------------------------------------- loading

def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _key_path(loc) -> str:
    return ".".join(str(p) for p in loc)


def _suggest(model_cls, loc, bad_key) -> str:
    """Nearest valid key at the location of an unknown key."""
    cls = model_cls
    for part in loc[:-1]:
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return ""
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            cls = ann
        else:
            return ""
    names = list(getattr(cls, "model_fields", {}))
    close = difflib.get_close_matches(str(bad_key), names, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# keys an earlier version read -> what replaced them (said in the error instead of a bare "unknown key")
RENAMED = {"bf16": "use 'precision' (auto | bf16 | fp32): bf16: true -> precision: bf16, bf16: false -> "
                   "precision: fp32, or precision: auto for bf16 wherever it is native"}


def _raise_validation(err: ValidationError, model_cls, where: str, prefix: str = "") -> None:
    e = err.errors()[0]
    loc = tuple(e["loc"])
    key = prefix + _key_path(loc)
    if e["type"] == "extra_forbidden" and loc and loc[-1] in RENAMED:
        raise MinBertError(f"{where}: key '{key}' is no longer read; {RENAMED[loc[-1]]}") from None
    if e["type"] == "extra_forbidden":
        raise MinBertError(f"{where}: unknown key '{key}'{_suggest(model_cls, loc, loc[-1] if loc else '')}") from None
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    got_s = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    raise MinBertError(f"{where}: key '{key}': {msg}{got_s}") from None


def resolve_experiment(raw_base: dict, overrides: dict, name: str, where: str = "params.yaml") -> ExperimentParams:
    merged = deep_merge(raw_base or {}, overrides or {})
    try:
        return ExperimentParams.model_validate(merged)
    except ValidationError as err:
        _raise_validation(err, ExperimentParams, where, prefix=f"experiments.{name}.")


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (YAML itself would keep the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *anchor`: the keys after it override
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def read_yaml(path: str | Path):
    """A YAML file's content; a one-line error for a missing or unreadable file, a syntax error
    (with its line) or a duplicate key (with both lines)."""
    from minbert.core.io import read_input

    path = Path(path)
    data = read_input(path, "parameter file", limit=16 << 20)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)   # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as e:
        raise MinBertError(f"{path} line {e.second}: key '{e.key}' is given twice in one mapping (first on line "
                           f"{e.first}); keep one") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MinBertError(f"{path}{where}: not valid YAML ({e.problem or e.context}); fix the syntax") from None
    except yaml.YAMLError as e:
        raise MinBertError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def load_params(path: str | Path = "params.yaml") -> "LoadedParams":
    path = Path(path)
    raw = read_yaml(path)
    raw, source = _with_catalogue(raw, path)
    loaded = validate_params(raw, str(source))
    loaded.path, loaded.source = path, source
    return loaded


# The sections a catalogue file provides; params.yaml keeps `catalogue` and `report`.
CATALOGUE_SECTIONS = ("data", "base", "pretrainings", "experiments", "ensembles", "papers", "studies", "export")


def catalogue_file(params_path: str | Path, name: str) -> Path:
    return Path(params_path).parent / "params" / f"{name}.yaml"


def _with_catalogue(raw: Any, path: Path) -> tuple[Any, Path]:
    """`catalogue: demo` (the default) uses params.yaml's own sections; `catalogue: NAME` takes them
    from params/NAME.yaml instead, so switching the whole study catalogue is one key."""
    if not isinstance(raw, dict) or raw.get("catalogue", "demo") == "demo":
        return raw, path
    name = raw["catalogue"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MinBertError(f"{path}: key 'catalogue': expected 'demo' or the name of a file in params/ (got {name!r})")
    cat_path = catalogue_file(path, name)
    if not cat_path.is_file():
        known = ["demo"] + sorted(p.stem for p in cat_path.parent.glob("*.yaml"))
        raise MinBertError(f"{path}: key 'catalogue': no catalogue file {cat_path}{_close(name, known)}")
    cat = read_yaml(cat_path)
    if not isinstance(cat, dict):
        raise MinBertError(f"{cat_path}: expected a mapping at the top level")
    extra = sorted(set(cat) - set(CATALOGUE_SECTIONS))
    if extra:
        raise MinBertError(f"{cat_path}: unknown key '{extra[0]}'{_close(extra[0], CATALOGUE_SECTIONS)} "
                           f"(a catalogue holds {', '.join(CATALOGUE_SECTIONS)})")
    merged = {k: v for k, v in raw.items() if k not in CATALOGUE_SECTIONS}
    merged.update(cat)
    return merged, cat_path


def _check_name(name, where: str, what: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MinBertError(f"{where}: {what} name {name!r} must be letters, digits, '_', '-', '.' "
                           f"(starting with a letter or digit)")
    if len(name) > NAME_MAX:
        raise MinBertError(f"{where}: {what} name '{name[:40]}...' has {len(name)} characters; names become file "
                           f"names, keep them to {NAME_MAX}")


def seeds_of(exp: ExperimentParams, study_repeats: int | None = None) -> list[int] | None:
    """The seeds of a repeated experiment (its own `repeats`, else its studies'); None when it runs once."""
    rep = exp.repeats if exp.repeats != 1 else (study_repeats or 1)
    if isinstance(rep, list):
        return list(dict.fromkeys(rep))
    return [exp.seed + k for k in range(rep)] if rep > 1 else None


def seed_name(name: str, seed: int) -> str:
    return f"{name}.seed{seed}"


def _value_name(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


def _nested(key: str, value) -> dict:
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def grid_cells(study: StudyParams) -> list[tuple[str, dict[str, Any]]]:
    """A grid's cells: (experiment name, {axis name: value}), the first axis varying slowest."""
    import itertools

    axes = study.grid.axes
    return [(study.name + "".join(f".{a.name}{_value_name(v)}" for a, v in zip(axes, values)),
             {a.name: v for a, v in zip(axes, values)}) for values in itertools.product(*(a.values for a in axes))]


def _expand_grids(params: Params, where: str) -> dict[str, list]:
    """Add every grid cell to the experiments (the grid's experiment with the cell's settings) and
    to its study's rows; returns {study: cells}."""
    grids = {}
    for i, st in enumerate(params.studies):
        if st.grid is None:
            continue
        template = st.grid.experiment
        if template not in params.experiments:
            raise MinBertError(f"{where}: key 'studies[{i}].grid.experiment' (study '{st.name}'): unknown experiment "
                               f"'{template}'{_close(template, params.experiments)}")
        cells = grid_cells(st)
        labels = [a.name for a in st.grid.axes]
        if len(set(labels)) != len(labels):
            raise MinBertError(f"{where}: key 'studies[{i}].grid.axes' (study '{st.name}'): two axes are named "
                               f"'{labels[0]}'; give them labels")
        for name, values in cells:
            _check_name(name, where, f"grid cell (study '{st.name}')")
            if name in params.experiments:
                raise MinBertError(f"{where}: key 'studies[{i}].grid' (study '{st.name}'): its cell '{name}' is also "
                                   f"an experiment of params.yaml; rename one of them")
            overrides = copy.deepcopy(params.experiments[template] or {})
            for axis in st.grid.axes:
                overrides = deep_merge(overrides, _nested(axis.key, values[axis.name]))
            what = ", ".join(f"{k} {_value_name(v)}" for k, v in values.items())
            overrides["description"] = f"{overrides.get('description') or template} ({what})"
            overrides["template"] = False
            params.experiments[name] = overrides
        st.experiments = list(st.experiments) + [n for n, _ in cells if n not in st.experiments]
        grids[st.name] = cells
    return grids


def validate_params(raw: Any, where: str = "params.yaml") -> "LoadedParams":
    if not isinstance(raw, dict):
        raise MinBertError(f"{where}: expected a mapping at the top level")
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        _raise_validation(err, Params, where)
    try:
        ExperimentParams.model_validate(params.base)
    except ValidationError as err:
        _raise_validation(err, ExperimentParams, where, prefix="base.")
    grids = _expand_grids(params, where)
    study_repeats: dict[str, int] = {}
    for st in params.studies:
        for e in st.experiments if st.repeats else ():
            study_repeats[e] = max(study_repeats.get(e, 1), st.repeats)
    experiments, groups = {}, {}
    for name, ov in params.experiments.items():
        _check_name(name, where, "experiment")
        if ov is None:
            ov = {}
        if not isinstance(ov, dict):
            raise MinBertError(f"{where}: key 'experiments.{name}': expected a mapping of overrides")
        exp = resolve_experiment(params.base, ov, name, where)
        if exp.pretrain is not None and exp.pretrain not in params.pretrainings:
            raise MinBertError(f"{where}: key 'experiments.{name}.pretrain': unknown pretraining "
                               f"'{exp.pretrain}'{_close(exp.pretrain, params.pretrainings)}")
        for t in exp.finetune.task_weights:
            if t not in exp.finetune.tasks:
                raise MinBertError(f"{where}: key 'experiments.{name}.finetune.task_weights.{t}': "
                                   f"task '{t}' is not trained in this experiment")
        unit = exp.finetune.epoch_unit
        if unit not in ("smallest", "largest") and unit not in exp.finetune.tasks:
            raise MinBertError(f"{where}: key 'experiments.{name}.finetune.epoch_unit': '{unit}' is "
                               f"not smallest, largest or one of the experiment's tasks")
        if exp.template:
            continue
        seeds = seeds_of(exp, study_repeats.get(name))
        if seeds is None:
            experiments[name] = exp
            continue
        groups[name] = []
        for seed in seeds:
            member = seed_name(name, seed)
            _check_name(member, where, "experiment")
            if member in params.experiments:
                raise MinBertError(f"{where}: key 'experiments.{name}.repeats': seed {seed} would be experiment "
                                   f"'{member}', which params.yaml already defines; rename one of them")
            experiments[member] = exp.model_copy(update={"seed": seed, "repeats": 1})
            groups[name].append(member)
    for kind, names in (("pretraining", params.pretrainings), ("ensemble", params.ensembles)):
        for name in names:
            _check_name(name, where, kind)
    clash = set(params.ensembles) & (set(experiments) | set(groups))
    if clash:
        raise MinBertError(f"{where}: '{sorted(clash)[0]}' names both an experiment and an ensemble")
    known = set(experiments) | set(groups)
    for ens_name, ens in params.ensembles.items():
        for m in ens.members:
            if m not in known:
                raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': unknown experiment "
                                   f"'{m}'{_close(m, known)}")
        # a repeated experiment stands for its seeds: the seed ensemble is one entry
        ens.members = [x for m in ens.members for x in groups.get(m, [m])]
        if len(ens.members) < 2:
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': an ensemble needs at least two "
                               f"members (got {ens.members})")
    _check_combinations(params, experiments, where, groups)
    runnable = known | set(params.ensembles)
    _check_papers(params, runnable, where)
    seen_studies = set()
    for i, st in enumerate(params.studies):
        if st.name in seen_studies:
            raise MinBertError(f"{where}: key 'studies[{i}].name': study '{st.name}' is defined twice")
        seen_studies.add(st.name)
        for e in st.experiments:
            if e not in runnable:
                raise MinBertError(f"{where}: key 'studies[{i}].experiments' (study '{st.name}'): unknown "
                                   f"experiment '{e}'{_close(e, runnable)}")
        if st.baseline is not None and st.baseline not in st.experiments:
            raise MinBertError(f"{where}: key 'studies[{i}].baseline' (study '{st.name}'): "
                               f"'{st.baseline}' is not one of the study's experiments")
    for name in params.export.experiments:
        if name not in known:
            raise MinBertError(f"{where}: key 'export.experiments': unknown experiment '{name}'{_close(name, known)}")
    params.export.experiments = list(dict.fromkeys(x for m in params.export.experiments for x in groups.get(m, [m])))
    for i, st in enumerate(params.studies):
        if not st.experiments:
            raise MinBertError(f"{where}: key 'studies[{i}]' (study '{st.name}'): no rows; list experiments, a grid "
                               f"or a paper table")
    return LoadedParams(params=params, experiments=experiments, raw=raw, groups=groups, grids=grids)


def _check_papers(params: Params, runnable: set, where: str) -> None:
    """A study's paper table names a known paper, and its rows runs that exist: a row's `run` joins
    the study's experiments; a `best_of` that names a study stands for that study's rows."""
    rows_of = {st.name: list(st.experiments) for st in params.studies}
    for i, st in enumerate(params.studies):
        if st.paper is None:
            continue
        key = f"studies[{i}].paper"
        if st.paper.id not in params.papers:
            raise MinBertError(f"{where}: key '{key}.id' (study '{st.name}'): unknown paper '{st.paper.id}'"
                               f"{_close(st.paper.id, params.papers)}; describe it under 'papers'")
        for j, row in enumerate(st.paper.rows):
            if row.run is not None:
                if row.run not in runnable:
                    raise MinBertError(f"{where}: key '{key}.rows[{j}].run' (row '{row.label}'): unknown experiment "
                                       f"or ensemble '{row.run}'{_close(row.run, runnable)}")
                if row.run not in st.experiments:
                    st.experiments = list(st.experiments) + [row.run]
                continue
            names = []
            for name in row.best_of:
                if name in rows_of and name not in runnable:
                    names += rows_of[name]
                elif name in runnable:
                    names.append(name)
                else:
                    raise MinBertError(f"{where}: key '{key}.rows[{j}].best_of' (row '{row.label}'): '{name}' is no "
                                       f"experiment, ensemble or study{_close(name, runnable | set(rows_of))}")
            row.best_of = list(dict.fromkeys(names))


MULTI_TASK_UPDATES = ("simultaneous",)          # the schedules whose updates sum several tasks' losses


def model_tasks(exp: ExperimentParams) -> list[str]:
    """Every task an experiment's final model has: the fine-tuned ones, then those head retraining adds."""
    extra = [t for t in (exp.retrain_heads.tasks or []) if t not in exp.finetune.tasks] \
        if exp.retrain_heads.enabled else []
    return list(exp.finetune.tasks) + extra


def shared_tasks(members: list[str], experiments: dict) -> set[str]:
    """The tasks every one of `members`' final models has (what a teacher of them can predict)."""
    return set.intersection(*(set(model_tasks(experiments[m])) for m in members))


def teacher_members(teacher: str, experiments: dict, groups: dict, ensembles: dict) -> list[str] | None:
    """The experiments whose models a teacher averages (None: no such experiment or ensemble)."""
    if teacher in experiments:
        return [teacher]
    if teacher in groups:
        return list(groups[teacher])
    if teacher in ensembles:
        return list(ensembles[teacher].members)
    return None


def _check_combinations(params: Params, experiments: dict[str, ExperimentParams], where: str,
                        groups: dict | None = None) -> None:
    """Settings that validate one by one but cannot run together."""
    data = params.data
    base_finetune = ExperimentParams.model_validate(params.base).finetune
    for name, pre in params.pretrainings.items():
        if pre.kind == "nli" and data.nli_file is None:
            raise MinBertError(f"{where}: key 'pretrainings.{name}.kind': NLI pretraining needs NLI data; "
                               f"set 'data.nli_file'")
        if pre.kind == "mlm":
            if "nli" in pre.mlm.tasks and data.nli_file is None:
                raise MinBertError(f"{where}: key 'pretrainings.{name}.mlm.tasks': 'nli' needs 'data.nli_file'")
            if "cfimdb" in pre.mlm.tasks and not data.include_cfimdb:
                raise MinBertError(f"{where}: key 'pretrainings.{name}.mlm.tasks': 'cfimdb' needs "
                                   f"'data.include_cfimdb: true'")
        if pre.finetune and pre.kind != "para_first":
            raise MinBertError(f"{where}: key 'pretrainings.{name}.finetune': only a para_first pretraining trains "
                               f"with the fine-tuning settings (this one is {pre.kind}); remove it")
        if pre.finetune:
            try:
                FinetuneParams.model_validate(deep_merge(base_finetune.model_dump(), pre.finetune))
            except ValidationError as err:
                _raise_validation(err, FinetuneParams, where, prefix=f"pretrainings.{name}.finetune.")
    for name, exp in experiments.items():
        ft, key = exp.finetune, f"experiments.{name}"
        if ft.pcgrad and len(ft.tasks) < 2:
            raise MinBertError(f"{where}: key '{key}.finetune.pcgrad': PCGrad needs at least "
                               f"two tasks (got {ft.tasks})")
        if ft.pcgrad and ft.schedule not in MULTI_TASK_UPDATES:
            raise MinBertError(f"{where}: key '{key}.finetune.pcgrad': PCGrad projects the gradients of the tasks "
                               f"of one update, and under schedule '{ft.schedule}' every update trains one task, so it "
                               f"would do nothing; use schedule: simultaneous")
        unknown = [t for t in (ft.smart.tasks or []) if t not in ft.tasks]
        if ft.smart.enabled and unknown:
            raise MinBertError(f"{where}: key '{key}.finetune.smart.tasks': '{unknown[0]}' is not "
                               f"trained by this experiment (finetune.tasks: {ft.tasks})")
        untrained = [t for t in ft.walk_through if t not in ft.tasks]
        if untrained:
            raise MinBertError(f"{where}: key '{key}.finetune.walk_through': '{untrained[0]}' is not trained by this "
                               f"experiment (finetune.tasks: {ft.tasks})")
        if ft.freeze_encoder and exp.retrain_heads.enabled:
            raise MinBertError(f"{where}: key '{key}.retrain_heads.enabled': the encoder is "
                               f"already frozen in finetune (finetune.freeze_encoder); drop one of them")
        if ft.frozen_encoder_dropout and not ft.freeze_encoder:
            raise MinBertError(f"{where}: key '{key}.finetune.frozen_encoder_dropout': applies to a frozen encoder "
                               f"only and would do nothing here; drop it or set finetune.freeze_encoder: true")
        if ft.heads.sst == "prototypes" and "sst" in ft.tasks and not ft.freeze_encoder:
            raise MinBertError(f"{where}: key '{key}.finetune.heads.sst': a prototypes head compares sentences with "
                               f"prototypes embedded once, so it trains over a frozen encoder: train sst in "
                               f"retrain_heads (retrain_heads.tasks: [sst]) or set finetune.freeze_encoder")
        if exp.pretrain is not None:
            pre = params.pretrainings[exp.pretrain]
            # every task reads the sentence embedding NLI trained (a task's own pooling included)
            other = next((t for t in model_tasks(exp) if ft.heads.pooling_of(t) != pre.nli.pooling), None)
            if pre.kind == "nli" and other is not None:
                where_key = (f"task_pooling.{other}" if other in ft.heads.task_pooling else "pooling")
                raise MinBertError(f"{where}: key '{key}.finetune.heads.{where_key}': the NLI pretraining "
                                   f"'{exp.pretrain}' trains {pre.nli.pooling}-pooled sentence embeddings but "
                                   f"{other} reads '{ft.heads.pooling_of(other)}'; set the same pooling in both "
                                   f"(pretrainings.{exp.pretrain}.nli.pooling)")
    groups = groups or {}
    for name, exp in experiments.items():
        d = exp.finetune.distill
        if d is None:
            continue
        key = f"experiments.{name}.finetune.distill"
        members = teacher_members(d.teacher, experiments, groups, params.ensembles)
        if members is None:
            known = set(experiments) | set(groups) | set(params.ensembles)
            raise MinBertError(f"{where}: key '{key}.teacher': unknown experiment or ensemble "
                               f"'{d.teacher}'{_close(d.teacher, known)}")
        if name in members:
            raise MinBertError(f"{where}: key '{key}.teacher': '{name}' cannot be its own teacher")
        chain, seen = members, {name}
        while chain:   # a teacher (or its teachers) learning from this experiment would never start
            if seen & set(chain):
                raise MinBertError(f"{where}: key '{key}.teacher': '{d.teacher}' learns (through its teachers) "
                                   f"from '{name}' itself; break the cycle")
            seen |= set(chain)
            nxt = []
            for m in chain:
                dm = experiments[m].finetune.distill
                if dm is not None:
                    nxt += teacher_members(dm.teacher, experiments, groups, params.ensembles) or []
            chain = nxt
        taught = shared_tasks(members, experiments)
        wanted = set(d.tasks or exp.finetune.tasks)
        if d.tasks is not None:
            untrained = [t for t in d.tasks if t not in exp.finetune.tasks]
            if untrained:
                raise MinBertError(f"{where}: key '{key}.tasks': '{untrained[0]}' is not trained by this "
                                   f"experiment (finetune.tasks: {exp.finetune.tasks}); distil only tasks it trains")
            missing = sorted(wanted - taught)
            if missing:
                raise MinBertError(f"{where}: key '{key}.tasks': the teacher '{d.teacher}' does not predict "
                                   f"{missing[0]}")
        if not (wanted & taught & set(exp.finetune.tasks)):
            raise MinBertError(f"{where}: key '{key}.teacher': '{d.teacher}' predicts none of the tasks this "
                               f"experiment trains")
    for ens_name, ens in params.ensembles.items():
        if len(set(ens.members)) != len(ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': lists a member twice")
        common = set.intersection(*(set(model_tasks(experiments[m])) for m in ens.members
                                    if m in experiments)) if ens.members else set()
        if not common and all(m in experiments for m in ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': the members share no task")


def _close(word, choices) -> str:
    m = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean '{m[0]}'?)" if m else ""


class LoadedParams:
    """Validated params with each experiment resolved (base deep-merged with its overrides)."""

    def __init__(self, params: Params, experiments: dict[str, ExperimentParams], raw: dict,
                 groups: dict[str, list[str]] | None = None, grids: dict[str, list] | None = None):
        self.params = params
        self.experiments = experiments      # every experiment that runs (a repeated one as its seeds)
        self.raw = raw
        self.groups = groups or {}          # repeated experiment -> its seeds' experiments
        self.grids = grids or {}            # study -> its grid's cells: [(experiment, {axis: value})]
        self.path: Path | None = None     # params.yaml as given to load_params
        self.source: Path | None = None   # the file the sections come from (params.yaml or a catalogue)

    def experiment(self, name: str) -> ExperimentParams:
        if name in self.groups:
            raise MinBertError(f"params.yaml: experiment '{name}' runs as {len(self.groups[name])} seeds; name one "
                               f"of them ({', '.join(self.groups[name])})")
        if name not in self.experiments:
            raise MinBertError(f"params.yaml: unknown experiment '{name}'{_close(name, self.experiments)}")
        return self.experiments[name]

    def pretraining(self, name: str) -> PretrainParams:
        if name not in self.params.pretrainings:
            raise MinBertError(f"params.yaml: unknown pretraining '{name}'{_close(name, self.params.pretrainings)}")
        return self.params.pretrainings[name]

    def ensemble(self, name: str) -> EnsembleParams:
        if name not in self.params.ensembles:
            raise MinBertError(f"params.yaml: unknown ensemble '{name}'{_close(name, self.params.ensembles)}")
        return self.params.ensembles[name]

    @property
    def base(self) -> ExperimentParams:
        """`base` on its own, with the defaults filled in."""
        return ExperimentParams.model_validate(self.params.base)

    def overrides(self, name: str) -> dict:
        """The parameters of experiment `name` that differ from the base (for the report)."""
        return _diff(self.base.model_dump(), self.experiment(name).model_dump())


def _diff(a: dict, b: dict, prefix: str = "") -> dict:
    out = {}
    for k in b:
        if isinstance(b[k], dict) and isinstance(a.get(k), dict):
            out.update(_diff(a[k], b[k], f"{prefix}{k}."))
        elif a.get(k) != b[k]:
            out[f"{prefix}{k}"] = b[k]
    return out
