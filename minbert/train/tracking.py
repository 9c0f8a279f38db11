"""Experiment tracking in the tools of this ecosystem, offline: DVCLive (DVC's own: `dvc exp show`
and `dvc plots` read what it writes) and TensorBoard, switched on by `finetune.tracking`.

What they get is what the run's history gets, no second computation: each update's learning rate
and each task's training loss (one read of the device's running totals per update, only when
tracking is on), and every history row (each dev evaluation: the train part's metrics, the dev
metrics, the selection score, speed) at the update it was made. Each name has one value per update
and one meaning: `lr` and `train_<task>_loss` are the update's own, logged once, so a row does not
log them again (its train losses, the mean since the last evaluation, are history.csv's).
history.csv stays the source the report reads.

While the job runs, the logs grow in its state folder (`<state>/tracking/<tool>/`: TensorBoard can
watch them live, `tensorboard --logdir results/state`), so an interrupted run resumes them (the
updates logged after its last saved state are dropped first); when it finishes they move beside
model.pt as declared outputs (`.../finetune/dvclive/`, `.../finetune/tensorboard/`).
"""
from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

from minbert.core.errors import MinBertError

TOOLS = ("dvclive", "tensorboard")


class Trackers:
    """The trackers a run logs to (`tools`, a subset of TOOLS), their folders under `folder`."""

    def __init__(self, tools: list[str], folder: Path, resumed_at: int | None = None):
        self.folder = Path(folder)
        self.live = self.board = None
        self.per_update: set[str] = set()       # the names each update logs (a row leaves them out)
        if "dvclive" in tools:
            try:
                from dvclive import Live
            except ImportError:
                raise MinBertError("finetune.tracking lists dvclive, which is not installed: pip install dvclive "
                                   "(or the project's `tracking` extra)") from None
            path = self.folder / "dvclive"
            if resumed_at is not None:
                _drop_after(path, resumed_at)
            self.live = Live(dir=str(path), resume=resumed_at is not None, save_dvc_exp=False, dvcyaml=False,
                             report=None)
        if "tensorboard" in tools:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MinBertError("finetune.tracking lists tensorboard, which is not installed: pip install "
                                   "tensorboard (or the project's `tracking` extra)") from None
            # purge_step: the events a run logged after its last saved state are dropped on resume
            self.board = SummaryWriter(log_dir=str(self.folder / "tensorboard"),
                                       purge_step=None if resumed_at is None else resumed_at + 1)

    def log(self, update: int, values: dict, sync: bool) -> None:
        """Numeric `values` at `update` (NaN and undefined values left out)."""
        values = {k: float(v) for k, v in values.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self.live is not None:
            self.live.step = update
            for k, v in values.items():
                self.live.log_metric(k, v)
            if sync:
                self.live.make_summary()
        if self.board is not None:
            for k, v in values.items():
                self.board.add_scalar(k, v, global_step=update)
            if sync:
                self.board.flush()

    def log_update(self, update: int, values: dict) -> None:
        """One update's learning rate and training losses."""
        self.per_update.update(values)
        self.log(update, values, sync=False)

    def log_row(self, row: dict) -> None:
        """A history row, at the update it was made (its numbers as they are in history.csv), but for
        the names each update logs itself."""
        skip = {"update", "phase", *self.per_update}
        self.log(int(row["update"]), {k: v for k, v in row.items() if k not in skip}, sync=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.make_summary()
            self.live = None
        if self.board is not None:
            self.board.close()
            self.board = None

    def finish(self, out_dir: Path) -> None:
        """Close the logs and move them beside the run's model (`out_dir/<tool>`)."""
        self.close()
        for tool in TOOLS:
            src = self.folder / tool
            if src.is_dir():
                dest = Path(out_dir) / tool
                shutil.rmtree(dest, ignore_errors=True)
                src.replace(dest)


def _drop_after(folder: Path, update: int) -> None:
    """DVCLive's history files without the rows logged after `update` (a resumed run logs them again)."""
    for tsv in (folder / "plots").rglob("*.tsv") if folder.is_dir() else ():
        with open(tsv, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if not rows or "step" not in rows[0]:
            continue
        kept = [r for r in rows if int(float(r["step"])) <= update]
        with open(tsv, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
            w.writeheader()
            w.writerows(kept)
