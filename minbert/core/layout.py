"""Where every file of results/ and reports/ lives: the one definition of the layout.

The stage specs (minbert.pipeline.stage_specs) derive what each job reads and writes from it, so
the planner, both engines (workflow/dag.py's Snakemake patterns are these paths with the name
"{name}") and the stages ask this module through the registry; the report's loader asks it
directly. Paths are strings relative to the working directory (POSIX separators), as the engines
want them.

    results/
      data/<task>-<split>.tsv, summary.json          prepare
      pretrain/<P>/model/, history.csv, metrics.json  pretrain
      experiments/<E>/finetune/model.pt, history.csv  finetune
      experiments/<E>/retrain_heads/...               retrain_heads
      experiments/<E>/predictions/<task>-<split>.csv  predict
      experiments/<E>/metrics.json                    evaluate
      ensembles/<N>/predictions/, metrics.json        ensemble
      teachers/<T>/<task>-train.csv                   teach (a teacher's outputs on the training data)
      exports/<E>/                                    export (Hugging Face folder and model card)
      runs/<stage>[/<name>].json                      every job's run record (provenance)
      jobs/<stage>[/<name>].json                      every job's resolved description (engines' trigger)
      state/<stage>/<name>/                           resumable state of a running job (not an output)
      finished/<stage>[/<name>].json                  what the job's last finished run wrote: its
                                                      fingerprint, each output's content hash (not an output)
      locks/<stage>[/<name>].lock                     who runs the job now (minbert.pipeline.lock; empty: nobody)
      logs/<stage>[/<name>].log, benchmarks/...       Snakemake's per-job logs and benchmarks
      cache/tokens/                                   tokenised texts (shared, keyed by content)
      metrics.json                                    report: every experiment's headline scores
                                                      (the one metrics file DVC compares)
    reports/
      final.html, experiments/<E>.html                report (experiments/.written.json: the pages it wrote)

Nothing under results/ is a symlink: the stages refuse to write through one
(minbert.core.io.refuse_links), so no state, output or cleanup lands outside the folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

TRAINING_STAGES = ("finetune", "retrain_heads")
MODEL_FILE, HISTORY_FILE = "model.pt", "history.csv"     # in a training stage's folder
STATE_FILE, BEST_STATE_FILE = "last.pt", "best.pt"       # in a running job's state folder
SPLITS = ("train", "dev", "test")
PREDICTED_SPLITS = ("dev", "test")


@dataclass(frozen=True)
class Layout:
    results: str = "results"
    reports: str = "reports"

    def _r(self, *parts: str) -> str:
        return "/".join([self.results.rstrip("/"), *parts])

    # ------------------------------------------------------------ prepared data
    @property
    def data(self) -> str:
        return self._r("data")

    def split(self, task: str, split: str) -> str:
        return f"{self.data}/{task}-{split}.tsv"

    @property
    def data_summary(self) -> str:
        return f"{self.data}/summary.json"

    # ------------------------------------------------------------ pretraining
    def pretrain(self, name: str) -> str:
        return self._r("pretrain", name)

    def pretrain_model(self, name: str) -> str:
        return f"{self.pretrain(name)}/model"

    def pretrain_history(self, name: str) -> str:
        return f"{self.pretrain(name)}/history.csv"

    def pretrain_metrics(self, name: str) -> str:
        return f"{self.pretrain(name)}/metrics.json"

    # ------------------------------------------------------------ experiments
    def experiment(self, name: str) -> str:
        return self._r("experiments", name)

    def training(self, name: str, stage: str) -> str:
        """The folder of a training stage (finetune or retrain_heads) of an experiment."""
        return f"{self.experiment(name)}/{stage}"

    def model(self, name: str, stage: str) -> str:
        return f"{self.training(name, stage)}/{MODEL_FILE}"

    def history(self, name: str, stage: str) -> str:
        return f"{self.training(name, stage)}/{HISTORY_FILE}"

    def tracking(self, name: str, stage: str, tool: str) -> str:
        """A training stage's experiment-tracker logs (finetune.tracking: dvclive, tensorboard)."""
        return f"{self.training(name, stage)}/{tool}"

    def tracking_outputs(self, name: str, stage: str, tools) -> tuple[list[str], list[str], list[str]]:
        """The declared outputs of a training stage's trackers: (folders, metrics files, plot folders):
        TensorBoard's folder, DVCLive's summary (a DVC metrics file) and its history (DVC plots)."""
        folders = [self.tracking(name, stage, t) for t in tools if t != "dvclive"]
        live = [self.tracking(name, stage, "dvclive")] if "dvclive" in tools else []
        return folders, [f"{d}/metrics.json" for d in live], [f"{d}/plots" for d in live]

    def predictions(self, name: str) -> str:
        return f"{self.experiment(name)}/predictions"

    def metrics(self, name: str) -> str:
        return f"{self.experiment(name)}/metrics.json"

    # ------------------------------------------------------------ ensembles
    def ensemble(self, name: str) -> str:
        return self._r("ensembles", name)

    def ensemble_predictions(self, name: str) -> str:
        return f"{self.ensemble(name)}/predictions"

    def ensemble_metrics(self, name: str) -> str:
        return f"{self.ensemble(name)}/metrics.json"

    # ------------------------------------------------------------ teachers (distillation)
    def teacher(self, name: str) -> str:
        """A teacher's predictions on the training data: <task>-train.csv per task."""
        return self._r("teachers", name)

    def teacher_file(self, name: str, task: str) -> str:
        return f"{self.teacher(name)}/{task}-train.csv"

    # ------------------------------------------------------------ exports (Hugging Face format)
    def export(self, name: str) -> str:
        return self._r("exports", name)

    # ------------------------------------------------------------ per job
    def _job(self, kind: str, stage: str, name: str | None, suffix: str) -> str:
        return self._r(kind, stage) + (f"/{name}" if name is not None else "") + suffix

    def run_record(self, stage: str, name: str | None = None) -> str:
        return self._job("runs", stage, name, ".json")

    @property
    def run_records(self) -> str:
        return self._r("runs")

    def job_file(self, stage: str, name: str | None = None) -> str:
        return self._job("jobs", stage, name, ".json")

    @property
    def job_files(self) -> str:
        return self._r("jobs")

    def state(self, stage: str, name: str | None = None) -> str:
        return self._job("state", stage, name, "")

    def finished(self, stage: str, name: str | None = None) -> str:
        """The record of the job's last finished run (minbert.pipeline.finished): its fingerprint and
        the content hash of every output it wrote."""
        return self._job("finished", stage, name, ".json")

    @property
    def finished_records(self) -> str:
        return self._r("finished")

    def lock(self, stage: str, name: str | None = None) -> str:
        """The job's lock (minbert.pipeline.lock): held by the one process running the job."""
        return self._job("locks", stage, name, ".lock")

    def log(self, stage: str, name: str | None = None) -> str:
        return self._job("logs", stage, name, ".log")

    def benchmark(self, stage: str, name: str | None = None) -> str:
        return self._job("benchmarks", stage, name, ".tsv")

    @property
    def token_cache(self) -> str:
        return self._r("cache", "tokens")

    # ------------------------------------------------------------ reports
    @property
    def summary_metrics(self) -> str:
        """Every experiment's and ensemble's overall dev (and test) score in one file: what
        `dvc exp show` compares."""
        return self._r("metrics.json")

    @property
    def final_report(self) -> str:
        return f"{self.reports.rstrip('/')}/final.html"

    @property
    def experiment_reports(self) -> str:
        return f"{self.reports.rstrip('/')}/experiments"

    def experiment_report(self, name: str) -> str:
        return f"{self.experiment_reports}/{name}.html"


def prediction_file(folder: str | os.PathLike, task: str, split: str) -> str:
    """A predictions file inside a predictions folder (an experiment's or an ensemble's), as the
    pipeline names paths (a string; `Path(...)` of it where a file is opened)."""
    return f"{str(folder).rstrip('/')}/{task}-{split}.csv"
