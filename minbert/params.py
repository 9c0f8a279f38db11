"""The schema of params.yaml: validated before anything runs.

params.yaml has these top-level sections:

    data:         how `prepare` reads and validates the raw files (one prepare for all experiments)
    base:         the settings every experiment starts from (model, seed, device, finetune, ...)
    pretrainings: named pretraining configurations; experiments refer to them by name, so
                  experiments with the same pretraining share one pretrained output
    experiments:  named experiments, each a (deep-merged) override of `base`
    ensembles:    named ensembles over member experiments
    studies:      the report's tables: a title, experiments as rows, a baseline row
    report:       report settings

Errors are one line naming the key (and the nearest valid key for a typo).
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import MinBertError

TASKS = ("sst", "para", "sts")
Task = Literal["sst", "para", "sts"]
# pair heads: cross = cross-encoder "[CLS] a [SEP] b [SEP]"; the others embed each sentence
PairHead = Literal["cross", "concat", "concat_mult", "concat_cos", "cosine", "cosine_linear"]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# ---------------------------------------------------------------- data (prepare)

class DataParams(Strict):
    dir: str = "data/demo"                     # folder in the CS224N layout (demo data ships in the repo)
    nli_file: str | None = "data/demo/nli-sample.jsonl"  # SNLI/MNLI jsonl; None: no NLI data
    include_cfimdb: bool = False               # also prepare ids-cfimdb-* (binary sentiment)
    on_bad_rows: Literal["error", "drop"] = "error"
    nli_dev_fraction: float = Field(0.1, gt=0, lt=1)
    seed: int = 11711                          # seeds the NLI train/dev split by premise group


class Downsample(Strict):
    """How a stage subsamples its training data (seeded and stable: same seed, same rows)."""
    mode: Literal["none", "smallest", "fixed"] = "none"
    size: int | None = Field(None, gt=0)       # rows per task, for mode=fixed
    caps: dict[Task, int] = {}                 # per-task upper bounds applied after `mode`

    @model_validator(mode="after")
    def _size_for_fixed(self):
        if self.mode == "fixed" and self.size is None:
            raise ValueError("mode 'fixed' needs 'size'")
        return self


# ---------------------------------------------------------------- model heads

class HeadsParams(Strict):
    pooling: Literal["cls", "mean", "pooler"] = "cls"
    para: PairHead = "cross"
    sts: PairHead = "cross"
    sts_loss: Literal["mse", "pearson", "mse+pearson"] = "mse"
    cosine_target: Literal["0_1", "-1_1"] = "0_1"   # how STS 0-5 is scaled for cosine heads
    shared_layer: bool = False                  # one shared dense layer before the para/sts heads
    hidden_layers: int = Field(0, ge=0, le=4)   # extra hidden layers in each head
    dropout: float = Field(0.1, ge=0, lt=1)
    # pair tasks see both sentence orders: each training pair is read as (a, b) or (b, a) at
    # random (seeded), and a prediction is the mean of the outputs for (a, b) and (b, a)
    symmetric_pairs: bool = False
    # pair tasks whose bi-encoder head gets a cross-encoder term as well: the encoder also reads
    # "[CLS] a [SEP] b [SEP]", and the output is the bi-encoder head's plus a linear map of that
    # pooled vector (one model, both views of the pair)
    hybrid: list[Literal["para", "sts"]] = []

    @model_validator(mode="after")
    def _hybrid_needs_bi_head(self):
        for task in self.hybrid:
            if getattr(self, task) == "cross":
                bi_heads = ", ".join(k for k in get_args(PairHead) if k != "cross")
                raise ValueError(f"hybrid lists {task}, whose head is already `cross`: give {task} a "
                                 f"bi-encoder head ({bi_heads})")
        if len(set(self.hybrid)) != len(self.hybrid):
            raise ValueError("hybrid lists a task twice")
        return self


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


class FinetuneParams(Strict):
    tasks: list[Task] = list(TASKS)
    schedule: Literal["round_robin", "drop_round_robin", "simultaneous", "task_by_task",
                      "sequential", "proportional", "temperature"] = "round_robin"
    epoch_unit: str = "smallest"                # smallest | largest | <task>: one epoch = one pass over it
    temperature: float = Field(2.0, gt=0)       # for schedule=temperature
    task_weights: dict[Task, float] = {}
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0)
    head_lr: float | None = Field(None, gt=0)   # None: same as lr
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    lr_schedule: Literal["linear", "cosine", "constant"] = "linear"
    grad_clip: float | None = Field(1.0, gt=0)
    hidden_dropout: float | None = Field(None, ge=0, lt=1)  # overrides the checkpoint's dropout
    freeze_encoder: bool = False                # the frozen-encoder baseline
    gradient_checkpointing: bool = False
    heads: HeadsParams = HeadsParams()
    smart: SmartParams = SmartParams()
    pcgrad: bool = False
    downsample: Downsample = Downsample(mode="smallest")
    eval_every_epoch: bool = True
    max_steps_per_epoch: int | None = Field(None, ge=1)

    @field_validator("tasks")
    @classmethod
    def _nonempty_unique(cls, v):
        if not v:
            raise ValueError("needs at least one task")
        if len(set(v)) != len(v):
            raise ValueError("lists a task twice")
        return v


class RetrainHeadsParams(Strict):
    enabled: bool = False
    epochs: int = Field(2, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    downsample: Downsample = Downsample(mode="none")   # the papers retrain heads on full data


# ---------------------------------------------------------------- pretraining

class MlmParams(Strict):
    tasks: list[Literal["sst", "para", "sts", "cfimdb", "nli"]] = ["sst", "para", "sts"]
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
    max_steps_per_epoch: int | None = Field(None, ge=1)
    dev_size: int | None = Field(None, ge=1)    # cap on dev examples (a seeded subset), for quick runs
    bf16: bool | None = None                    # bf16 autocast; None: the base's `bf16`
    mlm: MlmParams = MlmParams()
    nli: NliParams = NliParams()


# ---------------------------------------------------------------- experiments

class ExperimentParams(Strict):
    """One experiment = base deep-merged with its overrides."""
    model: str = "all-MiniLM-L6-v2"
    seed: int = 11711
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False                          # bf16 autocast on CPU; always on for CUDA
    threads: int | None = Field(None, ge=1)
    max_length: int = Field(128, ge=8, le=512)
    pretrain: str | None = None                 # name in `pretrainings`
    finetune: FinetuneParams = FinetuneParams()
    retrain_heads: RetrainHeadsParams = RetrainHeadsParams()
    predict_batch_size: int = Field(128, ge=1)
    description: str = ""


class EnsembleParams(Strict):
    members: list[str]
    classification: Literal["mode", "mean_prob"] = "mode"
    similarity: Literal["median", "mean"] = "median"
    description: str = ""

    @field_validator("members")
    @classmethod
    def _two_or_more(cls, v):
        if len(v) < 2:
            raise ValueError("an ensemble needs at least two members")
        return v


class StudyParams(Strict):
    name: str
    title: str
    experiments: list[str]
    baseline: str | None = None                 # None: the first row
    splits: list[Literal["dev", "test"]] = ["dev", "test"]
    source: str = ""                            # which paper table it reproduces


class ReportParams(Strict):
    title: str = "Multi-task minBERT"
    worst_k: int = Field(10, ge=1)


class Params(Strict):
    catalogue: str = "demo"                     # demo: the sections below; NAME: params/NAME.yaml's sections
    data: DataParams = DataParams()
    base: dict[str, Any] = {}
    pretrainings: dict[str, PretrainParams] = {}
    experiments: dict[str, dict[str, Any]]
    ensembles: dict[str, EnsembleParams] = {}
    studies: list[StudyParams] = []
    report: ReportParams = ReportParams()


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


def _raise_validation(err: ValidationError, model_cls, where: str, prefix: str = "") -> None:
    e = err.errors()[0]
    loc = tuple(e["loc"])
    key = prefix + _key_path(loc)
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


def load_params(path: str | Path = "params.yaml") -> "LoadedParams":
    path = Path(path)
    if not path.is_file():
        raise MinBertError(f"{path}: parameter file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise MinBertError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    raw, source = _with_catalogue(raw, path)
    loaded = validate_params(raw, str(source))
    loaded.path, loaded.source = path, source
    return loaded


# The sections a catalogue file provides; params.yaml keeps `catalogue` and `report`.
CATALOGUE_SECTIONS = ("data", "base", "pretrainings", "experiments", "ensembles", "studies")


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
    try:
        cat = yaml.safe_load(cat_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise MinBertError(f"{cat_path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(cat, dict):
        raise MinBertError(f"{cat_path}: expected a mapping at the top level")
    extra = sorted(set(cat) - set(CATALOGUE_SECTIONS))
    if extra:
        raise MinBertError(f"{cat_path}: unknown key '{extra[0]}'{_close(extra[0], CATALOGUE_SECTIONS)} "
                           f"(a catalogue holds {', '.join(CATALOGUE_SECTIONS)})")
    merged = {k: v for k, v in raw.items() if k not in CATALOGUE_SECTIONS}
    merged.update(cat)
    return merged, cat_path


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
    experiments = {}
    for name, ov in params.experiments.items():
        if not NAME_RE.match(name):
            raise MinBertError(f"{where}: experiment name '{name}' must be letters, digits, '_', '-', '.'")
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
        experiments[name] = exp
    for name in list(params.pretrainings) + list(params.ensembles):
        if not NAME_RE.match(name):
            raise MinBertError(f"{where}: name '{name}' must be letters, digits, '_', '-', '.'")
    clash = set(params.ensembles) & set(params.experiments)
    if clash:
        raise MinBertError(f"{where}: '{sorted(clash)[0]}' names both an experiment and an ensemble")
    for ens_name, ens in params.ensembles.items():
        for m in ens.members:
            if m not in experiments:
                raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': unknown experiment "
                                   f"'{m}'{_close(m, experiments)}")
    _check_combinations(params, experiments, where)
    runnable = set(experiments) | set(params.ensembles)
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
    return LoadedParams(params=params, experiments=experiments, raw=raw)


def _check_combinations(params: Params, experiments: dict[str, ExperimentParams], where: str) -> None:
    """Settings that validate one by one but cannot run together."""
    data = params.data
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
    for name, exp in experiments.items():
        ft = exp.finetune
        if ft.pcgrad and len(ft.tasks) < 2:
            raise MinBertError(f"{where}: key 'experiments.{name}.finetune.pcgrad': PCGrad needs at least "
                               f"two tasks (got {ft.tasks})")
        unknown = [t for t in (ft.smart.tasks or []) if t not in ft.tasks]
        if ft.smart.enabled and unknown:
            raise MinBertError(f"{where}: key 'experiments.{name}.finetune.smart.tasks': '{unknown[0]}' is not "
                               f"trained by this experiment (finetune.tasks: {ft.tasks})")
        if ft.freeze_encoder and exp.retrain_heads.enabled:
            raise MinBertError(f"{where}: key 'experiments.{name}.retrain_heads.enabled': the encoder is "
                               f"already frozen in finetune (finetune.freeze_encoder); drop one of them")
    for ens_name, ens in params.ensembles.items():
        if len(set(ens.members)) != len(ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': lists a member twice")
        common = set.intersection(*(set(experiments[m].finetune.tasks) for m in ens.members
                                    if m in experiments)) if ens.members else set()
        if not common and all(m in experiments for m in ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': the members share no task")


def _close(word, choices) -> str:
    m = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean '{m[0]}'?)" if m else ""


class LoadedParams:
    """Validated params with each experiment resolved (base deep-merged with its overrides)."""

    def __init__(self, params: Params, experiments: dict[str, ExperimentParams], raw: dict):
        self.params = params
        self.experiments = experiments
        self.raw = raw
        self.path: Path | None = None     # params.yaml as given to load_params
        self.source: Path | None = None   # the file the sections come from (params.yaml or a catalogue)

    def experiment(self, name: str) -> ExperimentParams:
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

    def pretrain_model(self, name: str) -> str:
        """The model a pretraining starts from: its own `model`, else the base model."""
        p = self.pretraining(name)
        return p.model or ExperimentParams.model_validate(self.params.base).model

    def overrides(self, name: str) -> dict:
        """The parameters of experiment `name` that differ from the base (for the report)."""
        base = ExperimentParams.model_validate(self.params.base).model_dump()
        return _diff(base, self.experiment(name).model_dump())


def _diff(a: dict, b: dict, prefix: str = "") -> dict:
    out = {}
    for k in b:
        if isinstance(b[k], dict) and isinstance(a.get(k), dict):
            out.update(_diff(a[k], b[k], f"{prefix}{k}."))
        elif a.get(k) != b[k]:
            out[f"{prefix}{k}"] = b[k]
    return out
