"""The fine-tuning sections of the params schema: SMART, distillation, the fine-tuning itself
(`FinetuneParams`, with what its settings must agree on) and head retraining; the heads and their
losses are minbert.params.heads. Every key's help text is its field's `description`
(minbert.params.docs generates the docs' key tables from them)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from minbert.core.registry import active
from minbert.core.tasks import DEFAULT_TASKS
from minbert.core.trackers import TRACKERS, installed, missing
from minbert.params.fields import LR_SCHEDULE, MAX_BATCH, MAX_EPOCHS, MAX_STEPS, Downsample, Strict, TaskName, refuse
from minbert.params.heads import HeadsParams, batch_statistic_problem, batch_statistic_tasks, head_problem
from minbert.params.plateau import UntilPlateau

# the multi-task schedules (minbert.train.schedules implements each)
SCHEDULES = ("round_robin", "drop_round_robin", "simultaneous", "task_by_task", "sequential",
             "proportional", "temperature")
MULTI_TASK_UPDATES = ("simultaneous",)          # the schedules whose updates sum several tasks' losses


class SmartParams(Strict):
    """SMART (docs/regularisers.md): a smoothness-inducing adversarial term on the word-embedding
    output and a Bregman proximal point term against a momentum copy of the model."""
    enabled: bool = Field(False, description="add both SMART terms to the training loss")
    lambda_s: float = Field(1.0, ge=0, description="weight of the smoothness-inducing adversarial term")
    mu: float = Field(1.0, ge=0, description="weight of the Bregman proximal point term")
    beta: float = Field(0.99, ge=0, lt=1, description="momentum of the slowly updated parameter copy")
    steps: int = Field(1, ge=1, le=100, description="adversarial ascent steps (normalised)")
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
    epochs: int = Field(3, ge=1, le=MAX_EPOCHS, description="training epochs (of each phase; with `until_plateau`, the "
                                                            "most it trains)")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="the global batch, also under `torchrun`")
    lr: float = Field(2e-5, gt=0, description="AdamW learning rate of the encoder")
    head_lr: float | None = Field(None, gt=0, description="AdamW learning rate of everything else (heads, shared "
                                                          "layers, extra layers); null: `lr`")
    weight_decay: float = Field(0.01, ge=0, description="AdamW; no decay on biases, LayerNorm weights and other "
                                                        "parameters of fewer than 2 dimensions")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of each phase's updates (all its epochs; a run "
                                                             "not `sequential` is one phase) with linear warm-up")
    lr_schedule: Literal["linear", "cosine", "constant"] = Field(
        "linear", description=LR_SCHEDULE + "; each phase of `sequential` runs the whole schedule on its own updates")
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
    until_plateau: UntilPlateau = Field(UntilPlateau(), description="train each phase until its dev curve settles, "
                                                                    "by the report's training check's rule, `epochs` "
                                                                    "being the cap (Until the plateau below)")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=64, description="split each task's batch of an update into this many micro-batches whose "
                                    "gradients add up before the one optimiser step: the update of `batch_size` "
                                    "(the same examples; in float32 without dropout the same numbers up to float "
                                    "rounding, with dropout or in bf16 an equally valid run with other numbers) in "
                                    "about 1/N of the activation memory, at the cost of N smaller passes. Not with "
                                    "PCGrad, SMART or a loss that is a statistic of the whole batch (`pearson`, "
                                    "`mse+pearson`, `ranking`, or one of yours that declares it), which need the "
                                    "whole batch at once")
    tracking: list[Literal[tuple(TRACKERS)]] = Field(
        [], description="experiment trackers the run also logs to, offline: `dvclive` (DVC's: `dvc exp show` and "
                        "`dvc plots` read it), `tensorboard` and `mlflow` (its local file store); each gets every "
                        "history row and, between evaluations, each update's lr and training losses, in the run's "
                        "state folder while it runs and beside model.pt when it has finished; a tracker whose package "
                        "is not installed is refused when the params load (docs/finetuning.md, Tracking)")
    max_steps_per_epoch: int | None = Field(None, ge=1, le=MAX_STEPS, description="cut every epoch to at most this many updates "
                                                                    "(demo, tests, quick runs); the lr schedule is "
                                                                    "built on the cut epochs")
    checkpoint_every: int = Field(1, ge=1, le=MAX_EPOCHS, description="epochs between resumable states (`last.pt`: model, "
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
        absent = next((tool for tool in v if not installed(tool)), None)
        if absent:
            raise ValueError(missing(absent).removeprefix("finetune.tracking "))
        return v

    @model_validator(mode="after")
    def _accumulation_splits_the_batch(self):
        k = self.gradient_accumulation_steps
        if k > 1:
            whole = [what for on, what in ((self.pcgrad, "PCGrad (`pcgrad`) projects whole per-task gradients"),
                                           (self.smart.enabled, "SMART perturbs the whole batch")) if on]
            whole += [f"{task}'s loss '{loss}' is a statistic of the whole batch, and each micro-batch would compute "
                      f"its own" for task, loss in batch_statistic_tasks(self.heads, self.tasks)]
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
        if self.until_plateau.enabled and self.early_stopping is not None:
            raise refuse("until_plateau", "stops each phase at its plateau, and early_stopping by another rule: "
                                          "set one of them (early_stopping: null)")
        if self.frozen_encoder_dropout and not self.freeze_encoder:
            raise refuse("frozen_encoder_dropout", "applies to a frozen encoder only and would do nothing here; drop "
                                                   "it or set finetune.freeze_encoder: true")
        frozen = [t for t in self.tasks if active().heads[self.heads.head_of(t)].frozen_encoder]
        if frozen and not self.freeze_encoder:
            task, head = frozen[0], self.heads.head_of(frozen[0])
            raise refuse(f"heads.{task}", f"{task}'s head '{head}' trains over a frozen encoder only (what it compares "
                                          f"with is embedded once): train {task} in retrain_heads (retrain_heads.tasks: "
                                          f"[{task}]) or set finetune.freeze_encoder")
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
    epochs: int = Field(2, ge=1, le=MAX_EPOCHS, description="training epochs of the heads")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="the global batch")
    lr: float = Field(1e-3, gt=0, description="for the heads (the encoder is frozen)")
    downsample: Downsample = Field(Downsample(mode="none"), description="full data by default, as in the papers")
