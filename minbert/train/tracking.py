"""Experiment tracking in the tools of this ecosystem, offline: DVCLive (DVC's own: `dvc exp show`
and `dvc plots` read what it writes), TensorBoard and MLflow (its local file store: one experiment
`minbert`, one run named after the job, the run's settings as its params), switched on by
`finetune.tracking`, as the Trainer's `report_to` switches them on.

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
model.pt as declared outputs (`.../finetune/dvclive/`, `.../finetune/tensorboard/`,
`.../finetune/mlflow/`). MLflow's store is not moved but copied through MLflow's own API into a
store at its final place, so that the paths it records are where it lies; a resumed MLflow run is
the interrupted one's points up to its last saved state, copied into a new run the same way.
"""
from __future__ import annotations

import csv
import math
import os
import shutil
import time
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.trackers import TRACKERS, missing

TOOLS = tuple(TRACKERS)


class Trackers:
    """The trackers a run logs to (`tools`, a subset of TOOLS), their folders under `folder`."""

    def __init__(self, tools: list[str], folder: Path, resumed_at: int | None = None, name: str = "run",
                 params: dict | None = None):
        self.folder = Path(folder)
        self.live = self.board = self.flow = None
        self.per_update: set[str] = set()       # the names each update logs (a row leaves them out)
        if "dvclive" in tools:
            try:
                from dvclive import Live
            except ImportError:
                raise MinBertError(missing("dvclive")) from None
            path = self.folder / "dvclive"
            if resumed_at is not None:
                _drop_after(path, resumed_at)
            self.live = Live(dir=str(path), resume=resumed_at is not None, save_dvc_exp=False, dvcyaml=False,
                             report=None)
        if "tensorboard" in tools:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MinBertError(missing("tensorboard")) from None
            # purge_step: the events a run logged after its last saved state are dropped on resume
            self.board = SummaryWriter(log_dir=str(self.folder / "tensorboard"),
                                       purge_step=None if resumed_at is None else resumed_at + 1)
        if "mlflow" in tools:
            self.flow = MlflowRun(self.folder / "mlflow", name, params or {}, resumed_at)

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
        if self.flow is not None:
            self.flow.log(update, values)

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
        if self.flow is not None:
            self.flow.close()

    def finish(self, out_dir: Path) -> None:
        """Close the logs and move them beside the run's model (`out_dir/<tool>`; MLflow's store copied
        through its API, see the module docstring)."""
        self.close()
        if self.flow is not None:
            self.flow.copy_to(Path(out_dir) / "mlflow")
            self.flow = None
        for tool in ("dvclive", "tensorboard"):
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


# ---------------------------------------------------------------- MLflow

def _mlflow():
    """The `mlflow` module, with its local file store allowed (MLflow 3 keeps it in maintenance mode
    and refuses it unless MLFLOW_ALLOW_FILE_STORE says otherwise) and no telemetry sent (nothing here
    reaches the network); a user's own setting of either is kept."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import mlflow
    except ImportError:
        raise MinBertError(missing("mlflow")) from None
    return mlflow


def _flat(settings: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: dotted keys, values as text."""
    out: dict[str, str] = {}
    for k, v in settings.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:6000]          # MLflow's limit on a param's value
    return out


class MlflowRun:
    """One run in a local MLflow file store of its own: experiment `minbert`, the run named `name`,
    the settings as params, each metric at its update. While it runs, the store is a folder of its
    own under `folder` (a new one for each process that logs, so that MLflow, which keeps one store
    object per path in a process, never meets a folder it knew under the same name)."""
    EXPERIMENT = "minbert"

    def __init__(self, folder: Path, name: str, params: dict, resumed_at: int | None = None):
        self.mlflow = _mlflow()
        self.name = name
        self.folder = Path(folder) / f"store-{time.time_ns():x}"
        before = sorted(Path(folder).glob("store-*")) if resumed_at is not None else []
        old = self._store(before[-1]) if before else None
        runs = old.search_runs([e.experiment_id for e in old.search_experiments()]) if old else []
        if runs:                     # the interrupted run up to its last saved state, in a new store
            self.client, self.run_id = self._copy(old, runs[0].info.run_id, self.folder, upto=resumed_at)
        else:
            self.client = self._store(self.folder)
            experiment = self.client.create_experiment(self.EXPERIMENT)
            self.run_id = self.client.create_run(experiment, run_name=name,
                                                 tags={"mlflow.source.name": "minbert"}).info.run_id
            items = sorted(_flat(params).items())
            for k in range(0, len(items), 100):          # MLflow's batches hold at most 100 params
                self.client.log_batch(self.run_id, params=[self.mlflow.entities.Param(a, b)
                                                           for a, b in items[k:k + 100]])
        for path in before:
            shutil.rmtree(path, ignore_errors=True)

    def _store(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        return self.mlflow.MlflowClient(tracking_uri=folder.resolve().as_uri())

    def log(self, update: int, values: dict) -> None:
        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.mlflow.entities.Metric(k, v, stamp, update)
                                                    for k, v in values.items()])

    def close(self) -> None:
        pass                         # every point is written as it is logged; the run ends when copied

    def _copy(self, source, run_id: str, folder: Path, upto: int | None = None, home: Path | None = None):
        """The run `run_id` of `source` as the one run of a new store at `folder` (its artifacts
        recorded under `home`, where the store will lie, default `folder`): its params, tags and every
        metric point (those at updates up to `upto`, when given). Returns (client, run id)."""
        run = source.get_run(run_id)
        client = self._store(folder)
        experiment = client.create_experiment(self.EXPERIMENT, artifact_location=Path(home or folder).resolve().as_uri()
                                              + "/artifacts")
        tags = {k: v for k, v in run.data.tags.items() if k != "mlflow.runName"}
        new = client.create_run(experiment, start_time=run.info.start_time, run_name=self.name, tags=tags).info.run_id
        entities = self.mlflow.entities
        params = [entities.Param(k, v) for k, v in sorted(run.data.params.items())]
        for k in range(0, len(params), 100):
            client.log_batch(new, params=params[k:k + 100])
        points = [entities.Metric(key, m.value, m.timestamp, m.step) for key in sorted(run.data.metrics)
                  for m in source.get_metric_history(run_id, key) if upto is None or m.step <= upto]
        for k in range(0, len(points), 1000):            # at most 1000 metrics a batch
            client.log_batch(new, metrics=points[k:k + 1000])
        return client, new

    def copy_to(self, dest: Path) -> None:
        """The finished run, ended, as the one run of a new store at `dest` (written beside it, then
        renamed into place, replacing what was there)."""
        dest = Path(dest)
        tmp = dest.with_name(f"{dest.name}.tmp-{time.time_ns():x}")
        client, run_id = self._copy(self.client, self.run_id, tmp, home=dest)
        client.set_terminated(run_id)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.replace(dest)
        shutil.rmtree(self.folder.parent, ignore_errors=True)
