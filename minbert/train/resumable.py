"""A training run's resumable state, shared by fine-tuning (minbert.train.loop) and pretraining
(minbert.train.pretrain): one file, `last.pt` in the run's state folder, holding the loop's own
position (a plain dict: epoch, step, history, best so far), the weights of its modules, the
optimiser, and every random number generator the run draws from (Python's, NumPy's, torch's
CPU and CUDA ones, and the run's own torch.Generators), written under the job's fingerprint.

A run resumes only from a state saved under its own fingerprint (same settings, inputs, code,
device type and precision); a state saved for another one, or a file that cannot be read as a
state, is ignored with a one-line notice and the run starts fresh, so a resume is exact or does
not happen.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minbert.core.io import torch_save
from minbert.core.provenance import describe_change
from minbert.train.optim import AdamW

STATE_FORMAT = "minbert-train-state-3"


def rng_states(device: torch.device, generators: dict[str, torch.Generator]) -> dict:
    """Every RNG's state, in types torch.load(weights_only=True) reads back."""
    np_state = np.random.get_state(legacy=False)
    return {"python_rng": random.getstate(),
            "numpy_rng": {"bit_generator": np_state["bit_generator"],
                          "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                          "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                          "gauss": float(np_state["gauss"])},
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
            "generators": {k: g.get_state() for k, g in generators.items()}}


def restore_rngs(saved: dict, device: torch.device, generators: dict[str, torch.Generator]) -> None:
    """Put every RNG back where `rng_states` found it."""
    random.setstate(_tuples(saved["python_rng"]))
    n = saved["numpy_rng"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    for k, g in generators.items():
        g.set_state(saved["generators"][k])


def _tuples(obj):
    """random.setstate wants tuples where a round trip through a file may give lists."""
    return tuple(_tuples(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


@dataclass
class SavedParts:
    """What a resumable state holds beside the loop's position: the modules by name (None: absent
    in this run), the optimiser, and the RNGs of the device and of the run's generators."""
    modules: dict[str, torch.nn.Module | None]
    optimizer: AdamW
    device: torch.device
    generators: dict[str, torch.Generator]


def save_training_state(path: Path, *, fingerprint: str, description: dict, position: dict,
                        parts: SavedParts) -> None:
    """Write the state atomically (a kill while writing leaves the previous one)."""
    torch_save({"format": STATE_FORMAT, "fingerprint": fingerprint, "description": description,
                "state": position, "optimizer": parts.optimizer.state_dict(),
                **{name: m.state_dict() if m is not None else None for name, m in parts.modules.items()},
                **rng_states(parts.device, parts.generators)}, path)


def load_training_state(path: Path, *, fingerprint: str, description: dict, parts: SavedParts,
                        log: logging.Logger) -> dict | None:
    """Restore the modules, optimiser and RNGs from the state at `path` and return the loop's
    position, when the state belongs to this job; None otherwise (with a one-line notice on `log`
    when a file was there)."""
    if not path.is_file():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ck, dict) or ck.get("format") != STATE_FORMAT:
            raise ValueError("not a training state")
    except Exception as e:   # truncated, corrupt or foreign: never resume from it
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        log.warning("%s cannot be resumed (%s); starting fresh", path, reason)
        return None
    if ck.get("fingerprint") != fingerprint:
        results = next((str(d.parent) for d in Path(path).parents if d.name == "state"), "<results>")
        log.warning("%s was saved for another configuration (%s); starting fresh", path,
                    describe_change(ck.get("description") or {}, description, marks={"<results>": results}))
        return None
    for name, m in parts.modules.items():
        if m is not None and ck.get(name) is not None:
            m.load_state_dict(ck[name])
    parts.optimizer.load_state_dict(ck["optimizer"])
    restore_rngs(ck, parts.device, parts.generators)
    return ck["state"]
