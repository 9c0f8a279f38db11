"""The result tables: one per study (rows: experiments; columns: the papers' metrics per split),
the ensemble against its members, and the choice of the best model.

Cells carry raw values; the templates format them with `fmt_metric` / `fmt_delta` so that every
number on a page is rounded the same way.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from .data import ReportData, RunResults

METRIC_COLUMNS = [                              # (metrics.json key, column header, what it is)
    ("overall", "Overall", "(SST acc + Para acc + (STS r + 1) / 2) / 3, the leaderboard score"),
    ("sst_acc", "SST acc", "sentiment (SST-5) accuracy"),
    ("para_acc", "Para acc", "paraphrase (Quora) accuracy"),
    ("sts_pearson", "STS r", "similarity (STS) Pearson correlation"),
    ("mean", "Mean", "plain mean of the three task metrics"),
]
TASK_METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}
DIGITS = 3
MINUS = "\u2212"
DASH = "\u2014"


def is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def fmt_metric(x, digits: int = DIGITS) -> str:
    """0.51234 -> '0.512'; missing -> an em dash (never 0)."""
    return f"{x:.{digits}f}".replace("-", MINUS) if is_number(x) else DASH


def fmt_delta(x, digits: int = DIGITS) -> str:
    """Signed difference, rounded like the metrics: '+0.012', '−0.004', '±0.000'."""
    if not is_number(x):
        return ""
    text = f"{abs(x):.{digits}f}"
    if float(text) == 0:
        return "\u00b1" + text
    return ("+" if x > 0 else MINUS) + text


def delta_class(x) -> str:
    """'up' / 'down' for a difference that shows as non-zero once rounded, else ''."""
    text = fmt_delta(x)
    return "up" if text.startswith("+") else "down" if text.startswith(MINUS) else ""


@dataclass
class Cell:
    value: float | None
    delta: float | None = None                  # vs the study's baseline row
    best: bool = False


@dataclass
class Row:
    name: str
    kind: str                                   # experiment | ensemble
    description: str
    is_baseline: bool
    has_results: bool
    cells: dict = field(default_factory=dict)   # (split, metric key) -> Cell


@dataclass
class Table:
    name: str
    title: str
    source: str
    baseline: str | None
    columns: list                               # [(split, metric key, header, tooltip)]
    splits: list                                # the splits shown, in order
    rows: list
    notes: list = field(default_factory=list)

    def span(self, split: str) -> int:
        """How many columns a split's header spans."""
        return sum(1 for s, *_ in self.columns if s == split)


def metric_value(run: RunResults, split: str, key: str):
    v = run.split_metrics(split).get(key)
    return v if is_number(v) else None


def build_table(name: str, title: str, source: str, row_names: list[str], baseline: str | None,
                splits: list[str], data: ReportData) -> Table:
    runs = [data.runs[r] for r in row_names]
    notes = []
    shown_splits = []
    for split in splits:
        if any(run.split_metrics(split) for run in runs):
            shown_splits.append(split)
        elif split == "test" and any(run.split_metrics("dev") for run in runs):
            notes.append("No test scores: the test labels are not available.")
    # A column that is empty in every row (e.g. 'mean' when no row trains all tasks) is left out.
    columns = [(split, key, header, tip) for split in shown_splits for key, header, tip in METRIC_COLUMNS
               if any(metric_value(run, split, key) is not None for run in runs)]
    baseline = baseline or (row_names[0] if row_names else None)
    base_run = data.runs.get(baseline)
    rows = []
    for run in runs:
        description = _description(run.name, data)
        row = Row(run.name, run.kind, description, run.name == baseline, run.metrics is not None)
        for split, key, _, _ in columns:
            value = metric_value(run, split, key)
            base_value = metric_value(base_run, split, key) if base_run else None
            delta = (value - base_value if value is not None and base_value is not None
                     and run.name != baseline else None)
            row.cells[(split, key)] = Cell(value, delta)
        rows.append(row)
    for split, key, _, _ in columns:
        _mark_best([row.cells[(split, key)] for row in rows])
    missing = [r.name for r in rows if not r.has_results]
    if missing:
        notes.append(f"No results yet for {', '.join(missing)}: run the pipeline for them.")
    return Table(name, title, source, baseline, columns, shown_splits, rows, notes)


def _mark_best(cells: list[Cell]) -> None:
    """Bold the best cell of a column (all tied ones, compared as displayed); only when there is a
    choice, i.e. at least two rows have a value."""
    shown = [round(c.value, DIGITS) for c in cells if c.value is not None]
    if len(shown) < 2:
        return
    top = max(shown)
    for c in cells:
        if c.value is not None and round(c.value, DIGITS) == top:
            c.best = True


def _description(name: str, data: ReportData) -> str:
    if name in data.params.experiments:
        return data.params.experiments[name].description
    ens = data.params.params.ensembles[name]
    return ens.description or f"{ens.classification} / {ens.similarity} of {', '.join(ens.members)}"


def study_tables(data: ReportData) -> list[Table]:
    return [build_table(st.name, st.title, st.source, st.experiments, st.baseline, st.splits, data)
            for st in data.params.params.studies]


def ensemble_tables(data: ReportData) -> list[Table]:
    """Each ensemble below its members; deltas are against the best member (by dev overall)."""
    tables = []
    for name, ens in data.params.params.ensembles.items():
        best_member = best_of(ens.members, data) or ens.members[0]
        table = build_table(name, f"Ensemble {name} against its members", ens.description,
                            list(ens.members) + [name], best_member, ["dev", "test"], data)
        table.notes.insert(0, f"Tasks combined by {ens.classification} (classification) and "
                              f"{ens.similarity} (similarity); differences are against the best "
                              f"member, {best_member}.")
        tables.append(table)
    return tables


def selection_score(run: RunResults) -> float | None:
    """Dev overall score, or the mean of the dev task metrics available when overall is missing."""
    dev = run.split_metrics("dev")
    if is_number(dev.get("overall")):
        return float(dev["overall"])
    values = [dev[k] for k in TASK_METRIC.values() if is_number(dev.get(k))]
    return sum(values) / len(values) if values else None


def best_of(names, data: ReportData) -> str | None:
    """The name with the highest selection score; runs with an overall score beat those without,
    ties go to the first listed."""
    best, best_key = None, None
    for name in names:
        run = data.runs[name]
        score = selection_score(run)
        if score is None:
            continue
        key = (is_number(run.split_metrics("dev").get("overall")), score)
        if best_key is None or key > best_key:
            best, best_key = name, key
    return best


def best_experiment(data: ReportData) -> str | None:
    """The best model: the experiment (not ensemble) with the highest dev overall score."""
    return best_of(list(data.params.experiments), data)
