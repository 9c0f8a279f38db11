"""One process at a time per job, whichever engine (or hand) started it.

Snakemake and DVC each keep their own lock, which the other does not see; a stage run by hand sees
neither. So every stage takes the job's lock, results/locks/<stage>[/<name>].lock, before it touches
the job's outputs or its resumable state (minbert.pipeline.runinfo.running):
- `fcntl.flock` on the file: the operating system releases it when the holder ends, however it
  ends (a crash, `kill -9`, a lost Slurm node's process on a shared file system aside), so a lock
  left by a dead process is stale by construction and the next run takes it over;
- the file holds who has it (engine, PID, host, start, command) as JSON, for the line a second
  process prints while it waits; it is emptied, never deleted, on release (deleting a lock file
  lets two processes hold locks on two different files of the same name).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import socket
import sys
from pathlib import Path

from minbert.core.errors import MinBertError

log = logging.getLogger(__name__)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read(1 << 16).split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096).decode(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[1])    # the field after the command name in parentheses
    except (OSError, ValueError, IndexError):
        return 0


ENGINES = ("snakemake", "dvc")


def engine_of(args: list[str]) -> str | None:
    """The engine a command line runs (`snakemake ...`, `python .../bin/dvc ...`, `python -m
    snakemake ...`), or None."""
    for a in args[:2]:
        name = Path(a).name.removesuffix(".exe")
        if name in ENGINES:
            return name
    return args[2] if len(args) > 2 and args[1] == "-m" and args[2] in ENGINES else None


def engine(environ=os.environ) -> str:
    """Who started this stage: "dvc" (its stage commands get DVC_STAGE and DVC_ROOT), "snakemake"
    (no variable of its own: a snakemake process among this process and its ancestors, the
    in-process mode included), else "hand"."""
    if environ.get("DVC_STAGE") or environ.get("DVC_ROOT"):
        return "dvc"
    pid, seen = os.getpid(), 0
    while pid > 1 and seen < 64:
        if engine_of(_cmdline(pid)) == "snakemake":
            return "snakemake"
        pid, seen = _parent(pid), seen + 1
    return "hand"


def engines_in(folder: str | os.PathLike) -> list[dict] | None:
    """The engines (Snakemake, DVC) running on this machine in `folder` or a folder above it (where
    the results folder is theirs), as [{"engine", "pid"}]; None where processes cannot be listed
    (no /proc)."""
    if not os.path.isdir("/proc/self"):
        return None
    target = Path(folder).resolve()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        name = engine_of(_cmdline(int(entry.name)))
        if name is None:
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{entry.name}/cwd"))
        except OSError:                 # ended meanwhile, or another user's
            continue
        if target.is_relative_to(cwd) and cwd != Path("/"):
            found.append({"engine": name, "pid": int(entry.name)})
    return found


def _holder(text: str) -> dict:
    try:
        info = json.loads(text)
        return info if isinstance(info, dict) else {}
    except ValueError:
        return {}


def describe(info: dict) -> str:
    """e.g. `snakemake, PID 4711 on node3 since 2025-01-01T10:00:00+00:00`."""
    if not info:
        return "a process that left no record"
    return (f"{info.get('engine', 'an unknown engine')}, PID {info.get('pid', '?')} on {info.get('host', '?')} "
            f"since {info.get('started', '?')}")


@contextlib.contextmanager
def job_lock(path: str | os.PathLike, job_id: str, wait: bool = True):
    """Hold the lock of job `job_id` (file `path`) for the body, which gets who holds it (this
    process) and whether it `waited`. When another process has it, wait for it to end (saying once
    who it is), or with `wait=False` refuse in one line naming the holder.

    Waiting is what keeps finished work: a job the engine started while another process runs it
    (a stage started by hand, an orphan of a killed engine) must not fail, since the engine then
    deletes the outputs of a failed job, which are the other process's; after the wait the job
    finds those outputs made for its description, checks them by content and keeps them
    (minbert.pipeline.runinfo)."""
    import fcntl

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                     0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MinBertError(f"{path}: the job's lock file is a symlink; remove it (rm {path}) and run "
                               f"again") from None
        raise
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = _holder(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
            if not wait:
                raise MinBertError(
                    f"{job_id} is already running ({describe(holder)}); wait for it to finish, or stop it. "
                    f"A lock whose process has ended is released by the system; only if no such process runs "
                    f"(e.g. a node of a shared file system went down) delete {path} and run again") from None
            print(f"{job_id} is already running ({describe(holder)}); waiting for it to finish", file=sys.stderr,
                  flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)      # an interruption (SIGTERM, Ctrl-C) ends the wait
            waited = True
        earlier = _holder(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
        if earlier:
            log.warning("%s: taking over the lock of %s, which ended without releasing it (a crash); its "
                        "partial work is checked before any is reused", job_id, describe(earlier))
        me = {"job": job_id, "engine": engine(), "pid": os.getpid(), "host": socket.gethostname(),
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv])[:2000]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        try:
            yield {**me, "waited": waited}
        finally:
            os.ftruncate(fd, 0)         # released: an empty lock file is a free one
    finally:
        os.close(fd)                    # closing releases the flock
