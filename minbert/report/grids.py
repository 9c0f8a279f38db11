"""A study's grid (`grid:`, minbert.params.GridParams): one experiment run over one or two axes of
settings. Two axes give a heatmap of the cells' dev overall scores (002's Table 3), one axis a sweep
plot (004's learning-rate and dropout sweeps); the best cell is marked under the rule of the study
tables (`best.best_verdict`). A repeated cell is the mean over its seeds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minbert.report.best import best_verdict
from minbert.report.data import ReportData
from minbert.report.formats import fmt_axis_value, is_number
from minbert.report.scores import ScoreBook, metric_columns
from minbert.scoring import stats


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


def build_grid(study, data: ReportData, book: ScoreBook, split: str = "dev") -> Grid | None:
    """The heatmap (two axes) or sweep (one axis) of a study's `grid:`: each cell the dev overall
    score (when no cell has one, the first metric that some cell has) with its interval, the colour
    scale over the grid's values, and the best mark under the rule of the study tables."""
    cells_of = data.params.grids.get(study.name)
    if study.grid is None or not cells_of:
        return None
    axes = [GridAxisView(a.name, a.key, list(a.values), [fmt_axis_value(v) for v in a.values])
            for a in study.grid.axes]
    names = [n for n, _ in cells_of]
    keys = [key for key, _, _ in metric_columns() if any(book.value(n, split, key) is not None for n in names)]
    metric = "overall" if "overall" in keys else next((k for k in keys if k != "mean"), "overall")
    header, title = next((h, t) for k, h, t in metric_columns() if k == metric)
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
                [(k, h) for k, h, _ in metric_columns() if k in keys and k != "mean"])
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


def study_grids(data: ReportData, book: ScoreBook) -> dict[str, Grid]:
    out = {}
    for st in data.params.params.studies:
        grid = build_grid(st, data, book)
        if grid is not None:
            out[st.name] = grid
    return out
