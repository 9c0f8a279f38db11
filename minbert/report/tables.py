"""The result tables: one per study (rows: experiments; columns: the papers' metrics per split),
the ensemble against its members, and the choice of the best model.

Every score comes with its uncertainty (minbert.scoring.stats): `ScoreBook` computes, once per report,
each run's bootstrap estimates from its predictions; a cell carries the value, its 95% interval,
the difference from the baseline row with its paired-bootstrap interval (significant when the
interval excludes 0), and the best mark (only when the best is significantly better than the
second best). A repeated experiment (`repeats`, a group of seed runs in `LoadedParams.groups`) is
one row with the mean ± std over its seeds and one sub-row per seed. A study's `summary:` adds rows
with the mean and the population std (ddof 0) of each column; its `grid:` gives a `Grid` (the
heatmap of two axes or the sweep of one) of the cells' dev overall scores.

Cells carry raw values; the templates format them with `fmt_metric` / `fmt_delta` /
`fmt_interval` so that every number on a page is rounded the same way.
"""
from __future__ import annotations

import math
import numbers
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.metrics import Undefined
from minbert.core.metrics import selection_score as _selection_score
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS
from minbert.data.read import target_sizes
from minbert.params import PAPER_OVERALL
from minbert.report.data import ReportData, RunResults
from minbert.scoring import stats

METRIC_COLUMNS = (                              # (metrics.json key, column header, what it is)
    [("overall", "Overall", "(SST acc + Para acc + (STS r + 1) / 2) / 3, the leaderboard score")]
    + [(t.metric_key, t.metric_header, t.metric_title) for t in TASKS.values()]
    + [("mean", "Mean", "plain mean of the three task metrics")])
# a paper's overall score, named on its study's tables
PAPER_OVERALL_HEADERS = {"leaderboard": "Overall (leaderboard, the paper's)", "mean": "Mean (the paper's score)"}
DIGITS = 3
MINUS = "\u2212"
DASH = "\u2014"
TOLERANCE = 1e-6                                # metrics.json against the same metric recomputed


def is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def fmt_metric(x, digits: int = DIGITS) -> str:
    """0.51234 -> '0.512'; missing -> an em dash (never 0); undefined (minbert.core.metrics.Undefined) -> 'undefined'."""
    if isinstance(x, Undefined):
        return "undefined"
    return f"{x:.{digits}f}".replace("-", MINUS) if is_number(x) else DASH


def fmt_delta(x, digits: int = DIGITS) -> str:
    """Signed difference, rounded like the metrics: '+0.012', '−0.004', '±0.000'."""
    if not is_number(x):
        return ""
    text = f"{abs(x):.{digits}f}"
    if float(text) == 0:
        return "\u00b1" + text
    return ("+" if x > 0 else MINUS) + text


def fmt_interval(iv, digits: int = DIGITS, signed: bool = False) -> str:
    """A 95% interval: '[0.483, 0.541]' ('[−0.004, +0.021]' for a difference); '' when absent."""
    if iv is None:
        return ""
    fmt = (lambda v: fmt_delta(v, digits)) if signed else (lambda v: fmt_metric(v, digits))
    return f"[{fmt(iv.low)}, {fmt(iv.high)}]"


def delta_class(x) -> str:
    """'up' / 'down' for a difference that shows as non-zero once rounded, else ''."""
    text = fmt_delta(x)
    return "up" if text.startswith("+") else "down" if text.startswith(MINUS) else ""


def metric_value(run: RunResults, split: str, key: str):
    v = run.split_metrics(split).get(key)
    return v if is_number(v) else None


# ------------------------------------------------------------------ the estimates

class ScoreBook:
    """Every score of the report with its bootstrap estimate (minbert.scoring.stats), computed once.

    Values come from metrics.json (what the pipeline reported); estimates from the labelled
    predictions, all runs of a task and split in one pass so that runs on the same examples share
    their resamples (paired). A run whose predictions do not reproduce its metrics.json gets no
    intervals and a note (re-run its evaluate stage). A group (repeated experiment) is the mean
    over its seeds (`stats.seed_mean`)."""

    def __init__(self, data: ReportData, resamples: int = stats.RESAMPLES, seed: int = stats.SEED,
                 confidence: float = stats.CONFIDENCE):
        self.data = data
        self.resamples, self.seed, self.confidence = resamples, seed, confidence
        self.groups: dict[str, list[str]] = dict(data.params.groups)
        self.problems: dict[str, str] = {}      # run -> why it has no intervals
        self._estimates: dict[tuple, stats.Estimate] = {}
        self._group_cache: dict[tuple, stats.Estimate | None] = {}
        samples: dict[tuple, dict] = defaultdict(dict)
        for name, run in data.runs.items():
            for (task, split) in sorted(run.predictions):
                frame = run.labelled(task, split)
                if frame is not None:
                    samples[(task, split)][name] = stats.Sample.of(frame)
        for (task, split), by_run in sorted(samples.items()):
            for name, est in stats.task_estimates(task, by_run, resamples, seed).items():
                self._estimates[(name, split, TASKS[task].metric_key)] = est
        for name in data.runs:
            for split in ("dev", "test"):
                by_task = {t: self._estimates[(name, split, TASKS[t].metric_key)] for t in LEADERBOARD_TASKS
                           if (name, split, TASKS[t].metric_key) in self._estimates}
                for key, est in stats.overall_estimates(by_task).items():
                    self._estimates[(name, split, key)] = est
        for (name, split, key), est in sorted(self._estimates.items(), key=lambda kv: kv[0]):
            reported = metric_value(data.runs[name], split, key)
            if reported is not None and abs(reported - est.value) > TOLERANCE and name not in self.problems:
                self.problems[name] = (f"The predictions of {name} give {split} {key} {est.value:.4f}, its "
                                       f"metrics.json {reported:.4f}: its intervals are left out; re-run its "
                                       f"evaluate stage.")
        for name in self.problems:
            for k in [k for k in self._estimates if k[0] == name]:
                del self._estimates[k]

    # ---------------------------------------------------------------- per name (run or group)
    def is_group(self, name: str) -> bool:
        return name in self.groups and name not in self.data.runs

    def members(self, name: str) -> list[str]:
        return self.groups[name] if self.is_group(name) else [name]

    def value(self, name: str, split: str, key: str) -> float | None:
        """The run's reported value, or a group's mean over the seeds that have it."""
        if not self.is_group(name):
            return metric_value(self.data.runs[name], split, key)
        return stats.mean_std(self.seed_values(name, split, key))[0]

    def seed_values(self, name: str, split: str, key: str) -> list[float]:
        return [v for m in self.members(name) if (v := metric_value(self.data.runs[m], split, key)) is not None]

    def estimate(self, name: str, split: str, key: str) -> stats.Estimate | None:
        """The bootstrap estimate; a group's only when every seed with a value has one."""
        if not self.is_group(name):
            return self._estimates.get((name, split, key))
        cache_key = (name, split, key)
        if cache_key not in self._group_cache:
            have = [m for m in self.members(name) if metric_value(self.data.runs[m], split, key) is not None]
            ests = [self._estimates.get((m, split, key)) for m in have]
            est = None
            if ests and all(e is not None for e in ests) and len({e.basis for e in ests}) == 1:
                est = stats.seed_mean(ests, name, self.seed)
            self._group_cache[cache_key] = est
        return self._group_cache[cache_key]

    def interval(self, name: str, split: str, key: str) -> stats.Interval | None:
        est = self.estimate(name, split, key)
        return est.interval(self.confidence) if est is not None else None

    def difference(self, a: str, b: str, split: str, key: str) -> stats.Estimate | None:
        """a - b, paired over the examples; None when either has no estimate; a MinBertError when
        they were scored on different examples."""
        ea, eb = self.estimate(a, split, key), self.estimate(b, split, key)
        if ea is None or eb is None:
            return None
        return ea.minus(eb)


# ------------------------------------------------------------------ tables

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


def build_table(name: str, title: str, source: str, row_names: list[str], baseline: str | None,
                splits: list[str], data: ReportData, book: ScoreBook | None = None,
                summary: list[str] = (), overall: str | None = None) -> Table:
    """A study's table; `overall` (a paper's formula, leaderboard | mean) keeps that one overall
    score, named as the paper's, and leaves the other out."""
    book = book or ScoreBook(data)
    runs_of = {r: book.members(r) for r in row_names}
    all_runs = [data.runs[m] for r in row_names for m in runs_of[r]]
    notes = []
    shown_splits = []
    for split in splits:
        if any(run.split_metrics(split) for run in all_runs):
            shown_splits.append(split)
        elif split == "test" and any(run.split_metrics("dev") for run in all_runs):
            notes.append("No test scores: the test labels are not available.")
    # A column that is empty in every row (e.g. 'mean' when no row trains all tasks) is left out.
    metric_columns = METRIC_COLUMNS
    if overall is not None:
        kept = PAPER_OVERALL[overall]
        metric_columns = [(key, PAPER_OVERALL_HEADERS[overall] if key == kept else header, tip)
                          for key, header, tip in METRIC_COLUMNS if key not in PAPER_OVERALL.values() or key == kept]
    columns = [(split, key, header, tip) for split in shown_splits for key, header, tip in metric_columns
               if any(metric_value(run, split, key) is not None for run in all_runs)]
    baseline = baseline or (row_names[0] if row_names else None)
    unpaired: set = set()
    rows = []
    for row_name in row_names:
        row = _row(row_name, baseline, columns, data, book, unpaired)
        rows.append(row)
    for split, key, _, _ in columns:
        _mark_best(rows, split, key, book, unpaired)
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
    shown_runs = {m for r in row_names for m in runs_of[r]}
    notes.extend(book.problems[n] for n in sorted(book.problems) if n in shown_runs)
    has_groups = any(r.kind == "group" for r in rows)
    return Table(name, title, source, baseline, columns, shown_splits, rows, notes, legend(book, has_groups),
                 summary_rows(rows, columns, summary))


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


def summary_rows(rows: list[Row], columns: list, which) -> list[SummaryRow]:
    """A study's `summary:` rows: per column, the mean or the population std (ddof 0) of the
    values of its rows (a repeated experiment counts once, as its mean; seeds do not count)."""
    out = []
    for kind in which:
        label, detail, title = SUMMARIES[kind]
        row = SummaryRow(kind, label, detail, title, n_rows=len(rows))
        for split, key, _, _ in columns:
            values = [r.cells[(split, key)].value for r in rows if r.cells[(split, key)].value is not None]
            value = None
            if values:
                value = float(np.mean(values)) if kind == "mean" else float(np.std(values, ddof=0))
            row.cells[(split, key)] = SummaryCell(value, len(values))
        out.append(row)
    return out


def _row(name: str, baseline: str | None, columns: list, data: ReportData, book: ScoreBook,
         unpaired: set) -> Row:
    members = book.members(name)
    first = data.runs[members[0]]
    kind = "group" if book.is_group(name) else first.kind
    row = Row(name, kind, _description(name, data), name == baseline,
              any(data.runs[m].metrics is not None for m in members),
              link=None if kind == "group" else name)
    for split, key, _, _ in columns:
        cell = Cell(book.value(name, split, key), book.interval(name, split, key))
        if kind == "group":
            mean, std, n = stats.mean_std(book.seed_values(name, split, key))
            cell.std, cell.n_seeds = std, n
        base_value = book.value(baseline, split, key) if baseline is not None else None
        if cell.value is not None and base_value is not None and name != baseline:
            cell.delta = cell.value - base_value
            try:
                diff = book.difference(name, baseline, split, key)
            except MinBertError:
                diff = None
                unpaired.add((name, baseline))
            if diff is not None:
                cell.delta_interval = diff.interval(book.confidence)
                cell.significant = cell.delta_interval.excludes_zero
        row.cells[(split, key)] = cell
    if kind == "group":
        row.total_seeds = len(members)
        for m in members:
            exp = data.params.experiments[m]
            sub = Row(m, "seed", "", False, data.runs[m].metrics is not None, label=f"seed {exp.seed}", link=m)
            for split, key, _, _ in columns:
                sub.cells[(split, key)] = Cell(book.value(m, split, key), book.interval(m, split, key))
            row.seeds.append(sub)
    return row


def _mark_best(rows: list[Row], split: str, key: str, book: ScoreBook, unpaired: set) -> None:
    """Mark the best cell of a column only when its row is significantly better than the second
    best (paired bootstrap over the same examples); there is a choice only with two rows or more."""
    cells = {r.name: r.cells[(split, key)] for r in rows}
    best, marked, note = best_verdict([(r.name, cells[r.name].value) for r in rows], split, key, book, unpaired)
    if best is not None:
        cells[best].best, cells[best].best_note = marked, note


def best_verdict(candidates: list[tuple[str, float | None]], split: str, key: str, book: ScoreBook,
                 unpaired: set) -> tuple[str | None, bool, str]:
    """(the highest-scoring name, whether it is significantly better than the second, why) over
    (name, value) pairs; (None, False, "") with fewer than two values. The one best-mark rule of
    the study tables and the grids."""
    ranked = sorted(((n, v) for n, v in candidates if v is not None), key=lambda nv: -nv[1])  # stable: ties keep order
    if len(ranked) < 2:
        return None, False, ""
    (best, value), (second, second_value) = ranked[0], ranked[1]
    if value == second_value:
        return best, False, f"tied with {second}"
    try:
        diff = book.difference(best, second, split, key)
    except MinBertError:
        unpaired.add((best, second))
        return best, False, ""
    if diff is None:
        return best, False, f"highest; no predictions to test it against {second}"
    iv = diff.interval(book.confidence)
    verdict = "significantly" if iv.low > 0 else "not significantly"
    return best, iv.low > 0, (f"highest, {verdict} better than {second}: {fmt_delta(diff.value)} "
                              f"{fmt_interval(iv, signed=True)}")


def _description(name: str, data: ReportData) -> str:
    if name in data.params.groups:
        return data.params.experiments[data.params.groups[name][0]].description
    if name in data.params.experiments:
        return data.params.experiments[name].description
    ens = data.params.params.ensembles[name]
    return ens.description or f"{ens.classification} / {ens.similarity} of {', '.join(ens.members)}"


def study_tables(data: ReportData, book: ScoreBook | None = None) -> list[Table]:
    book = book or ScoreBook(data)
    papers = data.params.params.papers
    return [build_table(st.name, st.title, st.source, st.experiments, st.baseline, st.splits, data, book,
                        st.summary, papers[st.paper.id].overall if st.paper else None)
            for st in data.params.params.studies]


# ------------------------------------------------------------------ grids (a study's sweep)

def fmt_axis_value(v) -> str:
    """A grid axis value as in the experiment names: 0.1, 1e-05, true, mean."""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass
class GridCell:
    name: str                                   # the cell's experiment (a repeated one: its group)
    coords: dict                                # axis name -> value
    value: float | None                         # the grid's metric on dev (a group: mean over its seeds)
    interval: stats.Interval | None = None
    has_results: bool = False
    std: float | None = None                    # over seeds (a repeated cell)
    n_seeds: int | None = None
    total_seeds: int = 0
    best: bool = False
    best_note: str = ""
    fraction: float | None = None               # on the colour scale: 0 the grid's lowest value, 1 its highest
    series: dict = field(default_factory=dict)  # metric key -> (value, interval), for the sweep plot


@dataclass
class GridAxisView:
    name: str                                   # the label (as in the experiment names)
    key: str                                    # the setting it changes (finetune.hidden_dropout)
    values: list
    labels: list                                # the values as text

    @property
    def numeric(self) -> bool:
        return all(is_number(v) for v in self.values)


@dataclass
class Grid:
    study: str
    experiment: str                             # the experiment every cell changes
    axes: list                                  # GridAxisView, one or two
    split: str
    metric: str                                 # the metrics.json key of the heatmap's cells
    header: str
    metric_title: str
    cells: list                                 # GridCell, the first axis varying slowest
    series_keys: list = field(default_factory=list)   # [(key, header)] of the sweep plot
    low: float | None = None                    # the colour scale's ends (the lowest and highest cell)
    high: float | None = None
    best: str | None = None                     # the marked cell, if any
    verdict: str = ""                           # the highest against the second: "NAME (significantly better ...)"
    notes: list = field(default_factory=list)

    @property
    def rows(self) -> list:
        """[(first-axis label, [cells along the second axis])]; one cell a row for a 1-D grid."""
        width = len(self.axes[1].values) if len(self.axes) > 1 else 1
        return [(label, self.cells[i * width:(i + 1) * width]) for i, label in enumerate(self.axes[0].labels)]

    @property
    def missing(self) -> int:
        return sum(1 for c in self.cells if c.value is None)


def build_grid(study, data: ReportData, book: ScoreBook | None = None, split: str = "dev") -> Grid | None:
    """The heatmap (two axes) or sweep (one axis) of a study's `grid:`: each cell the dev overall
    score (when no cell has one, the first metric that some cell has) with its interval, the colour
    scale over the grid's values, and the best mark under the rule of the study tables."""
    cells_of = data.params.grids.get(study.name)
    if study.grid is None or not cells_of:
        return None
    book = book or ScoreBook(data)
    axes = [GridAxisView(a.name, a.key, list(a.values), [fmt_axis_value(v) for v in a.values])
            for a in study.grid.axes]
    names = [n for n, _ in cells_of]
    keys = [key for key, _, _ in METRIC_COLUMNS if any(book.value(n, split, key) is not None for n in names)]
    metric = "overall" if "overall" in keys else next((k for k in keys if k != "mean"), "overall")
    header, title = next((h, t) for k, h, t in METRIC_COLUMNS if k == metric)
    cells = []
    for name, coords in cells_of:
        members = book.members(name)
        cell = GridCell(name, dict(coords), book.value(name, split, metric), book.interval(name, split, metric),
                        any(data.runs[m].metrics is not None for m in members))
        if book.is_group(name):
            _, cell.std, cell.n_seeds = stats.mean_std(book.seed_values(name, split, metric))
            cell.total_seeds = len(members)
        cell.series = {k: (book.value(name, split, k), book.interval(name, split, k)) for k in keys if k != "mean"}
        cells.append(cell)
    grid = Grid(study.name, study.grid.experiment, axes, split, metric, header, title, cells,
                [(k, h) for k, h, _ in METRIC_COLUMNS if k in keys and k != "mean"])
    values = [c.value for c in cells if c.value is not None]
    if values:
        grid.low, grid.high = min(values), max(values)
        for c in cells:
            if c.value is not None:
                c.fraction = (c.value - grid.low) / (grid.high - grid.low) if grid.high > grid.low else 0.5
    unpaired: set = set()
    best, marked, note = best_verdict([(c.name, c.value) for c in cells], split, metric, book, unpaired)
    for c in cells:
        if c.name == best:
            c.best, c.best_note = marked, note
            grid.best = best if marked else None
            grid.verdict = f"{best} ({note.removeprefix('highest, ').removeprefix('highest; ')})" if note else ""
    for a, b in sorted(unpaired):
        grid.notes.append(f"{a} and {b} were scored on different examples: the best cell is not tested.")
    return grid


def study_grids(data: ReportData, book: ScoreBook | None = None) -> dict[str, Grid]:
    book = book or ScoreBook(data)
    out = {}
    for st in data.params.params.studies:
        grid = build_grid(st, data, book)
        if grid is not None:
            out[st.name] = grid
    return out


def ensemble_tables(data: ReportData, book: ScoreBook | None = None) -> list[Table]:
    """Each ensemble below its members; deltas are against the best member (by dev overall)."""
    book = book or ScoreBook(data)
    tables = []
    for name, ens in data.params.params.ensembles.items():
        best_member = best_of(ens.members, data) or ens.members[0]
        table = build_table(name, f"Ensemble {name} against its members", ens.description,
                            list(ens.members) + [name], best_member, ["dev", "test"], data, book)
        table.notes.insert(0, f"Tasks combined by {ens.classification} (classification) and "
                              f"{ens.similarity} (similarity); differences are against the best "
                              f"member, {best_member}.")
        tables.append(table)
    return tables


def selection_score(run: RunResults) -> float | None:
    """The run's dev selection score (minbert.core.metrics.selection_score) over the leaderboard tasks
    it has (the overall score when it has all three), else over the tasks it has."""
    dev = run.split_metrics("dev")
    score = _selection_score(dev, LEADERBOARD_TASKS)
    return score if score is not None else _selection_score(dev)


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


# ------------------------------------------------------------------ the paper's table and its claims

VERDICTS = ("reproduced", "not significant", "reversed", "differs", "inconclusive", "not run")
VERDICT_TITLES = {
    "reproduced": "a difference: the same sign as the paper's, and its paired-bootstrap interval excludes 0; no effect: "
                  "the interval lies within the claim's margin",
    "not significant": "a difference: the paired-bootstrap interval of our difference contains 0",
    "reversed": "a difference: the opposite sign to the paper's, and its interval excludes 0",
    "differs": "no effect: the interval excludes 0 and reaches beyond the claim's margin",
    "inconclusive": "no effect: the interval contains 0 but reaches beyond the claim's margin",
    "not run": "one of the two rows has no dev scores (with predictions) yet",
}


def claim_verdict(paper_difference: float | None, ours: stats.Estimate | None, confidence: float = stats.CONFIDENCE,
                  margin: float | None = None) -> str:
    """A claim's verdict from ours (a paired bootstrap estimate of the claim's first row − its
    second). A difference claim (the paper's difference better − worse, positive; None where the
    paper states it in words only): reproduced, not significant, reversed. A no-effect claim
    (`margin` given): reproduced when our interval lies within ±margin (an equivalence test),
    differs when it excludes 0, inconclusive otherwise. Not run without an estimate."""
    if ours is None:
        return "not run"
    iv = ours.interval(confidence)
    if margin is not None:
        if -margin <= iv.low and iv.high <= margin:
            return "reproduced"
        return "differs" if iv.excludes_zero else "inconclusive"
    if not iv.excludes_zero:
        return "not significant"
    paper_sign = paper_difference is None or paper_difference > 0
    return "reproduced" if (ours.value > 0) == paper_sign else "reversed"


@dataclass
class PaperCell:
    paper: float | None                         # the value the paper prints
    value: float | None = None                  # ours
    interval: stats.Interval | None = None
    difference: float | None = None             # ours − the paper's
    outside: bool = False                       # the paper's value lies outside our interval


@dataclass
class PaperRowView:
    label: str
    run: str | None                             # what stands for the row here (best_of: the chosen one)
    description: str
    has_results: bool
    note: str = ""                              # how a best-of row was chosen
    link: str | None = None                     # the run's page (a repeated experiment has none)
    stand_in: str = ""                          # how the run differs from the paper's method for the row
    cells: dict = field(default_factory=dict)   # (split, column name) -> PaperCell


@dataclass
class ClaimView:
    study: str
    text: str
    better: str                                 # row labels
    worse: str
    column: str
    split: str
    paper_difference: float
    better_run: str | None
    worse_run: str | None
    difference: float | None = None             # ours, better − worse
    interval: stats.Interval | None = None
    verdict: str = "not run"
    kind: str = "difference"                    # difference | no_effect (better, worse: the two rows)
    margin: float | None = None                 # no effect: the largest difference that counts as none
    margin_reason: str = ""
    quote: str = ""                             # the paper's words
    proxy: str = ""                             # why this comparison stands for what the paper states


@dataclass
class PaperTableView:
    study: str
    paper_id: str
    paper_title: str
    table: str
    formula: str                                # leaderboard | mean
    formula_text: str
    columns: list                               # [(split, column name, metrics.json key)]
    splits: list
    rows: list                                  # PaperRowView
    summary: list = field(default_factory=list)   # [(label, kind, {(split, name): PaperCell})]
    claims: list = field(default_factory=list)  # ClaimView
    scale: str = ""                             # how this run's scale differs from the paper's
    differs: list = field(default_factory=list)   # PaperDifference: the catalogue's other settings vs the paper's
    total_rows: int = 0                         # the paper table's rows
    shown_rows: int = 0                         # those a run here stands for
    overall_name: str = ""                      # the paper's overall column, as printed ("" when it has none)
    stand_ins: bool = False                     # a row's run is not the paper's method (a "compares to" column)

    def span(self, split: str) -> int:
        return sum(1 for s, *_ in self.columns if s == split)


FORMULA_TEXT = {"leaderboard": "(SST acc + Para acc + (STS r + 1) / 2) / 3, the leaderboard score",
                "mean": "the plain mean of SST acc, Para acc and STS r"}


def paper_metric_key(metric: str, formula: str) -> str:
    """The metrics.json key a paper column reads: its overall in the paper's formula, else the metric."""
    return PAPER_OVERALL[formula] if metric == "overall" else metric


def _dev_score(name: str, book: ScoreBook) -> float | None:
    """The dev selection score of a run or group: the overall score, else the mean of its task metrics."""
    overall = book.value(name, "dev", "overall")
    if overall is not None:
        return overall
    values = [v for t in TASKS.values() if (v := book.value(name, "dev", t.metric_key)) is not None]
    return float(np.mean(values)) if values else None


def _has_results(name: str, book: ScoreBook) -> bool:
    return any(book.data.runs[m].metrics is not None for m in book.members(name))


def row_run(row, book: ScoreBook) -> tuple[str | None, str]:
    """What stands for a paper row: its run, or the best by dev of its `best_of` (and why)."""
    if row.run is not None:
        return row.run, ""
    scored = [(n, s) for n in row.best_of if (s := _dev_score(n, book)) is not None]
    if not scored:
        return None, f"the best by dev of {len(row.best_of)} runs, none of which has results yet"
    best = max(scored, key=lambda ns: ns[1])[0]          # ties: the first listed
    return best, f"the best by dev overall of {len(row.best_of)} runs ({len(scored)} with results): {best}"


def scale_line(lp, paper, runs: list[str], data_summary: list[dict], table_data: dict | None = None) -> str:
    """One line saying how this run's scale (model, epochs, training rows) differs from the
    paper's, from the resolved settings of the rows' experiments (their downsampling included) and
    the prepare summary; '' when nothing differs. `table_data`: the training rows of this table's
    rows where they differ from the paper's (`StudyPaper.data`)."""
    paper_rows = {**paper.data, **(table_data or {})}
    exps = []
    for name in runs:
        if name in lp.params.ensembles:
            names = lp.params.ensembles[name].members
        else:
            names = lp.groups.get(name, [name])
        exps += [lp.experiments[n] for n in names if n in lp.experiments]
    if not exps:
        return ""
    parts = []
    models = sorted({e.model for e in exps})
    if models != [paper.model]:
        parts.append(f"model {', '.join(models)} (the paper: {paper.model})")
    epochs = sorted({e.finetune.epochs for e in exps})
    steps = sorted({e.finetune.max_steps_per_epoch for e in exps if e.finetune.max_steps_per_epoch})
    if paper.epochs is not None and (epochs != [paper.epochs] or steps):
        text = f"{'/'.join(map(str, epochs))} epoch{'s' if epochs != [1] else ''}"
        if steps:
            text += f" of at most {'/'.join(map(str, steps))} step{'s' if steps != [1] else ''}"
        parts.append(f"{text} (the paper: {paper.epochs} for most rows)")
    kept = {}
    for r in data_summary:
        name = str(r.get("file", ""))
        rows = r.get("rows_kept")
        for task in TASKS:      # every task: `smallest` downsampling compares an experiment's tasks
            if name == f"{task}-train.tsv" and isinstance(rows, int):
                kept[task] = rows
    # the rows each experiment trains on: the prepared rows after its own downsampling (mode, caps)
    trained: dict[str, set] = {}
    for e in exps:
        sizes = {t: kept[t] for t in e.finetune.tasks if t in kept}
        for t, n in target_sizes(sizes, e.finetune.downsample).items():
            trained.setdefault(t, set()).add(n)
    # the paper's training rows where it prints them; else its data set's size, said to be no more
    smaller = [f"{TASKS[t].short} {'/'.join(f'{n:,}' for n in sorted(trained[t]))} (the paper: {n_paper:,})"
               for t, n_paper in paper_rows.items()
               if t in trained and not all(0.9 <= n / n_paper <= 1.1 for n in trained[t])]
    smaller += [f"{TASKS[t].short} {'/'.join(f'{n:,}' for n in sorted(trained[t]))} (the paper: not stated, "
                f"of a data set of {n_total:,})"
                for t, n_total in paper.totals.items() if t in trained and t not in paper_rows]
    if smaller:
        parts.append("training rows " + ", ".join(smaller))
    return ("Scale differs from the paper's: " + "; ".join(parts) + ".") if parts else ""


def summary_interval(runs: list[str], kind: str, split: str, key: str, book: ScoreBook) -> stats.Interval | None:
    """The interval of a summary row (the mean or the ddof-0 std over the table's rows), each
    bootstrap replicate the summary of the rows' replicates (the same resample of the same
    examples for every row; a repeated experiment's replicates also resample its seeds); None
    unless every row with a value has an estimate on the same examples."""
    ests = [book.estimate(r, split, key) for r in runs if book.value(r, split, key) is not None]
    if not ests or any(e is None for e in ests) or len({e.basis for e in ests}) != 1:
        return None
    reps = np.stack([e.replicates for e in ests])               # [rows, resamples]
    summary = reps.mean(axis=0) if kind == "mean" else reps.std(axis=0, ddof=0)
    return stats.percentile_interval(summary, book.confidence)


def paper_table(study, data: ReportData, book: ScoreBook) -> PaperTableView | None:
    """A study's paper table: the paper's rows and columns, each cell the paper's value beside
    ours (interval, difference, whether the paper's value lies outside our interval), the summary
    rows over the same rows, and each claim's verdict."""
    sp = study.paper
    if sp is None:
        return None
    lp = data.params
    paper = lp.params.papers[sp.id]
    splits = [s for s in ("dev", "test") if s == "dev" or any(getattr(r, s) for r in sp.rows)]
    columns = [(s, c.name, paper_metric_key(c.metric, paper.overall)) for s in splits for c in sp.columns]
    view = PaperTableView(study.name, sp.id, paper.title, sp.table, paper.overall, FORMULA_TEXT[paper.overall],
                          columns, splits, [], differs=list(paper.differs),
                          total_rows=sp.printed_rows or sum(1 for r in sp.rows if not r.from_table),
                          shown_rows=sum(1 for r in sp.rows if not r.from_table),
                          overall_name=next((c.name for c in sp.columns if c.metric == "overall"), ""),
                          stand_ins=any(r.stand_in for r in sp.rows))
    chosen = {}
    for row in sp.rows:
        run, note = row_run(row, book)
        chosen[row.label] = run
        rv = PaperRowView(row.label, run, _description(run, data) if run else "",
                          run is not None and _has_results(run, book), note,
                          run if run is not None and not book.is_group(run) else None, row.stand_in)
        for split, name, key in columns:
            cell = PaperCell(getattr(row, split).get(name))
            if run is not None:
                cell.value = book.value(run, split, key)
                cell.interval = book.interval(run, split, key)
            if cell.value is not None and cell.paper is not None:
                cell.difference = cell.value - cell.paper
                cell.outside = cell.interval is not None and not (cell.interval.low <= cell.paper <= cell.interval.high)
            rv.cells[(split, name)] = cell
        view.rows.append(rv)
    for kind in [k for k in ("mean", "std") if k in sp.summary or k in study.summary]:
        label = SUMMARIES[kind][0]
        cells = {}
        for split, name, key in columns:
            ours = [r.cells[(split, name)].value for r in view.rows if r.cells[(split, name)].value is not None]
            value = None
            if ours:
                value = float(np.mean(ours)) if kind == "mean" else float(np.std(ours, ddof=0))
            printed = sp.summary.get(kind, {}).get(name) if split == "dev" else None
            cell = PaperCell(printed, value)
            if value is not None:
                cell.interval = summary_interval([r.run for r in view.rows if r.run], kind, split, key, book)
            if value is not None and printed is not None:
                cell.difference = value - printed
                cell.outside = cell.interval is not None and not (cell.interval.low <= printed <= cell.interval.high)
            cells[(split, name)] = cell
        view.summary.append((label, kind, cells))
    for claim in sp.claims:
        key = paper_metric_key(sp.column(claim.column).metric, paper.overall)
        first, second = claim.rows
        cv = ClaimView(study.name, claim.text, first, second, claim.column, claim.split,
                       sp.paper_difference(claim), chosen[first], chosen[second], kind=claim.kind,
                       margin=claim.margin, margin_reason=claim.margin_reason, quote=claim.quote, proxy=claim.proxy)
        est = None
        if cv.better_run and cv.worse_run:
            try:
                est = book.difference(cv.better_run, cv.worse_run, claim.split, key)
            except MinBertError:
                est = None
        if est is not None:
            cv.difference, cv.interval = est.value, est.interval(book.confidence)
        cv.verdict = claim_verdict(cv.paper_difference, est, book.confidence, claim.margin)
        view.claims.append(cv)
    view.scale = scale_line(lp, paper, [r for r in chosen.values() if r], data.data_summary, sp.data)
    return view


def paper_tables(data: ReportData, book: ScoreBook | None = None) -> dict[str, PaperTableView]:
    book = book or ScoreBook(data)
    return {st.name: t for st in data.params.params.studies if (t := paper_table(st, data, book)) is not None}


@dataclass
class Scorecard:
    claims: list                                # ClaimView, every study's
    counts: dict                                # verdict -> number
    demo: bool                                  # the demo data: the verdicts say nothing of the papers
    scales: list = field(default_factory=list)  # [(study, its scale line)]: how these runs' scale differs
    devices: list = field(default_factory=list)   # where the numbers were made, from the run records


def devices_of(data: ReportData) -> list[str]:
    """Every device the stages ran on, as their run records say ("cuda (NVIDIA H100 80GB HBM3)",
    "cpu"), with how many stage runs each."""
    seen: dict[str, int] = {}
    for info in data.run_infos:
        device = str(info.get("device") or "unknown device")
        gpu = info.get("gpu")
        text = f"{device} ({gpu})" if gpu else device
        seen[text] = seen.get(text, 0) + 1
    return [f"{d}: {n} stage run{'s' if n != 1 else ''}" for d, n in sorted(seen.items())]


def scorecard(tables: dict[str, PaperTableView], data: ReportData) -> Scorecard:
    claims = [c for t in tables.values() for c in t.claims]
    counts = {v: sum(1 for c in claims if c.verdict == v) for v in VERDICTS}
    demo = str(data.params.params.data.dir).rstrip("/").endswith("data/demo")
    scales = [(name, t.scale) for name, t in tables.items() if t.scale and t.claims]
    return Scorecard(claims, counts, demo, scales, devices_of(data))
