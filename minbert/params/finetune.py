"""The fine-tuning sections of the params schema: the heads and their losses, SMART, distillation,
the fine-tuning itself (`FinetuneParams`, with what its settings must agree on) and head retraining.
Every key's help text is its field's `description` (minbert.params.docs generates the docs' key
tables from them)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from minbert.core.extensions import ADDED, HEADS
from minbert.core.losses import LOSSES
from minbert.core.tasks import DEFAULT_TASKS, PAIR_TASKS, TASKS
from minbert.params.fields import LR_SCHEDULE, Downsample, Strict, TaskName, refuse
from minbert.params.messages import close

# the multi-task schedules (minbert.train.schedules implements each)
SCHEDULES = ("round_robin", "drop_round_robin", "simultaneous", "task_by_task", "sequential",
             "proportional", "temperature")
MULTI_TASK_UPDATES = ("simultaneous",)          # the schedules whose updates sum several tasks' losses
# pair heads: `cross` reads the cross-encoded pair; the others embed each sentence (minbert.model.heads)
BI_ENCODER_HEADS = ("concat_uv", "concat", "concat_mult", "concat_cos", "cosine", "cosine_linear")
PAIR_HEADS = ("cross",) + BI_ENCODER_HEADS
SINGLE_HEADS = ("classifier", "prototypes")     # one-text heads; prototypes: a classification task's
SCALAR_HEADS = ("cosine", "cosine_linear")      # pair heads of one output (an affine map of the cosine)
NAMED_HEADS = ("sst", "para", "sts")            # the built-in tasks whose head has a key of its own

# pair heads: cross = cross-encoder "[CLS] a [SEP] b [SEP]"; the others embed each sentence
PairHead = Literal[PAIR_HEADS]
Pooling = Literal["cls", "mean", "pooler"]


def batch_statistic_problem(heads: HeadsParams, tasks, batch_size: int, downsample: Downsample
                            ) -> tuple[str, str] | None:
    """A loss that is a statistic of the whole batch (its declaration says so: minbert.core.losses),
    over batches of one row: the statistic of one row is undefined or constant, so the task never
    learns from it (nothing else would say so). (the key at fault: `batch_size` or `downsample`, the
    message), or None."""
    for task in tasks:
        name = heads.loss_of(task)
        if not LOSSES[name].batch_statistic:
            continue
        rows = [n for n in (downsample.size if downsample.mode == "fixed" else None, downsample.caps.get(task))
                if n is not None]
        per_batch = min([batch_size, *rows])
        if per_batch < 2:
            return ("batch_size" if per_batch == batch_size else "downsample",
                    f"{task}'s loss '{name}' is a statistic of the whole batch, and a batch of {per_batch} {task} row "
                    f"carries none (the loss would be constant and {task} would not train); use batches of at least "
                    f"2 {task} rows or another loss")
    return None


def _named_modules() -> str:
    named = list(ADDED)
    return f"the modules named ({', '.join(named)})" if named else "a module named in `modules:` (none is)"


def head_problem(heads: HeadsParams, task: str) -> str | None:
    """Why `task` cannot have its head or its loss (unknown, or not for its shape or kind), or None."""
    spec, head, loss = TASKS[task], heads.head_of(task), heads.loss_of(task)
    user = HEADS.get(head)
    shapes = PAIR_HEADS if spec.pair else SINGLE_HEADS
    views = ("cross", "bi") if spec.pair else ("single",)
    if user is None and head not in shapes:
        known = list(shapes) + [n for n, h in HEADS.items() if h.view in views]
        return (f"{task}'s head '{head}' is no {'pair' if spec.pair else 'one-text'} head{close(head, known)}: "
                f"neither built in nor registered by {_named_modules()} (heads: {', '.join(known)})")
    if user is not None and user.view not in views:
        return (f"{task}'s head '{head}' reads the {user.view} view, and {task} is "
                f"{'a pair' if spec.pair else 'one text'}")
    if head in SCALAR_HEADS and spec.outputs != 1:
        return f"{task}'s head '{head}' gives one number, and {task} has {spec.outputs} classes"
    if head == "prototypes" and spec.kind != "classification":
        return f"{task}'s head 'prototypes' compares with each class's sentences: a classification task's head"
    if loss not in LOSSES:
        return (f"{task}'s loss '{loss}' is no loss{close(loss, LOSSES)}: neither built in nor registered by "
                f"{_named_modules()} (losses: {', '.join(LOSSES)})")
    if spec.kind not in LOSSES[loss].kinds:
        return f"{task}'s loss '{loss}' trains {' or '.join(LOSSES[loss].kinds)} tasks, and {task} is {spec.kind}"
    bi = head in BI_ENCODER_HEADS or (user is not None and user.view == "bi")
    if LOSSES[loss].reads == "pairs" and not bi:
        return (f"{task}'s loss '{loss}' ranks the pair's sentence embeddings: give {task} a bi-encoder head "
                f"({', '.join(BI_ENCODER_HEADS)})")
    return None


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
    para: str = Field("cross", description="the paraphrase pair head, one of the kinds below (or one a module of yours "
                                           "registers)")
    sts: str = Field("cross", description="the similarity pair head, one of the kinds below (or one a module of yours "
                                          "registers)")
    sst: str = Field(
        "classifier", description="`classifier` (an MLP on the sentence vector) or `prototypes` (003's SST_TO_STS: "
                                  "the cosines of the sentence to `prototypes_per_label` training sentences of "
                                  "each label, with their labels, through a linear layer; the prototypes are "
                                  "embedded once, so the encoder must be frozen while this head trains)")
    prototypes_per_label: int = Field(100, ge=1, le=1000, description="`sst: prototypes`: training sentences per "
                                                                      "label it compares with (1-1000)")
    sts_loss: Literal["mse", "pearson", "mse+pearson"] = Field(
        "mse", description="`mse`, `pearson` (1 - Pearson r over the batch) or `mse+pearson` (their sum)")
    losses: dict[TaskName, str] = Field(
        {}, description="a task's loss by name, e.g. `{para: ranking}`: cross_entropy, bce, mse, pearson, mse+pearson, "
                        "ranking (in-batch negatives for pairs: sentence-transformers' MultipleNegativesRankingLoss) "
                        "or one a module of yours registers (docs/extending.md); unnamed tasks: their declared loss "
                        "(sts: `sts_loss`)")
    task_heads: dict[TaskName, str] = Field(
        {}, description="the head of a task other than sst, para and sts (theirs are the keys above), e.g. "
                        "`{cfimdb: classifier}`: a kind above or one a module of yours registers; unnamed: the "
                        "task's declared head")
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
    hybrid: list[TaskName] = Field(
        [], description="pair tasks (`para`, `sts`, each once; the head must be a bi-encoder kind) that also get "
                        "a cross-encoder term: the encoder reads each sentence alone and the pair as `[CLS] a "
                        "[SEP] b [SEP]` (3 rows per pair in one batch; padding costs only attention), and the "
                        "output is the bi-encoder head's plus a linear map of the cross-encoded pooled vector. One "
                        "model with both views of the pair; with all-MiniLM-L6-v2 on the CS224N data it trained at "
                        "half the bi-encoder's speed and scored below both the cross-encoder and the bi-encoder "
                        "models (docs/results.md)")

    @model_validator(mode="after")
    def _known_heads(self):
        for task in NAMED_HEADS:
            head = getattr(self, task)
            kinds = PAIR_HEADS if TASKS[task].pair else SINGLE_HEADS
            if head not in kinds and head not in HEADS:
                shape = "pair" if TASKS[task].pair else "one-text"
                raise refuse(task, f"'{head}' is no {shape} head{close(head, kinds)}: one of {', '.join(kinds)}, or "
                                   f"one a module of yours registers")
        return self

    @model_validator(mode="after")
    def _hybrid_needs_bi_head(self):
        for task in self.hybrid:
            if self.head_of(task) not in BI_ENCODER_HEADS:
                bi_heads = ", ".join(BI_ENCODER_HEADS)
                head = "already `cross`" if self.head_of(task) == "cross" else f"'{self.head_of(task)}'"
                raise ValueError(f"hybrid lists {task}, whose head is {head}: give {task} a bi-encoder head "
                                 f"({bi_heads})")
        if len(set(self.hybrid)) != len(self.hybrid):
            raise ValueError("hybrid lists a task twice")
        paired = [t for t in self.extra_layers if TASKS[t].pair]
        if paired:
            raise ValueError(f"extra_layers lists {paired[0]}: extra transformer layers are for one-sentence tasks "
                             f"({', '.join(t for t, spec in TASKS.items() if not spec.pair)})")
        named = [t for t in self.task_heads if t in NAMED_HEADS]
        if named:
            raise ValueError(f"task_heads names {named[0]}, whose head is the key `{named[0]}`; set that instead")
        if "sts" in self.losses and self.sts_loss != "mse" and self.losses["sts"] != self.sts_loss:
            raise ValueError(f"sts's loss is given twice (sts_loss '{self.sts_loss}', losses.sts "
                             f"'{self.losses['sts']}'); give one")
        return self

    def head_of(self, task: str) -> str:
        """The name of `task`'s head: its own key (sst, para, sts), `task_heads`, or its declared head."""
        if task in self.task_heads:
            return self.task_heads[task]
        return getattr(self, task) if task in NAMED_HEADS else TASKS[task].head

    def loss_of(self, task: str) -> str:
        """The name of `task`'s loss: `losses`, sts's `sts_loss`, or its declared loss."""
        if task in self.losses:
            return self.losses[task]
        return self.sts_loss if task == "sts" else TASKS[task].loss

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
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the run's updates (all epochs, all phases "
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
    dev_size: int | None = Field(None, ge=1, description="dev evaluations during training read a seeded subset of "
                                                          "at most this many rows of each task's dev split (the same "
                                                          "rows every time), which picks the model kept and draws "
                                                          "the dev curve at a fraction of a full pass; predict still "
                                                          "scores every dev row. null: the whole dev split")
    early_stopping: EarlyStopping | None = Field(
        None, description="`{patience, min_delta}`: stop when the dev selection score has not improved for `patience` "
                          "evaluations (the model kept is still the best evaluated; the lr schedule stays the one "
                          "planned for every epoch); null: train every epoch")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=64, description="split each task's batch of an update into this many micro-batches whose "
                                    "gradients add up before the one optimiser step: the update of `batch_size` "
                                    "(the same examples; in float32 without dropout the same numbers up to float "
                                    "rounding, with dropout or in bf16 an equally valid run with other numbers) in "
                                    "about 1/N of the activation memory, at the cost of N smaller passes. Not with "
                                    "PCGrad, SMART or a correlation STS loss, which need the whole batch at once")
    tracking: list[Literal["dvclive", "tensorboard"]] = Field(
        [], description="experiment trackers the run also logs to, offline: `dvclive` (DVC's: `dvc exp show` and "
                        "`dvc plots` read it) and `tensorboard`; each gets every history row and, between "
                        "evaluations, each update's lr and training losses, in the run's state folder while it runs "
                        "and beside model.pt when it has finished (docs/finetuning.md, Tracking)")
    max_steps_per_epoch: int | None = Field(None, ge=1, description="cut every epoch to at most this many updates "
                                                                    "(demo, tests, quick runs); the lr schedule is "
                                                                    "built on the cut epochs")
    checkpoint_every: int = Field(1, ge=1, description="epochs between resumable states (`last.pt`: model, "
                                                       "optimiser, SMART's momentum copy, RNGs; 1.3-1.8 GB on "
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

    @model_validator(mode="after")
    def _only_trained_tasks(self):
        """The settings that name tasks name trained ones."""
        untrained = [t for t in self.task_weights if t not in self.tasks]
        if untrained:
            raise refuse(f"task_weights.{untrained[0]}", f"task '{untrained[0]}' is not trained in this experiment")
        named = {"smart.tasks": (self.smart.tasks or []) if self.smart.enabled else [],
                 "walk_through": self.walk_through, "distill.tasks": (self.distill.tasks or []) if self.distill else []}
        for key, tasks in named.items():
            untrained = [t for t in tasks if t not in self.tasks]
            if untrained:
                hint = "; distil only tasks it trains" if key == "distill.tasks" else ""
                raise refuse(key, f"'{untrained[0]}' is not trained by this experiment (finetune.tasks: "
                                  f"{self.tasks}){hint}")
        unit = self.epoch_unit
        if unit not in ("smallest", "largest") and unit not in self.tasks:
            raise refuse("epoch_unit", f"'{unit}' is not smallest, largest or one of the experiment's tasks")
        return self

    @model_validator(mode="after")
    def _runs_together(self):
        """Settings that validate one by one but cannot run together in one fine-tuning."""
        for task in self.tasks:
            problem = head_problem(self.heads, task)
            if problem:
                raise refuse("heads", problem)
        batch = batch_statistic_problem(self.heads, self.tasks, self.batch_size, self.downsample)
        if batch:
            raise refuse(*batch)
        if self.pcgrad and len(self.tasks) < 2:
            raise refuse("pcgrad", f"PCGrad needs at least two tasks (got {self.tasks})")
        if self.pcgrad and self.schedule not in MULTI_TASK_UPDATES:
            raise refuse("pcgrad", f"PCGrad projects the gradients of the tasks of one update, and under schedule "
                                   f"'{self.schedule}' every update trains one task, so it would do nothing; use "
                                   f"schedule: simultaneous")
        if self.frozen_encoder_dropout and not self.freeze_encoder:
            raise refuse("frozen_encoder_dropout", "applies to a frozen encoder only and would do nothing here; drop "
                                                   "it or set finetune.freeze_encoder: true")
        if any(self.heads.head_of(t) == "prototypes" for t in self.tasks) and not self.freeze_encoder:
            raise refuse("heads.sst", "a prototypes head compares sentences with prototypes embedded once, so it "
                                      "trains over a frozen encoder: train sst in retrain_heads (retrain_heads.tasks: "
                                      "[sst]) or set finetune.freeze_encoder")
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
