"""A running job's progress, in a small JSON file beside its resumable state (`progress.json` in
its state folder), rewritten at most every few seconds: its phase, epoch and update, the rate, the
time left. `minbert progress` (minbert.pipeline.progress) reads it for each job that holds its lock,
whichever engine runs it; the job's own log is left as it is."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROGRESS_FILE = "progress.json"


class Progress:
    """Writes `folder/progress.json` (atomically: a reader never sees half a file), at most every
    `every` seconds unless forced."""

    def __init__(self, folder: str | os.PathLike, stage: str, every: float = 2.0):
        self.path = Path(folder) / PROGRESS_FILE
        self.stage, self.every, self.last = stage, every, 0.0
        self.started = time.time()

    def due(self) -> bool:
        """Whether an update would be written now."""
        return time.time() - self.last >= self.every

    def update(self, force: bool = False, **fields) -> None:
        now = time.time()
        if not force and now - self.last < self.every:
            return
        self.last = now
        info = {"stage": self.stage, "pid": os.getpid(), "started": self.started, "updated": now, **fields}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:          # progress is for people watching: never a reason to stop a job
            tmp.unlink(missing_ok=True)


def eta(done: int, total: int, seconds: float) -> float | None:
    """Seconds left at the rate so far (None before the first unit of work)."""
    return None if done <= 0 or seconds <= 0 else (total - done) * seconds / done
