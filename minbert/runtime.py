"""Device, precision, seeding and logging shared by every training and inference stage."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import sys

import numpy as np
import torch

from .errors import MinBertError


def pick_device(setting: str = "auto") -> torch.device:
    if setting == "cuda" and not torch.cuda.is_available():
        raise MinBertError("params: device 'cuda' was asked for but no CUDA GPU is available; use device: auto or cpu")
    if setting in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool | None:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); None where it cannot be told."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    return None if flags is None else bool({"avx512_bf16", "amx_bf16"} & set(flags))


_warned_bf16 = False


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on CUDA always, on CPU when asked; otherwise a no-op context. On a CPU without
    native bf16, emulated bf16 is several times slower than float32: said once, in the log."""
    global _warned_bf16
    if device.type == "cpu" and bf16 and not _warned_bf16 and cpu_has_native_bf16() is False:
        _warned_bf16 = True
        logging.getLogger("minbert").warning(
            "bf16: true on a CPU without native bf16 (no avx512_bf16 / amx_bf16): bf16 autocast is "
            "emulated and slower than float32 here; set bf16: false in the params for speed")
    if device.type == "cuda" or bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


def setup_logging(log_file: str | os.PathLike | None = None, level=logging.INFO) -> logging.Logger:
    """Log to stderr and, when given, to `log_file` (the stage says where it writes)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w", encoding="utf-8"))
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=handlers, force=True)
    return logging.getLogger("minbert")
