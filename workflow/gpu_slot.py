"""Run a command on GPU slots of its own: `python -m workflow.gpu_slot --count N --per-gpu K -- COMMAND`.

Snakemake does not say which GPU a job that asks for the `gpu` resource gets
(snakemake/snakemake#281), so every job would land on GPU 0. This wrapper takes a slot on N of the
visible GPUs (a lock file per slot, K slots per device, in the machine's temporary folder), sets
CUDA_VISIBLE_DEVICES to those devices and becomes the command (exec: the command inherits the
locks, gets the signals itself, and the kernel frees the locks when it ends, however it ends).

K jobs share a device (a MiniLM job takes under 1 GB of an 80 GB GPU, and one small job alone
leaves most of it idle), as long as its memory allows: a device that already runs a job takes
another only while `nvidia-smi` reports at least --min-free-mb free on it. Processes that share a
GPU take turns on it (time slices): the default, chosen by measurement. On one H200, four
captured MiniLM training jobs side by side by time slices did 4.15x the updates of one alone
(each at its full speed), and as clients of NVIDIA's Multi-Process Service 2.94x
(`python bench/gpu_sharing.py --jobs 4 --steps 200`; bench/README.md). `--mps on` (or MINBERT_MPS=1)
starts MPS for the machine instead (once; `nvidia-cuda-mps-control -d`, its pipes in the lock
folder) and makes the job its client, so the jobs' kernels run side by side; a first client is
tried before any job relies on it, and where MPS cannot start or serve (no control binary, a
container that forbids it), that is remembered and jobs share by time slices.

The visible GPUs are CUDA_VISIBLE_DEVICES's entries when it is set (Slurm sets it to the job's own
devices, so two jobs on one node lock different files), else those `nvidia-smi -L` lists. Without any, the command runs
as it is (CPU). A job finding no free slot waits for one.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def free_memory_mb() -> dict[str, int]:
    """Free memory per GPU index, as nvidia-smi reports it (empty when it cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    free = {}
    for line in out.splitlines():
        index, _, mb = line.partition(",")
        if mb.strip().isdigit():
            free[index.strip()] = int(mb.strip())
    return free


def acquire(devices: list[str], count: int, lock_dir: Path, per_gpu: int = 1, min_free_mb: int = 0,
            poll: float = 0.5) -> tuple[list[str], list]:
    """Take a slot on `count` of `devices` (waiting until that many have one free); returns the
    devices and their open lock files. A device running a job already gives a second slot only
    while it has `min_free_mb` free."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        held, files = [], []
        free = free_memory_mb() if per_gpu > 1 and min_free_mb else {}
        for dev in devices:
            slot = _slot(dev, lock_dir, per_gpu, free.get(dev), min_free_mb)
            if slot is None:
                continue
            held.append(dev)
            files.append(slot)
            if len(held) == count:
                return held, files
        for f in files:
            f.close()            # not enough free: let the others go and try again
        time.sleep(poll)


def _slot(dev: str, lock_dir: Path, per_gpu: int, free_mb: int | None, min_free_mb: int):
    """An open, locked slot file of `dev`, or None when none may be taken now."""
    busy = 0
    for k in range(per_gpu):
        f = open(lock_dir / f"gpu-{dev.replace('/', '_')}-{k}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            busy += 1
            continue
        if busy and free_mb is not None and free_mb < min_free_mb:   # shared, but its memory is short
            f.close()
            return None
        return f
    return None


MPS_PROBE = "import torch; torch.ones(8, device='cuda').sum().item()"


def mps_env(lock_dir: Path, python: str = sys.executable, timeout: float = 120) -> dict:
    """The environment that makes a job a client of this machine's MPS server, starting it (and
    trying a first client) once; {} where MPS is not there or does not work (remembered)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return {}
    lock_dir.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(lock_dir / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(lock_dir / "mps-log")}
    state = lock_dir / "mps-state"
    with open(lock_dir / "mps.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)       # one job starts it; the others wait, then read its state
        if not state.is_file():
            for folder in env.values():
                Path(folder).mkdir(parents=True, exist_ok=True)
            full = {**os.environ, **env}
            try:
                started = subprocess.run([control, "-d"], env=full, timeout=timeout, stdin=subprocess.DEVNULL)
                ok = started.returncode == 0 and subprocess.run([python, "-c", MPS_PROBE], env=full, timeout=timeout,
                                                                capture_output=True).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if not ok:
                subprocess.run([control], input="quit\n", text=True, env=full, capture_output=True, timeout=timeout)
            state.write_text("ok\n" if ok else "unusable\n")
        return env if state.read_text().strip() == "ok" else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1, help="GPUs the command needs (default 1)")
    p.add_argument("--per-gpu", type=int, default=1, help="jobs that may share one GPU (default 1)")
    p.add_argument("--min-free-mb", type=int, default=4000,
                   help="a GPU already running a job takes another only with this much memory free (default 4000)")
    p.add_argument("--lock-dir", default=os.path.join(tempfile.gettempdir(), f"minbert-gpu-locks-{os.getuid()}"))
    p.add_argument("--mps", choices=["on", "auto", "off"], default="on" if os.environ.get("MINBERT_MPS") == "1" else "off",
                   help="off (default): jobs sharing a GPU take turns on it (time slices, the faster in "
                        "bench/gpu_sharing.py's measurement); on (also auto, or MINBERT_MPS=1): they run as clients "
                        "of NVIDIA's MPS where it works")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (after --)")
    devices = visible_gpus()
    if args.count < 1 or not devices:
        os.execvp(command[0], command)
    if args.count > len(devices):
        print(f"error: the job needs {args.count} GPUs but {len(devices)} are visible ({','.join(devices)}); "
              f"lower the gpu setting (--config gpu=N)", file=sys.stderr)
        return 2
    held, files = acquire(devices, args.count, Path(args.lock_dir), max(1, args.per_gpu), args.min_free_mb)
    for f in files:
        os.set_inheritable(f.fileno(), True)     # the locks stay with the command after exec
    mps = mps_env(Path(args.lock_dir)) if args.per_gpu > 1 and args.mps != "off" else {}
    os.execvpe(command[0], command, {**os.environ, **mps, "CUDA_VISIBLE_DEVICES": ",".join(held)})


if __name__ == "__main__":
    sys.exit(main())
