"""The heads section of the params schema: each task's head and loss, chosen by name, and what the
heads share.

A task's head is `heads.<task>` and its loss `heads.losses.<task>`, for a built-in task as for a
declared one (no task has keys of its own); a task not named takes its declared head and loss. Every
check reads the declarations of the registry in use (minbert.core.registry: the built-in heads and
losses and those of the params' `modules`), never a head's or a loss's name.
"""
from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from minbert.core.errors import close
from minbert.core.registry import active, builtin
from minbert.core.settings import HeadChoices, batch_statistic_tasks
from minbert.core.tasks import DEFAULT_HEAD, DEFAULT_LOSS, PAIR_TASKS, TASKS
from minbert.params.fields import Downsample, Strict, TaskName, refuse

Pooling = Literal["cls", "mean", "pooler"]
# keys an earlier version read in the heads section -> what a task's head or loss is written as now
MOVED = {"sts_loss": lambda value: f"a task's loss is `heads.losses.<task>`: write `losses: {{sts: {value}}}`",
         "task_heads": lambda value: "a task's head is `heads.<task>`, for every task: write "
                                     + (", ".join(f"`{t}: {h}`" for t, h in value.items())
                                        if isinstance(value, dict) and value else "`<task>: <head>`")}


def either(names, quote: str = "`") -> str:
    """`a`, `b` or `c`."""
    names = [f"{quote}{n}{quote}" for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def builtin_heads(*views: str) -> list[str]:
    """The built-in heads (of `views`), by name, as the registry has them: no list typed here."""
    return [n for n, h in builtin().heads.items() if not views or h.view in views]


# what a task without a head or loss of its own gets, and the built-in names, for the help texts
DECLARED_HEAD = f"`{DEFAULT_HEAD[False]}` for one text, `{DEFAULT_HEAD[True]}` for a pair"
DECLARED_LOSS = f"{either(DEFAULT_LOSS.values(), '')} by its kind"
BUILTIN_LOSSES = ", ".join(builtin().losses)


def _modules_named() -> str:
    named = active().modules
    return f"the modules named ({', '.join(named)})" if named else "a module named in `modules:` (none is)"


def _views(task: str) -> tuple[str, ...]:
    return ("cross", "bi") if TASKS[task].pair else ("single",)


def head_name_problem(task: str, head: str) -> str | None:
    """Why `head` is no head for `task` (unknown, or of another view, width or kind), or None."""
    spec, registry = TASKS[task], active()
    decl, views = registry.heads.get(head), _views(task)
    shape = "pair" if spec.pair else "one-text"
    if decl is None:
        known = [n for n, h in registry.heads.items() if h.view in views]
        return (f"{task}'s head '{head}' is no {shape} head{close(head, known)}: neither built in nor registered by "
                f"{_modules_named()} (heads: {', '.join(known)})")
    if decl.view not in views:
        return f"{task}'s head '{head}' reads the {decl.view} view, and {task} is {'a pair' if spec.pair else 'one text'}"
    if decl.outputs == "one" and spec.outputs != 1:
        return f"{task}'s head '{head}' gives one number, and {task} has {spec.outputs} classes"
    if spec.kind not in decl.kinds:
        return f"{task}'s head '{head}' is a head of {' or '.join(decl.kinds)} tasks, and {task} is {spec.kind}"
    return None


def loss_name_problem(task: str, loss: str) -> str | None:
    """Why `loss` is no loss for `task` (unknown, or for another kind), or None."""
    spec, losses = TASKS[task], active().losses
    if loss not in losses:
        return (f"{task}'s loss '{loss}' is no loss{close(loss, losses)}: neither built in nor registered by "
                f"{_modules_named()} (losses: {', '.join(losses)})")
    if spec.kind not in losses[loss].kinds:
        return f"{task}'s loss '{loss}' trains {' or '.join(losses[loss].kinds)} tasks, and {task} is {spec.kind}"
    return None


def head_problem(heads: HeadsParams, task: str) -> str | None:
    """Why `task` cannot have its head or its loss (unknown, not for its shape or kind, or a loss
    that reads what its head does not give), or None."""
    head, loss = heads.head_of(task), heads.loss_of(task)
    problem = head_name_problem(task, head) or loss_name_problem(task, loss)
    if problem:
        return problem
    registry = active()
    if registry.losses[loss].reads == "pairs" and registry.heads[head].view != "bi":
        bi = [n for n, h in registry.heads.items() if h.view == "bi"]
        return (f"{task}'s loss '{loss}' ranks the pair's sentence embeddings: give {task} a bi-encoder head "
                f"({', '.join(bi)})")
    return None


def batch_statistic_problem(heads: HeadsParams, tasks, batch_size: int, downsample: Downsample
                            ) -> tuple[str, str] | None:
    """A loss that is a statistic of the whole batch over batches of one row: the statistic of one
    row is undefined or constant, so the task never learns from it (nothing else would say so). (the
    key at fault: `batch_size` or `downsample`, the message), or None."""
    for task, name in batch_statistic_tasks(heads, tasks):
        rows = [n for n in (downsample.size if downsample.mode == "fixed" else None, downsample.caps.get(task))
                if n is not None]
        per_batch = min([batch_size, *rows])
        if per_batch < 2:
            return ("batch_size" if per_batch == batch_size else "downsample",
                    f"{task}'s loss '{name}' is a statistic of the whole batch, and a batch of {per_batch} {task} row "
                    f"carries none (the loss would be constant and {task} would not train); use batches of at least "
                    f"2 {task} rows or another loss")
    return None


WIDTH = re.compile(r"^encoder(/[1-9][0-9]?)?$")     # the encoder's width, or an Nth of it


class SharedParams(Strict):
    """Dense layers shared by some tasks between the encoder and their heads (000: all tasks,
    768 -> 384, leaky ReLU; 003: Para and STS, two ReLU layers)."""
    tasks: list[TaskName] = Field(list(PAIR_TASKS), description="the tasks whose heads read the shared layers, "
                                                                "each once")
    sizes: list[Annotated[int, Field(ge=1, le=1 << 16)] | str] = Field(
        [], description="the layers' widths, each a number of units, `encoder` (the encoder's width) or `encoder/N` "
                        "(an Nth of it, as 000's 768 -> 384 is `encoder/2`), so a catalogue's heads fit any model; "
                        "`[]`: one layer of the encoder's width")
    activation: Literal["leaky_relu", "relu", "gelu", "tanh"] = Field(
        "leaky_relu", description="each layer is Linear, this activation, dropout")

    @field_validator("tasks")
    @classmethod
    def _some_tasks(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("needs at least one task, each once")
        return v

    @field_validator("sizes")
    @classmethod
    def _widths(cls, v):
        for size in v:
            if isinstance(size, bool) or (isinstance(size, int) and size < 1) or \
                    (isinstance(size, str) and not WIDTH.match(size)):
                raise ValueError(f"{size!r} is not a width: give a number of units (1 or more), 'encoder' or "
                                 f"'encoder/N' (N from 1 to 99)")
        return v


Depth = Annotated[int, Field(ge=0, le=4)]


class HeadsParams(Strict, HeadChoices):
    """The heads on the encoder and their losses (docs/finetuning.md, Heads and losses). Beside the
    keys below, each task's head by its name: `sts: cosine`, `snli: concat`."""
    model_config = ConfigDict(**{**Strict.model_config, "extra": "allow"})
    __pydantic_extra__: dict[str, str] = Field(init=False)
    # the docs' row for the keys that are task names (minbert.params.docs)
    extra_key: ClassVar[tuple[str, str, str]] = (
        "<task>", "its declared head", f"the task's head, by name, e.g. `sts: cosine`, `cfimdb: classifier`: "
                                       f"{either(builtin_heads('single'))} for one text, {either(builtin_heads('cross'))} "
                                       f"or a bi-encoder kind below for a pair, or one a module of yours registers "
                                       f"(docs/extending.md); a task not named: its declared head ({DECLARED_HEAD})")

    pooling: Pooling = Field("cls", description="sentence vector: `cls` (final [CLS] state), `mean` (mean over "
                                                "non-padding tokens) or `pooler` (BERT's tanh pooler on [CLS])")
    task_pooling: dict[TaskName, Pooling] = Field({}, description="another pooling for some tasks, e.g. `{sts: mean}` "
                                                                  "(004: STS mean-pooled)")
    prototypes_per_label: int = Field(100, ge=1, le=1000, description="a `prototypes` head (003's SST_TO_STS: the "
                                                                      "cosines of the sentence to this many training "
                                                                      "sentences of each label, with their labels, "
                                                                      "through a linear layer; the prototypes are "
                                                                      "embedded once, so the encoder must be frozen "
                                                                      "while it trains): sentences per label (1-1000)")
    losses: dict[TaskName, str] = Field(
        {}, description=f"a task's loss by name, e.g. `{{sts: pearson, para: ranking}}`: a built-in one "
                        f"({BUILTIN_LOSSES}; each below) or one a module of yours registers (docs/extending.md); a task "
                        f"not named: its declared loss ({DECLARED_LOSS})")
    cosine_target: Literal["0_1", "-1_1"] = Field(
        "0_1", description="how a regression task's labels are scaled for a `cosine` head: [0, 1] or `-1_1` for "
                           "[-1, 1] (every other head, `cosine_linear` included: [0, 1])")
    cosine_affine: bool = Field(
        True, description="`cosine` and `cosine_linear` heads learn a scale `a` and shift `b` of the cosine (a binary "
                          "task starts at `a = 10, b = -7.5`, so a cosine of 0.75 is p 0.5; a score at 1 and 0); "
                          "false: the plain cosine (`a = 1, b = 0`, fixed; a binary logit is then the cosine itself)")
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

    @model_validator(mode="before")
    @classmethod
    def _task_keys(cls, data):
        """Keys beside the settings are tasks' heads: a known task's, by a head's name."""
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            if key in MOVED:
                raise refuse(key, f"is no longer read; {MOVED[key](value)}")
            if key not in TASKS:
                raise refuse(key, f"unknown key{close(key, [*cls.model_fields, *TASKS])}: neither a heads setting nor "
                                  f"a task (a task's head is `heads.<task>`)")
            if not isinstance(value, str):
                raise refuse(key, f"a task's head is named by its name, e.g. `{key}: {TASKS[key].head}` "
                                  f"(got {value!r})")
        return data

    @model_validator(mode="after")
    def _named_heads_and_losses(self):
        """Each head and loss named is one for its task; one named as the task declares it is left
        out (the settings say only what differs from the declarations)."""
        for task, head in list(self.heads_named().items()):
            problem = head_name_problem(task, head)
            if problem:
                raise refuse(task, problem)
            if head == TASKS[task].head:
                del self.__pydantic_extra__[task]
        for task, loss in list(self.losses.items()):
            problem = loss_name_problem(task, loss)
            if problem:
                raise refuse(f"losses.{task}", problem)
        declared = {t: l for t, l in self.losses.items() if l != TASKS[t].loss}
        if declared != self.losses:
            self.__dict__["losses"] = declared
        return self

    @model_validator(mode="after")
    def _hybrid_needs_bi_head(self):
        heads = active().heads
        for task in self.hybrid:
            if heads[self.head_of(task)].view != "bi":
                bi_heads = ", ".join(n for n, h in heads.items() if h.view == "bi")
                raise ValueError(f"hybrid lists {task}, whose head '{self.head_of(task)}' is no bi-encoder head: give "
                                 f"{task} a bi-encoder head ({bi_heads})")
        if len(set(self.hybrid)) != len(self.hybrid):
            raise ValueError("hybrid lists a task twice")
        paired = [t for t in self.extra_layers if TASKS[t].pair]
        if paired:
            raise ValueError(f"extra_layers lists {paired[0]}: extra transformer layers are for one-sentence tasks "
                             f"({', '.join(t for t, spec in TASKS.items() if not spec.pair)})")
        return self

    def heads_named(self) -> dict[str, str]:
        """The tasks whose head these settings name (`heads.<task>`), and the heads."""
        return dict(self.__pydantic_extra__ or {})
