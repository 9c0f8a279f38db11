"""Device, precision, seeding and logging shared by every training and inference stage."""
from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import os
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch

from minbert.core.devices import PRECISIONS, check_device
from minbert.core.errors import MinBertError


def pick_device(setting: str = "auto") -> torch.device:
    """The device a setting names, here: a setting the project does not know, or `cuda` without a
    GPU, is a one-line error (minbert.core.devices.check_device), never a quiet CPU."""
    if check_device(setting) == "cuda" and not torch.cuda.is_available():
        raise MinBertError("device 'cuda' was asked for but no CUDA GPU is available; use auto or cpu")
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


def bf16_is_native(device: torch.device) -> bool:
    """Whether `device` computes bf16 in hardware: a CUDA GPU that supports it (Ampere on), a CPU
    with avx512_bf16 / amx_bf16. Elsewhere bf16 is emulated and slower than float32 (torch runs bf16
    on a T4 or V100 too, emulated: `including_emulation=False` asks for the hardware)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    return cpu_has_native_bf16() is True


AUTO_PRECISION_ENV = "MINBERT_AUTO_PRECISION"


def precision_on(setting: str, device: torch.device) -> str:
    """The precision a run uses on `device`: 'bf16', 'fp16' or 'fp32'. `auto` picks bf16 where it
    is native; on a CUDA GPU without bf16 (before Ampere: the T4 and V100 of Colab and AWS) fp16
    autocast with loss scaling; float32 elsewhere (or what the environment variable
    MINBERT_AUTO_PRECISION says `auto` means here, e.g. to run on an AVX2 machine the path a
    machine with native bf16 takes). An explicit value is honoured on every device."""
    if setting not in PRECISIONS:
        raise MinBertError(f"params: precision {setting!r} is not one of {', '.join(PRECISIONS)}")
    if setting == "auto":
        forced = os.environ.get(AUTO_PRECISION_ENV, "").strip()
        if forced:
            if forced not in PRECISIONS[1:]:
                raise MinBertError(f"{AUTO_PRECISION_ENV}={forced}: expected bf16, fp16 or fp32 (what `precision: "
                                   f"auto` means on this machine), or unset it")
            return forced
        if bf16_is_native(device):
            return "bf16"
        return "fp16" if device.type == "cuda" else "fp32"
    return setting


def slow_precision(device: torch.device, resolved: str) -> str | None:
    """One line when the precision that runs is a slow one on this device: bf16 on a CPU that only
    emulates it, fp16 on any CPU (CPUs have no fast float16 kernels: a MiniLM training step ran 24x
    slower than in bf16 and 12x slower than in float32 on one thread of a CPU with avx512_bf16, and a
    demo fine-tune 4x slower than in bf16 on another); None otherwise."""
    if device.type != "cpu":
        return None
    if resolved == "bf16" and cpu_has_native_bf16() is False:
        return ("precision: bf16 on a CPU without native bf16 (no avx512_bf16 / amx_bf16): bf16 autocast is "
                "emulated and about 4x slower than float32 here; set precision: auto (or fp32) for speed")
    if resolved == "fp16":
        best = "bf16, native here" if cpu_has_native_bf16() else "float32 here"
        return (f"precision: fp16 on a CPU: float16 autocast is made for GPUs and runs several times slower on a CPU "
                f"than precision: auto ({best}); set precision: auto for speed")
    return None


def configure_precision(device: torch.device, precision: str, deterministic: bool = False) -> str:
    """Set up the process for a run on `device` in `precision` (a setting: auto | bf16 | fp16 |
    fp32) and return the precision that runs ('bf16', 'fp16' or 'fp32'). float32 on CUDA
    multiplies matrices in TF32 (what fp32 means on a GPU with tensor cores). `deterministic` pins
    algorithms (minbert.core.runtime.make_deterministic). Asking for bf16 on a CPU that only
    emulates it is honoured, and said once in the log."""
    resolved = precision_on(precision, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    note = slow_precision(device, resolved)
    if note:
        logging.getLogger("minbert").warning(note)
    if deterministic:
        make_deterministic(device)
    return resolved


def configure(device: torch.device, precision: str, deterministic: bool = False) -> bool:
    """`configure_precision`, answering whether bf16 autocast is on."""
    return configure_precision(device, precision, deterministic) == "bf16"


def make_deterministic(device: torch.device) -> None:
    """Algorithms that give the same bits on every run: torch's deterministic mode (an error where an
    op has no deterministic kernel), cuDNN without autotuning, cuBLAS with a fixed workspace, and the
    math attention backend (the fused ones may pick kernels by shape and hardware)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # read when cuBLAS starts: before any matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: bool | str):
    """Autocast in a resolved precision (minbert.core.runtime.configure_precision): 'bf16' or
    'fp16' (True stands for bf16), else a no-op context (float32; TF32 matrix products on CUDA)."""
    dtype = AMP_DTYPES.get("bf16" if precision is True else precision)
    if dtype is not None:
        return torch.autocast(device.type, dtype=dtype)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Runtime:
    """Where a stage runs the network and in which precision (`bf16` or `fp16`: autocast on; fp16
    trains with a gradient scaler)."""
    device: torch.device
    bf16: bool
    fp16: bool = False

    def amp(self):
        return autocast(self.device, self.precision)

    @property
    def precision(self) -> str:
        return precision_name(self.bf16, self.fp16)


def precision_name(bf16: bool, fp16: bool) -> str:
    """The precision a run's autocast flags stand for: bf16, fp16 or fp32."""
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def start_runtime(network, device: torch.device | None = None) -> Runtime:
    """Set up the process as a stage's network settings ask (`network`: threads, device, precision,
    deterministic; minbert.params.settings.NetworkSettings): the one runtime setup of every stage
    that runs the network. `device`: the one a torchrun launch assigned this rank."""
    set_threads(network.threads)
    device = device or pick_device(network.device)
    precision = configure_precision(device, network.precision, network.deterministic)
    return Runtime(device, bf16=precision == "bf16", fp16=precision == "fp16")


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


MAX_THREADS = 1024           # as the params' `threads` allows


def set_threads(n: int | None) -> None:
    """torch's CPU threads (None: its default); a number it cannot take is one line (`--threads -1`
    was a traceback in torch)."""
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_THREADS:
        raise MinBertError(f"threads {n!r}: expected a whole number of CPU threads from 1 to {MAX_THREADS}")
    torch.set_num_threads(int(n))


def setup_logging(log_file: str | os.PathLike | None = None, level=logging.INFO) -> logging.Logger:
    """Log to stderr and, when given, to `log_file` (the stage says where it writes)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w", encoding="utf-8"))
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=handlers, force=True)
    return logging.getLogger("minbert")
