"""A trained multi-task model as a file (model.pt): a plain dict of tensors and settings, loaded
with `weights_only=True` (no pickle runs), checked, and rebuilt into a model and its tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch

from minbert.core.errors import MinBertError
from minbert.model.bert import BertConfig, BertModel
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer
from minbert.params.schema import HeadsParams

CHECKPOINT_FORMAT = "minbert-multitask-1"


def checkpoint_dict(model: MultitaskModel, tokenizer: Tokenizer, **extra) -> dict:
    """The model as a plain dict of tensors and settings (what model.pt holds)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "encoder_config": model.encoder.config.to_dict(),
        "heads": model.heads_cfg.model_dump(),
        "tasks": model.tasks,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "tokenizer_json": tokenizer.to_json(),
        "max_length": tokenizer.max_length,
        "calibration": dict(model.calibration),
        **extra,
    }


def save_checkpoint(path, model: MultitaskModel, tokenizer: Tokenizer, **extra) -> None:
    from minbert.core.io import torch_save

    torch_save(checkpoint_dict(model, tokenizer, **extra), path)


def read_checkpoint(path, map_location="cpu") -> dict:
    """A model.pt as its dict, checked: a one-line error for a missing, unreadable or foreign file."""
    path = Path(path)
    if path.is_dir():
        raise MinBertError(f"{path}: is a folder; expected a checkpoint file (re-run the stage that writes it)")
    if not path.is_file():
        raise MinBertError(f"{path}: checkpoint not found; run the stage that writes it first")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise MinBertError(f"{path}: not a readable checkpoint ({type(e).__name__}); re-run the stage "
                           f"that writes it") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise MinBertError(f"{path}: not a minbert multi-task checkpoint; re-run the stage that writes it")
    return ckpt


def model_from_checkpoint(ckpt: dict, source: str = "checkpoint") -> tuple[MultitaskModel, Tokenizer]:
    try:
        encoder = BertModel(BertConfig(**ckpt["encoder_config"]))
        model = MultitaskModel(encoder, HeadsParams(**ckpt["heads"]), ckpt["tasks"])
        model.load_state_dict(ckpt["state_dict"])
        model.calibration = {t: list(v) for t, v in (ckpt.get("calibration") or {}).items()}
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise MinBertError(f"{source}: the checkpoint does not describe a model this version can build "
                           f"({type(e).__name__}); re-run the stage that writes it") from None
    return model, Tokenizer.from_json(ckpt["tokenizer_json"], ckpt["max_length"], source)


def load_checkpoint(path, map_location="cpu") -> tuple[MultitaskModel, Tokenizer, dict]:
    """Load a model.pt written by `save_checkpoint`: (model, tokenizer, the checkpoint dict)."""
    ckpt = read_checkpoint(path, map_location)
    model, tokenizer = model_from_checkpoint(ckpt, str(path))
    return model, tokenizer, ckpt
