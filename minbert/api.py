"""A trained model on new text: load it once, then ask it about sentences and sentence pairs.

    from minbert.api import load_model
    m = load_model("results/experiments/cross_encoder")     # or its model.pt, or an export folder
    m.sentiment(["A gripping, funny film."])                 # DataFrame: prediction, class, prob_0..prob_4
    m.paraphrase([("How do I learn Python?", "What is the best way to learn Python?")])   # prediction, class, prob_1
    m.similarity([("A man plays a guitar.", "A man is playing music.")])                 # prediction (0-5)
    m.predict("snli", [("A man plays.", "A person plays.")])   # any task of the model, a task of yours too

Every method returns a pandas DataFrame with one row per input, in the input's order (`embed`: a
numpy array); the columns are said in each method's docstring and in docs/sharing.md. An empty input
gives an empty frame; bad input is refused as `minbert predict` refuses it, with the same one-line
message (minbert.scoring.inputs), naming the task and the row.

The predictions go through the pipeline's own code (minbert.model.multitask: the checkpoint loader,
tokenisation by the task's view, `predict_task`), so they equal the predict stage's on the same rows.
`minbert predict` (minbert.cli) is the command-line form.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.core.devices import PRECISIONS
from minbert.core.errors import MinBertError
from minbert.core.layout import MODEL_FILE, TRAINING_STAGES, Layout
from minbert.scoring.inputs import MAX_TEXT_CHARS, SINGLE, Origin, check_texts, tasks_for, text_columns  # noqa: F401

EXPORT_MANIFEST = "minbert.json"     # what marks an export folder (minbert.share.export)
CHUNK_BATCHES = 32                   # an input of more batches than this shows a progress bar


# ---------------------------------------------------------------- finding the model

def experiment_folder(path: str | Path) -> Path | None:
    """The experiment folder a model path belongs to: the folder itself, or the one that holds a
    model.pt in a training stage's folder; None for a lone model.pt or an export folder."""
    p = Path(path)
    if p.is_file():
        return p.parent.parent if p.parent.name in TRAINING_STAGES else None
    return None if (p / EXPORT_MANIFEST).is_file() else p


def _predict_record(path: str | Path) -> Path | None:
    folder = experiment_folder(path)
    # an experiment folder sits in <results>/experiments/, its predict record in <results>/runs/
    return None if folder is None else Path(Layout(str(folder.parent.parent)).run_record("predict", folder.name))


def model_sources(path: str | Path) -> tuple[list[Path], list[Path]]:
    """What loading the model at `path` reads, as (files, folders): an experiment's or an export's
    folder, or a lone model.pt, and the predict run record it takes its settings from. A command
    writes nothing there (minbert.core.outputs.refuse_over_inputs)."""
    p = Path(path)
    folder = experiment_folder(p)
    folders = [folder] if folder is not None else [p] if p.is_dir() else []
    record = _predict_record(p)
    return ([p] if not p.is_dir() else []) + ([record] if record is not None else []), folders


def predict_settings(path: str | Path) -> dict:
    """The settings the predict stage ran with for the experiment `path` is (its folder, or a model.pt
    in it), from its run record: which model, the batch size, the precision setting; {} when there is
    none (an export folder, a model.pt elsewhere)."""
    record = _predict_record(path)
    if record is None:
        return {}
    try:
        settings = json.loads(record.read_text(encoding="utf-8"))["description"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def model_file(path: str | Path) -> Path:
    """The checkpoint an experiment folder predicts with: the model its predict job used (its run
    record says which training stage), else retrain_heads/model.pt when present, else finetune/model.pt."""
    folder = Path(path)
    candidates = [predict_settings(folder)["model_stage"]] if "model_stage" in predict_settings(folder) else []
    candidates += list(reversed(TRAINING_STAGES))
    for stage in candidates:
        if (folder / stage / MODEL_FILE).is_file():
            return folder / stage / MODEL_FILE
    raise MinBertError(f"{folder}: no trained model (finetune/model.pt) in this experiment folder; run its "
                       f"finetune stage first (snakemake --cores all {folder}/finetune/model.pt)")


def load_multitask(path: str | Path, trust_remote_code: bool = False):
    """(MultitaskModel, Tokenizer, where it came from) from an experiment folder, a model.pt or an
    export folder (minbert.share.export); a model that names modules of the user's (code it carries,
    a path, an importable name) loads only with `trust_remote_code` (minbert.model.checkpoint); a
    one-line error for anything else."""
    from minbert.model.checkpoint import load_checkpoint, model_from_checkpoint

    p = Path(path)
    if p.is_dir() and (p / EXPORT_MANIFEST).is_file():
        from minbert.share.export import read_export

        model, tokenizer = model_from_checkpoint(read_export(p, trust_remote_code), str(p), trust_remote_code)
        return model, tokenizer, p
    if p.is_dir() and ((p / "finetune").is_dir() or (p / "retrain_heads").is_dir()):
        p = model_file(p)
    elif p.is_dir():
        raise MinBertError(f"{p}: not a trained model; give an experiment's folder (results/experiments/E), its "
                           f"model.pt, or an export folder (results/exports/E)")
    model, tokenizer, _ = load_checkpoint(p, trust_remote_code=trust_remote_code)
    return model, tokenizer, p


# ---------------------------------------------------------------- the model

class Model:
    """A trained multi-task model ready to predict (evaluation mode, on `device`).

    By default it predicts as the experiment's predict stage did (its run record): the same batch
    size and precision setting, so the same batches and numbers (`auto` is bf16 where bf16 is native,
    as for the stage); an export folder or a lone model.pt: batches of 64 and `auto`. `batch_size`,
    `precision` ("auto", "bf16", "fp16", "fp32") or `bf16=True` set them."""

    def __init__(self, path: str | Path, device: str = "auto", batch_size: int | None = None,
                 bf16: bool | None = None, threads: int | None = None, precision: str | None = None,
                 trust_remote_code: bool = False):
        from minbert.core.runtime import pick_device, precision_on, set_threads

        for key, value in (("batch_size", batch_size), ("threads", threads)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                      or value < 1):
                raise MinBertError(f"{key} {value!r}: expected a positive integer")
        if precision is not None and precision not in PRECISIONS:
            raise MinBertError(f"precision {precision!r}: expected {', '.join(PRECISIONS)}")
        self.device = pick_device(device)       # refused before the model is read
        set_threads(threads)
        self.model, self.tokenizer, self.source = load_multitask(path, trust_remote_code)
        self.model.to(self.device).eval()
        stage = predict_settings(path)
        precision = precision or ("bf16" if bf16 else "fp32" if bf16 is False else stage.get("precision", "auto"))
        self.precision = precision_on(precision, self.device)
        self.batch_size, self.bf16 = int(batch_size or stage.get("batch_size") or 64), self.precision == "bf16"

    @property
    def tasks(self) -> list[str]:
        return list(self.model.tasks)

    @property
    def registry(self):
        """The model's tasks, heads and losses (minbert.core.registry): the built-in ones and those of
        the user's it was trained with."""
        return self.model.registry

    def has(self, task: str) -> None:
        if task not in self.model.tasks:
            raise MinBertError(f"{self.source}: the model has no {task} head (its tasks: {', '.join(self.model.tasks)}); "
                               f"ask for one of those, or train an experiment with {task} in finetune.tasks")

    def predict(self, task: str, frame: pd.DataFrame, progress: bool | None = False) -> pd.DataFrame:
        """Predictions of any task of the model (a built-in one or one of yours) for `frame`'s rows: a
        pandas DataFrame with the task's text columns (`sentence`, or `sentence1` and `sentence2`; `id`
        optional), or a list of texts (a one-text task) or of (sentence1, sentence2) pairs. Returns a
        pandas DataFrame with one row per input row, in the input's order (index 0..n-1): `prediction`
        (int class for sst, 0/1 for para and cfimdb, float score clipped to the label range for sts and
        a regression task of yours), then for a classification or binary task
        `class` (the class name, str) and its probabilities as floats (`prob_0` .. `prob_4` for
        sst, `prob_1` for para and cfimdb), the predict stage's columns; no rows for no rows. The
        input is checked as `minbert predict` checks a file (minbert.scoring.inputs), with the same
        messages, rows numbered from 0. `progress`: a tqdm bar (None: only on inputs of more than 32
        batches)."""
        with self.registry.active():
            return self._predict(task, frame, progress)

    def _predict(self, task: str, frame, progress: bool | None) -> pd.DataFrame:
        import torch
        from tqdm.auto import tqdm

        from minbert.core.runtime import autocast
        from minbert.data.batches import build_task_data
        from minbert.model.multitask import predict_task
        from minbert.model.outputs import predictions

        self.has(task)
        spec = self.registry.tasks[task]
        if isinstance(frame, (str, list, tuple)):      # texts, or (sentence1, sentence2) pairs
            frame = _pairs(frame, task) if spec.pair else _single(frame, task)
        if not isinstance(frame, pd.DataFrame):
            raise MinBertError(f"{task}: expected a pandas DataFrame with the task's columns or a list of "
                               f"{'pairs' if spec.pair else 'texts'}, not {type(frame).__name__}")
        frame = frame.reset_index(drop=True)
        tasks_for(Origin(task), frame.columns, [task], {task: spec})
        check_texts(Origin(task), frame, text_columns([spec]))
        if frame.empty:            # no rows: the columns, with the dtypes rows would have
            outputs = torch.empty((0, len(spec.classes)) if spec.kind == "classification" else (0,))
            return _result_frame(spec, predictions(task, self.model.heads_cfg, outputs,
                                                   self.model.calibration.get(task), self.registry))
        if "id" not in frame.columns:
            frame = frame.assign(id=[str(i) for i in range(len(frame))])
        show = len(frame) > self.batch_size * CHUNK_BATCHES if progress is None else progress
        # the whole input at once, as the predict stage reads a split: the same length-sorted batches,
        # so the same padding and the same numbers (in bf16 too)
        data = build_task_data(task, frame, self.tokenizer, self.model.heads_cfg)
        with tqdm(total=len(frame), desc=task, unit="row", disable=not show, leave=False) as bar:
            res = predict_task(self.model, data, self.tokenizer, self.batch_size, self.device,
                               lambda: autocast(self.device, self.precision), progress=bar.update)
        return _result_frame(spec, res)

    # ------------------------------------------------------------ by task
    def sentiment(self, texts, task: str = "sst") -> pd.DataFrame:
        """Sentiment of each text (a str or a list of str): a pandas DataFrame, one row per text in
        order, with `prediction` (int, 0 very negative .. 4 very positive), `class` (str) and
        `prob_0` .. `prob_4` (float, summing to 1)."""
        return self.predict(task, _single(texts, task))

    def paraphrase(self, pairs, task: str = "para") -> pd.DataFrame:
        """Whether each pair (a list of (sentence1, sentence2) tuples) is a paraphrase: a pandas
        DataFrame, one row per pair in order, with `prediction` (int 0/1), `class` (str: "not
        paraphrase" / "paraphrase") and `prob_1` (float, the paraphrase probability)."""
        return self.predict(task, _pairs(pairs, task))

    def similarity(self, pairs, task: str = "sts") -> pd.DataFrame:
        """The similarity of each pair on the STS scale, clipped to 0-5 as every file the pipeline writes
        (minbert.model.outputs): a DataFrame with one row per pair and the column `prediction` (float)."""
        return self.predict(task, _pairs(pairs, task))

    def embed(self, texts) -> np.ndarray:
        """Sentence embeddings with the model's pooling, what its sentence-transformers export
        (minbert.share.export) gives: a float32 numpy array of shape (number of texts, hidden size)."""
        import torch

        from minbert.core.runtime import autocast
        from minbert.data.batches import to_device

        frame = _single(texts, "embed")
        check_texts(Origin("embed"), frame, SINGLE)
        texts = frame["sentence"].tolist()
        out = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = to_device(self.tokenizer([str(t) for t in texts[start:start + self.batch_size]]),
                                  self.device)
                with autocast(self.device, self.precision):
                    out.append(self.model.embed(batch).float().cpu())
        return torch.cat(out).numpy() if out else np.empty((0, self.model.encoder.config.hidden_size), np.float32)


def _single(texts, task: str) -> pd.DataFrame:
    """A text or a list of texts as a frame of the column `sentence`, the values as given (checked by
    `predict`: None, a number, a blank string is refused, never turned into text)."""
    if isinstance(texts, str):
        texts = [texts]
    try:
        texts = list(texts)
    except TypeError:
        raise MinBertError(f"{task}: expected a text or a list of texts, not {type(texts).__name__}") from None
    return pd.DataFrame({"sentence": pd.Series(texts, dtype=object)})


def _pairs(pairs, task: str) -> pd.DataFrame:
    """A list of (sentence1, sentence2) pairs as a frame of those columns, the values as given."""
    try:
        pairs = list(pairs)
    except TypeError:
        raise MinBertError(f"{task}: expected a list of (sentence1, sentence2) pairs, not "
                           f"{type(pairs).__name__}") from None
    for k, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            got = f"a {type(pair).__name__}" if not isinstance(pair, (tuple, list)) else f"{len(pair)} items"
            raise MinBertError(f"{task}: row {k}: expected a pair (sentence1, sentence2), got {got}; give sentence "
                               f"pairs as (sentence1, sentence2) tuples")
    return pd.DataFrame({"sentence1": pd.Series([a for a, _ in pairs], dtype=object),
                         "sentence2": pd.Series([b for _, b in pairs], dtype=object)})


def _result_frame(spec, res: dict) -> pd.DataFrame:
    """The predict stage's columns from a task's predictions: prediction, class, prob_k."""
    out = pd.DataFrame({"prediction": res["prediction"]})
    probs = np.asarray(res.get("probs", np.empty((len(out), 0))))
    for k, col in enumerate(spec.prob_columns):
        out[col] = probs[:, k] if probs.ndim == 2 else probs
    if spec.classes:
        out.insert(1, "class", pd.Series([spec.classes[int(k)] for k in out["prediction"]], dtype=object))
    return out


def load_model(path: str | Path, device: str = "auto", batch_size: int | None = None, bf16: bool | None = None,
               threads: int | None = None, precision: str | None = None, trust_remote_code: bool = False) -> Model:
    """Load a trained model once (an experiment folder, its model.pt, or an export folder); it
    predicts as the experiment's predict stage did unless told otherwise (`Model`). A model with a head
    or loss of the user's names the modules it comes from (an export carries their code:
    minbert.share.code): their code is checked against the model's record and runs only with
    `trust_remote_code=True`, as transformers asks; without it such a model is refused in one line."""
    return Model(path, device=device, batch_size=batch_size, bf16=bf16, threads=threads, precision=precision,
                 trust_remote_code=trust_remote_code)
