"""What every section of the params schema is built from: `Strict` (the model each section derives
from: an unknown key, a number given as true/false or a NaN is refused), `refuse` (a model
validator's error about one key), names and seeds, the learning-rate schedules, and `Downsample`
(how every training section cuts its data)."""
from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from minbert.core.errors import MinBertError
from minbert.core.tasks import TASKS
from minbert.params.messages import close

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX = 100                                  # names become file names (and Slurm job names)
SEED_MAX = 2**32 - 1                            # what every RNG in the pipeline accepts
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
# Bounds on the counts that set how much work a run plans: far above any real run, so a typo (1e9
# epochs) is one line at load instead of a plan, a schedule or an estimate that never ends.
MAX_EPOCHS = 100_000
MAX_STEPS = 10_000_000                          # updates of an epoch (`max_steps_per_epoch`)
MAX_BATCH = 1 << 20                             # rows of a batch


def known_task(name: str) -> str:
    """A task of the registry: a built-in one or one the params declare (`tasks:`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'{close(name, TASKS)}; the tasks are {', '.join(TASKS)} (declare "
                         f"another under `tasks`, docs/extending.md)")
    return name


TaskName = Annotated[str, AfterValidator(known_task)]     # a task of the registry, when the params are read
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


def refuse(key: str, message: str) -> ValidationError:
    """An error for a model validator to raise about one of its model's keys (dotted: `smart.tasks`),
    so that the one-line message names that key and not only the section it belongs to."""
    return ValidationError.from_exception_data("params", [InitErrorDetails(
        type=PydanticCustomError("value_error", message), loc=tuple(key.split(".")), input=None)])


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


def check_name(name, where: str, what: str) -> None:
    """A name that becomes a file name (an experiment's, a grid cell's, a seed's, an ensemble's):
    a one-line error when it has other characters or is too long."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MinBertError(f"{where}: {what} name {name!r} must be letters, digits, '_', '-', '.' "
                           f"(starting with a letter or digit)")
    if len(name) > NAME_MAX:
        raise MinBertError(f"{where}: {what} name '{name[:40]}...' has {len(name)} characters; names become file "
                           f"names, keep them to {NAME_MAX}")
