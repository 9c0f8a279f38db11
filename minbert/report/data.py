"""Everything the report reads from results/, as plain Python objects.

The file layout is the pipeline contract (docs/pipeline.md). A result that is absent (a task not
trained, test labels unknown, an experiment not run yet) loads as None and renders as an em dash;
a file that exists but is malformed is a MinBertError naming the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..errors import MinBertError
from ..params import TASKS, LoadedParams

SPLITS = ("dev", "test")
PREDICTION_COLUMNS = {
    "sst": ["id", "sentence", "label", "prediction"],
    "para": ["id", "sentence1", "sentence2", "label", "prediction"],
    "sts": ["id", "sentence1", "sentence2", "label", "prediction"],
}
TEXT_COLUMNS = ("id", "sentence", "sentence1", "sentence2")
TRAINING_STAGES = ("finetune", "retrain_heads")


@dataclass
class RunResults:
    """One experiment's (or ensemble's) outputs."""
    name: str
    kind: str                                   # "experiment" | "ensemble"
    folder: Path
    metrics: dict | None = None                 # {"dev": {...}, "test": {...} | None}
    predictions: dict = field(default_factory=dict)   # (task, split) -> DataFrame
    histories: dict = field(default_factory=dict)     # training stage -> DataFrame

    def split_metrics(self, split: str) -> dict:
        return ((self.metrics or {}).get(split)) or {}

    def labelled(self, task: str, split: str = "dev") -> pd.DataFrame | None:
        """The predictions of `task` on `split` restricted to rows with a label, or None."""
        frame = self.predictions.get((task, split))
        if frame is None:
            return None
        frame = frame[frame["label"].notna()]
        return frame if len(frame) else None


def experiment_folder(results: Path, name: str) -> Path:
    return Path(results) / "experiments" / name


def pretrain_folder(results: Path, name: str) -> Path:
    return Path(results) / "pretrain" / name


def ensemble_folder(results: Path, name: str) -> Path:
    return Path(results) / "ensembles" / name


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MinBertError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); re-run the stage "
                           f"that writes it") from None


def load_metrics(path: Path) -> dict | None:
    if not path.is_file():
        return None
    metrics = read_json(path)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("dev"), (dict, type(None))):
        raise MinBertError(f"{path}: expected {{\"dev\": {{...}}, \"test\": {{...}} or null}}; "
                           f"re-run the evaluate stage")
    for split in SPLITS:
        for key, value in (metrics.get(split) or {}).items():
            if key != "n" and value is not None and not isinstance(value, (int, float)):
                raise MinBertError(f"{path}: key '{split}.{key}' is {value!r}, not a number")
    return metrics


def load_predictions(path: Path, task: str) -> pd.DataFrame:
    # Texts stay text: "NA" or "null" are real words here, not missing values.
    frame = pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False,
                        na_values={"label": [""], "prediction": [""]})
    missing = [c for c in PREDICTION_COLUMNS[task] if c not in frame.columns]
    if missing:
        raise MinBertError(f"{path}: missing column(s) {', '.join(missing)} (expected "
                           f"{', '.join(PREDICTION_COLUMNS[task])}, ...); re-run the predict stage")
    for col in ["label", "prediction"] + [c for c in frame.columns if c.startswith("prob_")]:
        numeric = pd.to_numeric(frame[col], errors="coerce")
        bad = numeric.isna() & frame[col].notna()
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0]) + 2   # + header, 1-based
            raise MinBertError(f"{path}: line {row}, column '{col}': {frame[col][bad].iloc[0]!r} "
                               f"is not a number")
        frame[col] = numeric
    return frame


def load_history(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    frame = pd.read_csv(path)
    if "epoch" not in frame.columns:
        raise MinBertError(f"{path}: no 'epoch' column; expected the history.csv written by a "
                           f"training stage")
    return frame


def load_run(results: Path, name: str, kind: str, pretrain: str | None = None) -> RunResults:
    folder = (experiment_folder if kind == "experiment" else ensemble_folder)(results, name)
    run = RunResults(name=name, kind=kind, folder=folder, metrics=load_metrics(folder / "metrics.json"))
    if pretrain is not None:                    # the shared pretraining this experiment starts from
        history = load_history(pretrain_folder(results, pretrain) / "history.csv")
        if history is not None:
            run.histories["pretrain"] = history
    for task in TASKS:
        for split in SPLITS:
            path = folder / "predictions" / f"{task}-{split}.csv"
            if path.is_file():
                run.predictions[(task, split)] = load_predictions(path, task)
    for stage in TRAINING_STAGES:
        history = load_history(folder / stage / "history.csv")
        if history is not None:
            run.histories[stage] = history
    return run


def run_infos(results: Path) -> list[dict]:
    """Every run.json under results/, in path order, each with its path."""
    infos = []
    for path in sorted(Path(results).glob("**/run.json")):
        info = read_json(path)
        if not isinstance(info, dict):
            raise MinBertError(f"{path}: expected a JSON object written by a stage")
        infos.append({**info, "path": path.relative_to(results).as_posix()})
    return infos


def data_summary(results: Path) -> list[dict]:
    """results/data/summary.json as rows (one per prepared file), whatever its nesting."""
    path = Path(results) / "data" / "summary.json"
    if not path.is_file():
        return []
    raw = read_json(path)
    if isinstance(raw, dict) and isinstance(raw.get("files"), (list, dict)):
        raw = raw["files"]
    if isinstance(raw, dict):
        raw = [{"file": k, **v} if isinstance(v, dict) else {"file": k, "rows": v} for k, v in raw.items()]
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise MinBertError(f"{path}: expected a list of per-file summaries; re-run the prepare stage")
    return raw


@dataclass
class ReportData:
    params: LoadedParams
    results: Path
    runs: dict[str, RunResults]                 # experiments and ensembles by name
    run_infos: list[dict]
    data_summary: list[dict]


def load_report_data(params: LoadedParams, results: Path) -> ReportData:
    results = Path(results)
    runs = {name: load_run(results, name, "experiment", exp.pretrain) for name, exp in params.experiments.items()}
    runs |= {name: load_run(results, name, "ensemble") for name in params.params.ensembles}
    return ReportData(params=params, results=results, runs=runs, run_infos=run_infos(results),
                      data_summary=data_summary(results))


def report_inputs(params_path: str | Path, results_dir: str | Path) -> list[Path]:
    """Every file the report reads: the ones the pipeline always produces for the experiments and
    ensembles in params.yaml (whether they exist yet or not), plus the optional ones that exist
    (test predictions, retrained-head histories, run.json files)."""
    from ..params import load_params

    params = load_params(params_path)
    results = Path(results_dir)
    files = {Path(params_path), results / "data" / "summary.json"}
    for name, exp in params.experiments.items():
        folder = experiment_folder(results, name)
        files.add(folder / "metrics.json")
        files.add(folder / "finetune" / "history.csv")
        if exp.retrain_heads.enabled:
            files.add(folder / "retrain_heads" / "history.csv")
        files.update(folder / "predictions" / f"{task}-dev.csv" for task in exp.finetune.tasks)
        if exp.pretrain is not None:
            files.add(pretrain_folder(results, exp.pretrain) / "history.csv")
    for name in params.params.ensembles:
        files.add(ensemble_folder(results, name) / "metrics.json")
    names = [experiment_folder(results, n) for n in params.experiments]
    names += [ensemble_folder(results, n) for n in params.params.ensembles]
    for folder in names:
        files.update(p for p in (folder / "predictions").glob("*.csv") if p.stem.split("-")[0] in TASKS)
        files.update(p for p in (folder / "retrain_heads").glob("history.csv"))
    files.update(results.glob("**/run.json"))
    return sorted(files)
