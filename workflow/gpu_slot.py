"""Run a command on GPUs of its own: `python -m workflow.gpu_slot --count N -- COMMAND ...`.

Snakemake caps how many jobs that ask for the `gpu` resource run at once (`--resources gpu=N`, the
local profile), but it does not say which GPU a job gets (snakemake/snakemake#281), so every job
would land on GPU 0. This wrapper takes a lock on N of the visible GPUs (one lock file per device,
in the machine's temporary folder), sets CUDA_VISIBLE_DEVICES to them and becomes the command
(exec: the command inherits the locks, gets the signals itself, and the kernel frees the locks
when it ends, however it ends). The
visible GPUs are CUDA_VISIBLE_DEVICES's entries when it is set (Slurm sets it to the job's own
devices, so two jobs on one node lock different files), else those `nvidia-smi -L` lists. Without
any, the command runs as it is (CPU). A job finding every GPU taken waits for one.
"""
from __future__ import annotations

import argparse
import fcntl
import os
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


def acquire(devices: list[str], count: int, lock_dir: Path, poll: float = 0.5) -> tuple[list[str], list]:
    """Lock `count` of `devices` (waiting until that many are free); returns them and their open lock files."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        held, files = [], []
        for dev in devices:
            f = open(lock_dir / f"gpu-{dev.replace('/', '_')}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append(dev)
            files.append(f)
            if len(held) == count:
                return held, files
        for f in files:
            f.close()            # not enough free: let the others go and try again
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1, help="GPUs the command needs (default 1)")
    p.add_argument("--lock-dir", default=os.path.join(tempfile.gettempdir(), f"minbert-gpu-locks-{os.getuid()}"))
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
    held, files = acquire(devices, args.count, Path(args.lock_dir))
    for f in files:
        os.set_inheritable(f.fileno(), True)     # the locks stay with the command after exec
    os.execvpe(command[0], command, {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(held)})


if __name__ == "__main__":
    sys.exit(main())
