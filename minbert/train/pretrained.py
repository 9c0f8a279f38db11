"""A pretraining's files and outputs, whatever its kind: where it reads and writes
(`PretrainFiles`), and its three outputs written atomically: the model folder (Hugging Face
layout, tokenizer files included; for MLM also the MLM head), history.csv (epoch, update,
lr_budget, train_loss, dev_loss) and metrics.json. Masked-LM and NLI pretraining (minbert.train.pretrain) and
paraphrase-first (minbert.train.para_first) both end here."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from minbert.core.io import atomic_path, write_json
from minbert.model.weights import model_folder, save_hf_folder

HISTORY_COLUMNS = ["epoch", "update", "lr_budget", "train_loss", "dev_loss"]


@dataclass
class PretrainFiles:
    """Where one pretraining job reads and writes."""
    data: Path                  # the prepared data folder
    model: Path                 # the model folder it writes
    history: Path               # history.csv
    metrics: Path               # metrics.json
    state: Path | None = None   # its resumable state while it runs (default: <model>.state)
    cache: Path | None = None   # the token cache

    @property
    def state_dir(self) -> Path:
        return Path(self.state) if self.state is not None else Path(self.model).with_name(Path(self.model).name +
                                                                                         ".state")


def write_pretrained(files: PretrainFiles, start_model: str, encoder, history: list[dict], metrics: dict,
                     mlm_head: dict | None = None) -> dict:
    """The three outputs (each atomically), then the state folder goes; returns the metrics."""
    with atomic_path(files.model) as tmp:
        save_hf_folder(tmp, encoder, tokenizer_folder=model_folder(start_model), mlm_head=mlm_head)
    write_pretraining_history(files.history, history)
    write_json(files.metrics, metrics)
    shutil.rmtree(files.state_dir, ignore_errors=True)
    return metrics


def write_pretraining_history(path, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    for col in HISTORY_COLUMNS:
        if col not in frame.columns:
            frame[col] = pd.Series(dtype=float)
    with atomic_path(path) as tmp:
        frame[HISTORY_COLUMNS].to_csv(tmp, index=False)
