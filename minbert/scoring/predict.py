"""A trained model's predictions on the dev and test splits, one CSV per task and split."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path
from minbert.core.runtime import start_runtime
from minbert.core.settings import PredictSettings, in_own_registry
from minbert.core.tasks import Task
from minbert.data.batches import load_task_data
from minbert.model.checkpoint import load_checkpoint
from minbert.model.multitask import predict_task


def prediction_frame(spec: Task, data, result: dict) -> pd.DataFrame:
    """The predictions CSV of one task (`spec`, its declaration) and split (docs/pipeline.md)."""
    frame = data.frame
    out = pd.DataFrame({"id": frame["id"].astype(str).to_numpy()})
    for c in spec.text_columns:
        out[c] = frame[c].to_numpy()
    out["label"] = frame["label"].to_numpy() if "label" in frame.columns else np.nan
    out["prediction"] = result["prediction"]
    probs = np.asarray(result.get("probs", np.empty((len(out), 0))))
    for k, col in enumerate(spec.prob_columns):
        out[col] = probs[:, k] if probs.ndim == 2 else probs
    return out


@in_own_registry
def predict_experiment(s: PredictSettings, checkpoint: str | Path, data_dir, out_dir, *, cache_dir=None,
                       expect: dict | None = None, seconds: dict | None = None) -> dict:
    """Write <task>-<split>.csv for every trained task and each of its splits among `s.splits` (dev, and
    test unless the experiment's `predict_test` is off); returns the rows written per file. `expect`:
    the experiment, stage and run record the checkpoint must come from (minbert.model.checkpoint.check_origin).
    `seconds`: filled with where the time went (`load` the model, `data` read and tokenised, `predict`
    the forward passes, `write` the files), for the run record and bench/gpu_pipeline.py."""
    seconds = {} if seconds is None else seconds
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = round(seconds.get(name, 0.0) + now - clock, 3)
        clock = now
    runtime = start_runtime(s)
    model, tokenizer, _ = load_checkpoint(checkpoint, expect=expect, trust_remote_code=True)   # the params' own model
    model.to(runtime.device)
    lap("load")
    data = load_task_data(data_dir, model.tasks, model.heads_cfg, tokenizer, splits=tuple(s.splits), cache_dir=cache_dir)
    lap("data")
    written = {}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        for split, tasks in data.items():
            for task, td in tasks.items():
                res = predict_task(model, td, tokenizer, s.batch_size, runtime.device, runtime.amp)
                lap("predict")
                frame = prediction_frame(model.registry.tasks[task], td, res)
                frame.to_csv(tmp / f"{task}-{split}.csv", index=False, float_format="%.6g")
                written[f"{task}-{split}"] = len(frame)
                lap("write")
        if not written:
            raise MinBertError(f"{data_dir}: no dev or test split for the tasks {model.tasks}; run the prepare stage")
    return written
