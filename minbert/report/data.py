"""Everything the report reads from results/, as plain Python objects.

The report is a stage like any other: it reads what its job declares, the outputs of the other jobs
by name (`<job id>:<output name>`, e.g. `evaluate@base:metrics`, `finetune@base:run_record`: the
planner's minbert.pipeline.plan.gathered), and nothing else of the results folder; `Outputs` looks
them up, and a stage added to the pipeline has its outputs there without a change here. A result
that is absent (a task not trained, test labels unknown, an experiment not run yet) loads as None
and renders as an em dash; a file that exists but is malformed is a MinBertError naming the file.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from minbert.core.errors import MinBertError
from minbert.core.layout import PREDICTED_SPLITS as SPLITS
from minbert.core.layout import TRAINING_STAGES, Layout
from minbert.core.metrics import Undefined
from minbert.core.tasks import TASKS
from minbert.params import LoadedParams
from minbert.pipeline.plan import pipeline
from minbert.scoring.predictions import read_predictions


@dataclass
class RunResults:
    """One experiment's (or ensemble's) outputs."""
    name: str
    kind: str                                   # "experiment" | "ensemble"
    metrics: dict | None = None                 # {"dev": {...}, "test": {...} | None}
    predictions: dict = field(default_factory=dict)   # (task, split) -> DataFrame
    histories: dict = field(default_factory=dict)     # training stage -> DataFrame
    history_notes: list = field(default_factory=list)  # a history that is missing or cut short, said on the page
    pretrain_metrics: dict | None = None        # the shared pretraining's metrics.json (its dev loss before it)

    def split_metrics(self, split: str) -> dict:
        return ((self.metrics or {}).get(split)) or {}

    def labelled(self, task: str, split: str = "dev") -> pd.DataFrame | None:
        """The predictions of `task` on `split` restricted to rows with a label, or None."""
        frame = self.predictions.get((task, split))
        if frame is None:
            return None
        frame = frame[frame["label"].notna()]
        return frame if len(frame) else None


def read_json(path: Path):
    from minbert.core.io import read_input

    try:
        return json.loads(read_input(path, "JSON file").decode("utf-8"))
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); re-run the stage that writes it") from None
    except json.JSONDecodeError as e:
        raise MinBertError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); re-run the stage "
                           f"that writes it") from None
    except RecursionError:
        raise MinBertError(f"{path}: nested too deeply to be a file a stage writes; re-run the stage that "
                           f"writes it") from None


def load_metrics(path: Path) -> dict | None:
    if not path.is_file():
        return None
    metrics = read_json(path)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("dev"), (dict, type(None))):
        raise MinBertError(f"{path}: expected {{\"dev\": {{...}}, \"test\": {{...}} or null}}; "
                           f"re-run the evaluate stage")
    for split in SPLITS:
        part = metrics.get(split) or {}
        undefined = part.get("undefined") or {}
        if not isinstance(undefined, dict):
            raise MinBertError(f"{path}: key '{split}.undefined' is {undefined!r}, not a mapping of metric to "
                               f"reason; re-run the evaluate stage")
        for key, value in part.items():
            if key not in ("n", "undefined") and value is not None and not isinstance(value, (int, float)):
                raise MinBertError(f"{path}: key '{split}.{key}' is {value!r}, not a number")
            if value is None and key in undefined:     # shown as "undefined", with the reason, never as 0
                part[key] = Undefined(str(undefined[key]))
    return metrics


def load_history(path: Path) -> pd.DataFrame | None:
    if not (path.exists() or path.is_symlink()):
        return None
    from minbert.core.io import read_input

    data = read_input(path, "training history")
    try:
        frame = pd.read_csv(io.StringIO(data.decode("utf-8")))
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); re-run the training stage that writes "
                           f"it") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise MinBertError(f"{path}: not a training history ({str(e).splitlines()[0]}); re-run the training "
                           f"stage that writes it") from None
    if "epoch" not in frame.columns:
        raise MinBertError(f"{path}: no 'epoch' column; expected the history.csv written by a "
                           f"training stage")
    return frame


def history_note(path: Path, history: pd.DataFrame | None, trained: bool, stage: str, rerun: str) -> str | None:
    """What the page says of a training history that is missing while its stage ran (`trained`), or
    cut short (no line end at its end, a last line with fewer fields than the header, no rows):
    never a silently missing section or a row of dashes."""
    if history is None:
        if not trained:
            return None
        return (f"{path}: the training history is missing (deleted?), so the {stage} curves are not shown; "
                f"run {rerun} to write it again")
    import csv

    from minbert.core.io import read_input

    lines = read_input(path, "training history").decode("utf-8", errors="replace").split("\n")
    rows = [next(csv.reader([line])) for line in lines if line.strip()]
    cut = lines[-1] != "" or len(rows) < 2 or len(rows[-1]) != len(rows[0])
    if not cut:
        return None
    return (f"{path}: the training history is cut short (its last line is incomplete or it has no rows: a full "
            f"disk, an interrupted copy?); the {stage} curves and numbers below stop where it was cut, and its "
            f"last row may be wrong; run {rerun} to write it whole")


@dataclass
class Outputs:
    """The report job's reads: the other jobs' outputs, by job and output name."""
    reads: dict[str, list[str]]

    def files(self, job: str, output: str) -> list[str]:
        return list(self.reads.get(f"{job}:{output}", []))

    def file(self, job: str, output: str) -> Path | None:
        """The one path of `job`'s output `output`, or None when the report does not read it."""
        paths = self.files(job, output)
        return Path(paths[0]) if paths else None

    def run_records(self) -> list[str]:
        return [p for key, paths in sorted(self.reads.items()) if key.endswith(":run_record") for p in paths]


def _present(path: Path | None) -> bool:
    return path is not None and path.exists()


def load_run(outputs: Outputs, name: str, kind: str, pretrain: str | None = None) -> RunResults:
    experiment = kind == "experiment"
    metrics = outputs.file(f"evaluate@{name}" if experiment else f"ensemble@{name}", "metrics")
    predictions = outputs.files(f"predict@{name}" if experiment else f"ensemble@{name}", "predictions")
    run = RunResults(name=name, kind=kind, metrics=load_metrics(metrics) if metrics is not None else None)
    if pretrain is not None:                    # the shared pretraining this experiment starts from
        path = outputs.file(f"pretrain@{pretrain}", "history")
        history = load_history(path) if path is not None else None
        if history is not None:
            run.histories["pretrain"] = history
        metrics = outputs.file(f"pretrain@{pretrain}", "metrics")
        run.pretrain_metrics = read_json(metrics) if _present(metrics) else None
        if run.pretrain_metrics is not None and not isinstance(run.pretrain_metrics, dict):
            raise MinBertError(f"{metrics}: expected a JSON object; re-run python -m stages.pretrain --name {pretrain}")
        if path is not None:
            note = history_note(path, history, _present(outputs.file(f"pretrain@{pretrain}", "run_record")),
                                "pretrain", f"python -m stages.pretrain --name {pretrain}")
            run.history_notes += [note] if note else []
    for file in map(Path, predictions):         # <task>-<split>.csv (task names hold no '-')
        task, _, split = file.stem.rpartition("-")
        if file.is_file() and task in TASKS:
            run.predictions[(task, split)] = read_predictions(file, task)
    if experiment:
        for stage in TRAINING_STAGES:
            path = outputs.file(f"{stage}@{name}", "history")
            if path is None:
                continue
            history = load_history(path)
            if history is not None:
                run.histories[stage] = history
            trained = _present(outputs.file(f"{stage}@{name}", "run_record"))
            note = history_note(path, history, trained, stage.replace("_", " "),
                                f"python -m stages.{stage} --experiment {name} --force")
            run.history_notes += [note] if note else []
    return run


def run_infos(outputs: Outputs, layout: Layout) -> list[dict]:
    """Every job's run record, in path order, each with its path."""
    infos = []
    root = Path(layout.run_records)
    for path in sorted(map(Path, outputs.run_records())):
        if not path.is_file():
            continue
        info = read_json(path)
        if not isinstance(info, dict):
            raise MinBertError(f"{path}: expected a JSON object written by a stage")
        infos.append({**info, "path": path.relative_to(root.parent).as_posix()})
    return infos


def data_summary(outputs: Outputs) -> list[dict]:
    """The prepared data's summary.json as rows (one per prepared file), whatever its nesting."""
    data = outputs.file("prepare", "data")
    path = data / "summary.json" if data is not None else None
    if not _present(path):
        return []
    raw = read_json(path)
    if isinstance(raw, dict) and isinstance(raw.get("files"), (list, dict)):
        raw = raw["files"]
    if isinstance(raw, dict):
        raw = [{"file": k, **v} if isinstance(v, dict) else {"file": k, "rows": v} for k, v in raw.items()]
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise MinBertError(f"{path}: expected a list of per-file summaries; re-run the prepare stage")
    return raw


def load_pretrainings(params: LoadedParams, outputs: Outputs) -> dict[str, RunResults]:
    """Every declared pretraining's history and metrics, by name (the training check reads the one a row
    starts from and the one that starts from in turn); an absent file loads as nothing, never a guess."""
    out = {}
    for name in params.params.pretrainings:
        path = outputs.file(f"pretrain@{name}", "history")
        history = load_history(path) if path is not None else None
        metrics_path = outputs.file(f"pretrain@{name}", "metrics")
        metrics = read_json(metrics_path) if _present(metrics_path) else None
        if metrics is not None and not isinstance(metrics, dict):
            raise MinBertError(f"{metrics_path}: expected a JSON object; re-run python -m stages.pretrain --name {name}")
        out[name] = RunResults(name, "pretraining", histories={} if history is None else {"pretrain": history},
                               pretrain_metrics=metrics)
    return out


@dataclass
class ReportData:
    params: LoadedParams
    layout: Layout
    runs: dict[str, RunResults]                 # experiments and ensembles by name
    run_infos: list[dict]
    data_summary: list[dict]
    outputs: Outputs | None = None              # every output the report job reads, by job and name
    pretrainings: dict[str, RunResults] = field(default_factory=dict)   # every pretraining's history, by name


def load_report_data(params: LoadedParams, layout: Layout = Layout(),
                     reads: dict[str, list[str]] | None = None) -> ReportData:
    """What the report shows, from the outputs its job reads (`reads`: the job's; default: what the
    planner gives the report job of these params in this layout)."""
    if reads is None:
        reads = next(j for j in pipeline(params, layout) if j.spec.gathers is not None).reads
    outputs = Outputs(reads)
    runs = {name: load_run(outputs, name, "experiment", exp.pretrain) for name, exp in params.experiments.items()}
    runs |= {name: load_run(outputs, name, "ensemble") for name in params.params.ensembles}
    return ReportData(params=params, layout=layout, runs=runs, run_infos=run_infos(outputs, layout),
                      data_summary=data_summary(outputs), outputs=outputs,
                      pretrainings=load_pretrainings(params, outputs))
