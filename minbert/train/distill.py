"""Knowledge distillation: a teacher's outputs on the training data, and a student that learns from
them as well as from the gold labels.

- `teach`: the teacher (one experiment's model, or the mean of several: a repeated experiment's
  seeds or an ensemble's members) predicts every row of the training splits of the distilled tasks:
  class probabilities for sst and para (their mean over the models: soft targets need
  probabilities, whatever rule the ensemble uses for its own predictions), a score for sts (mean or
  median, as the ensemble says). It writes results/teachers/<T>/<task>-train.csv (id and outputs).
- `attach_teacher`: the student's training rows get their teacher outputs (by id).
- the loss (minbert.train.losses.distill_loss): (1 - weight) x gold-label loss + weight x loss against the
  teacher; softened by a temperature for the classification tasks (Hinton et al., 2015).
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, read_input
from minbert.core.runtime import start_runtime
from minbert.core.settings import Distill, TeachSettings, in_own_registry
from minbert.core.tasks import TASKS
from minbert.data.batches import TaskData, load_task_data
from minbert.model.checkpoint import load_checkpoint
from minbert.model.multitask import predict_task

BATCH_SIZE = 128        # fixed: the outputs are a student's training data, not to change with a speed setting


def teacher_columns(task: str) -> list[str]:
    """What a teacher file holds per row besides its id: probabilities, or a score."""
    return TASKS[task].prob_columns or ["score"]


@in_own_registry
def teach(s: TeachSettings, models: dict[str, str], data_dir, out_dir, records: dict[str, str] | None = None
          ) -> dict[str, int]:
    """Write the teacher's outputs on the training splits of `s.predicts`; `models` maps each member
    to its model file, `records` to the run record of the stage that wrote it (each model must be
    that run's). Returns the rows written per task."""
    runtime = start_runtime(s)
    per_task: dict[str, list[np.ndarray]] = {t: [] for t in s.predicts}
    ids: dict[str, list[str]] = {}
    for member in s.members:
        expect = {"experiment": member, "stage": s.members[member], "record_path": (records or {}).get(member)}
        model, tokenizer, _ = load_checkpoint(models[member], expect=expect, trust_remote_code=True)   # the params' own
        model.to(runtime.device)
        data = load_task_data(data_dir, s.predicts, model.heads_cfg, tokenizer, splits=("train",))["train"]
        for task in s.predicts:
            td = data[task]
            res = predict_task(model, td, tokenizer, BATCH_SIZE, runtime.device, runtime.amp)
            out = res["probs"] if s.registry.tasks[task].prob_columns else res["prediction"]
            per_task[task].append(np.asarray(out, dtype=np.float64).reshape(len(td), -1))
            if ids.setdefault(task, td.ids) != td.ids:
                raise MinBertError(f"{data_dir}: the {task} training rows differ between the teacher's models")
        del model
    written = {}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        for task, outs in per_task.items():
            stack = np.stack(outs)                              # (models, rows, columns)
            median = s.registry.tasks[task].kind == "regression" and s.similarity == "median"
            combined = np.median(stack, 0) if median else stack.mean(0)
            frame = pd.DataFrame(combined, columns=teacher_columns(task))
            frame.insert(0, "id", ids[task])
            frame.to_csv(tmp / f"{task}-train.csv", index=False, float_format="%.8g")
            written[task] = len(frame)
    return written


def read_teacher(teacher_dir, task: str) -> pd.DataFrame:
    path = Path(teacher_dir) / f"{task}-train.csv"
    data = read_input(path, "teacher file")
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype={"id": str}, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise MinBertError(f"{path}: not a teacher file ({str(e).splitlines()[0]}); re-run its teach stage") from None
    columns = teacher_columns(task)
    if list(frame.columns) != ["id", *columns]:
        raise MinBertError(f"{path}: columns {list(frame.columns)}, expected {['id', *columns]}; re-run its teach stage")
    values = frame[columns].apply(pd.to_numeric, errors="coerce")
    if not np.isfinite(values.to_numpy(dtype=float)).all():
        raise MinBertError(f"{path}: a teacher output is not a finite number; re-run its teach stage")
    frame[columns] = values
    return frame


def attach_teacher(train: dict[str, TaskData], teacher_dir, d: Distill, tasks: list[str]) -> None:
    """Give each distilled task's training rows their teacher outputs (`TaskData.soft`, by id)."""
    for task in tasks:
        if task not in train:
            continue
        frame = read_teacher(teacher_dir, task).set_index("id")
        missing = [i for i in train[task].ids if i not in frame.index]
        if missing:
            raise MinBertError(f"{teacher_dir}/{task}-train.csv: no teacher output for training id '{missing[0]}'; "
                               f"re-run the teach stage on the same prepared data")
        values = frame.loc[train[task].ids, teacher_columns(task)].to_numpy(dtype=np.float32)
        train[task].soft = values if values.shape[1] > 1 else values[:, 0]


def distilled_tasks(d: Distill, trained: list[str], teacher_dir) -> list[str]:
    """The student's tasks it distils: those named (default: every trained task the teacher wrote)."""
    if d.tasks is not None:
        return [t for t in trained if t in d.tasks]
    return [t for t in trained if (Path(teacher_dir) / f"{t}-train.csv").exists()]
