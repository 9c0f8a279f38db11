"""The result tables: one per study (rows: its experiments; columns: the papers' metrics per split)
and each ensemble against its members, with the study's summary rows.

A cell carries the value, its 95% interval, the difference from the baseline row with its
paired-bootstrap interval (significant when the interval excludes 0), and the best mark (only when
the best is significantly better than the second best: `best.best_verdict`). A repeated experiment
is one row with the mean ± std over its seeds and one sub-row per seed. A study's `summary:` adds
rows with the mean and the population std (ddof 0) of each column.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minbert.core.errors import MinBertError
from minbert.params.studies import PAPER_OVERALL, StudyParams
from minbert.report.best import best_of, best_verdict
from minbert.report.data import ReportData
from minbert.report.scores import ScoreBook, metric_columns, metric_value
from minbert.scoring import stats

# a paper's overall score, named on its study's tables
PAPER_OVERALL_HEADERS = {"leaderboard": "Overall (leaderboard, the paper's)", "mean": "Mean (the paper's score)"}


@dataclass
class Cell:
    value: float | None
    interval: stats.Interval | None = None      # 95% bootstrap interval of the value
    delta: float | None = None                  # vs the study's baseline row
    delta_interval: stats.Interval | None = None   # paired bootstrap
    significant: bool = False                   # delta_interval excludes 0
    best: bool = False                          # the column's best, significantly better than the second
    best_note: str = ""                         # why (or why not) for the tooltip
    std: float | None = None                    # over seeds (group rows)
    n_seeds: int | None = None                  # seeds with a value (group rows)


@dataclass
class Row:
    name: str
    kind: str                                   # experiment | ensemble | group | seed
    description: str
    is_baseline: bool
    has_results: bool
    cells: dict = field(default_factory=dict)   # (split, metric key) -> Cell
    label: str = ""                             # shown instead of the name (seed sub-rows)
    link: str | None = None                     # the page of the run (None: a group has none)
    seeds: list = field(default_factory=list)   # a group's sub-rows, one per seed
    total_seeds: int = 0                        # seeds in a group (with results or not)


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
    legend: str = ""                            # the one line that explains intervals and marks
    summary: list = field(default_factory=list)   # SummaryRow: the mean / std of each column

    def span(self, split: str) -> int:
        """How many columns a split's header spans."""
        return sum(1 for s, *_ in self.columns if s == split)


def legend(book: ScoreBook, groups: bool) -> str:
    text = (f"[low, high]: {book.confidence:.0%} bootstrap interval over the examples ({book.resamples:,} "
            f"resamples). Under each score, the difference from the baseline: * when its paired-bootstrap "
            f"interval excludes 0 (hover for it). \u25B2 best only when significantly better than the "
            f"second best.")
    if groups:
        text += (" Repeated experiments: mean \u00b1 std over n seeds, interval over seeds and examples; "
                 "each seed below.")
    return text



def table_columns(study, runs: list, data: ReportData) -> tuple[list, list, list]:
    """(columns [(split, key, header, tooltip)], the splits shown, notes) of a study's table over
    the runs of its rows: a split only where a run has scores on it; a column left out where every
    row is empty (e.g. 'mean' when no row trains all tasks); a study with a paper table keeps the
    paper's overall score, named as the paper's, and not the other."""
    notes, shown_splits = [], []
    for split in study.splits:
        if any(run.split_metrics(split) for run in runs):
            shown_splits.append(split)
        elif split == "test" and any(run.split_metrics("dev") for run in runs):
            notes.append("No test scores: the test labels are not available.")
    shown = metric_columns()
    if study.paper is not None:
        overall = data.params.params.papers[study.paper.id].overall
        kept = PAPER_OVERALL[overall]
        shown = [(key, PAPER_OVERALL_HEADERS[overall] if key == kept else header, tip)
                 for key, header, tip in shown if key not in PAPER_OVERALL.values() or key == kept]
    columns = [(split, key, header, tip) for split in shown_splits for key, header, tip in shown
               if any(metric_value(run, split, key) is not None for run in runs)]
    return columns, shown_splits, notes


def build_table(study, data: ReportData, book: ScoreBook) -> Table:
    """A study's table (minbert.params.studies.StudyParams: its rows, baseline, splits, summary rows
    and paper), every row against the baseline row (the first row unless the study names one)."""
    shown_runs = [m for r in study.experiments for m in book.members(r)]
    columns, splits, notes = table_columns(study, [data.runs[m] for m in shown_runs], data)
    baseline = study.baseline or (study.experiments[0] if study.experiments else None)
    unpaired: set = set()
    rows = [_row(name, baseline, columns, book, unpaired) for name in study.experiments]
    for split, key, _, _ in columns:
        _mark_best(rows, split, key, book, unpaired)
    notes += _row_notes(rows, unpaired)
    notes.extend(book.problems[n] for n in sorted(book.problems) if n in set(shown_runs))
    has_groups = any(r.kind == "group" for r in rows)
    return Table(study.name, study.title, study.source, baseline, columns, splits, rows, notes,
                 legend(book, has_groups), summary_rows(rows, columns, study.summary))


def _row_notes(rows: list[Row], unpaired: set) -> list[str]:
    """What a table says under it of its rows: those without results, a repeated experiment with
    seeds still missing, pairs whose difference could not be tested."""
    notes = []
    missing = [r.name for r in rows if not r.has_results]
    if missing:
        notes.append(f"No results yet for {', '.join(missing)}: run the pipeline for them.")
    for r in rows:
        if r.kind == "group" and r.has_results:
            have = sum(1 for s in r.seeds if s.has_results)
            if have < r.total_seeds:
                notes.append(f"{r.name}: {have} of {r.total_seeds} seeds have results so far.")
    for pair in sorted(unpaired):
        notes.append(f"{pair[0]} and {pair[1]} were scored on different examples: their difference is "
                     f"not tested (re-run their predictions on the same data).")
    return notes


def _row(name: str, baseline: str | None, columns: list, book: ScoreBook, unpaired: set) -> Row:
    data = book.data
    members = book.members(name)
    kind = "group" if book.is_group(name) else data.runs[members[0]].kind
    row = Row(name, kind, description(name, data), name == baseline,
              any(data.runs[m].metrics is not None for m in members),
              link=None if kind == "group" else name)
    for split, key, _, _ in columns:
        row.cells[(split, key)] = _cell(name, baseline, split, key, book, unpaired)
    if kind == "group":
        row.total_seeds = len(members)
        row.seeds = [_seed_row(m, columns, book) for m in members]
    return row


def _cell(name: str, baseline: str | None, split: str, key: str, book: ScoreBook, unpaired: set) -> Cell:
    """A row's cell: its value and interval, a group's spread over seeds, the difference from the
    baseline with its paired interval."""
    cell = Cell(book.value(name, split, key), book.interval(name, split, key))
    if book.is_group(name):
        _, cell.std, cell.n_seeds = stats.mean_std(book.seed_values(name, split, key))
    base_value = book.value(baseline, split, key) if baseline is not None else None
    if cell.value is None or base_value is None or name == baseline:
        return cell
    cell.delta = cell.value - base_value
    try:
        diff = book.difference(name, baseline, split, key)
    except MinBertError:
        diff = None
        unpaired.add((name, baseline))
    if diff is not None:
        cell.delta_interval = diff.interval(book.confidence)
        cell.significant = cell.delta_interval.excludes_zero
    return cell


def _seed_row(name: str, columns: list, book: ScoreBook) -> Row:
    """The sub-row of one seed of a repeated experiment: its own scores, no difference, no mark."""
    run = book.data.runs[name]
    row = Row(name, "seed", "", False, run.metrics is not None,
              label=f"seed {book.data.params.experiments[name].seed}", link=name)
    for split, key, _, _ in columns:
        row.cells[(split, key)] = Cell(book.value(name, split, key), book.interval(name, split, key))
    return row


def _mark_best(rows: list[Row], split: str, key: str, book: ScoreBook, unpaired: set) -> None:
    """Mark the best cell of a column only when its row is significantly better than the second
    best (paired bootstrap over the same examples); there is a choice only with two rows or more."""
    cells = {r.name: r.cells[(split, key)] for r in rows}
    best, marked, note = best_verdict([(r.name, cells[r.name].value) for r in rows], split, key, book, unpaired)
    if best is not None:
        cells[best].best, cells[best].best_note = marked, note


def description(name: str, data: ReportData) -> str:
    """What a row is: its experiment's description (a repeated one's first seed's), or an ensemble's."""
    if name in data.params.groups:
        return data.params.experiments[data.params.groups[name][0]].description
    if name in data.params.experiments:
        return data.params.experiments[name].description
    ens = data.params.params.ensembles[name]
    return ens.description or f"{ens.classification} / {ens.similarity} of {', '.join(ens.members)}"


def study_tables(data: ReportData, book: ScoreBook) -> list[Table]:
    return [build_table(study, data, book) for study in data.params.params.studies]


def ensemble_study(name: str, data: ReportData, book: ScoreBook) -> StudyParams:
    """An ensemble's table as a study: its members and itself, against the best member (by the dev
    selection score)."""
    ens = data.params.params.ensembles[name]
    reference = best_of(ens.members, book) or ens.members[0]
    return StudyParams(name=name, title=f"Ensemble {name} against its members", source=ens.description,
                       experiments=[*ens.members, name], baseline=reference)


def ensemble_tables(data: ReportData, book: ScoreBook) -> list[Table]:
    """Each ensemble below its members; differences are against the best member."""
    tables = []
    for name, ens in data.params.params.ensembles.items():
        table = build_table(ensemble_study(name, data, book), data, book)
        table.notes.insert(0, f"Tasks combined by {ens.classification} (classification) and "
                              f"{ens.similarity} (similarity); differences are against the best "
                              f"member, {table.baseline}.")
        tables.append(table)
    return tables


# ------------------------------------------------------------------ summary rows

@dataclass
class SummaryCell:
    value: float | None
    n: int                                      # rows with a value in the column


@dataclass
class SummaryRow:
    kind: str                                   # mean | std
    label: str
    detail: str                                 # under the label: how it is computed
    title: str                                  # tooltip
    cells: dict = field(default_factory=dict)   # (split, metric key) -> SummaryCell
    n_rows: int = 0                             # rows of the table (a cell with fewer says n=)


SUMMARIES = {"mean": ("Mean", "", "the mean of each column over the rows above that have a value"),
             "std": ("Std dev.", "population, ddof 0",
                     "the population standard deviation (ddof 0: divided by n, not n \u2212 1) of each column "
                     "over the rows above that have a value")}


def summarise_values(values: list[float], kind: str) -> float | None:
    """A summary row's value over a column's values: their mean, or their population std (ddof 0,
    as 004's Table 2 computes its Std Dev.); None without values."""
    if not values:
        return None
    return float(np.mean(values)) if kind == "mean" else float(np.std(values, ddof=0))


def summary_rows(rows: list[Row], columns: list, which) -> list[SummaryRow]:
    """A study's `summary:` rows: per column, the mean or the population std (ddof 0) of the
    values of its rows (a repeated experiment counts once, as its mean; seeds do not count)."""
    out = []
    for kind in which:
        label, detail, title = SUMMARIES[kind]
        row = SummaryRow(kind, label, detail, title, n_rows=len(rows))
        for split, key, _, _ in columns:
            values = [r.cells[(split, key)].value for r in rows if r.cells[(split, key)].value is not None]
            row.cells[(split, key)] = SummaryCell(summarise_values(values, kind), len(values))
        out.append(row)
    return out
