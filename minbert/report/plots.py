"""Figures for the report, as inline PNG data URIs (the pages open from disk with no network).

Uses matplotlib's object API (no pyplot global state) and writes no timestamp or software tag
into the PNG, so the same inputs give byte-identical images.
"""
from __future__ import annotations

import base64
import io
import textwrap

import numpy as np
import pandas as pd
from matplotlib import colormaps, rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, NullLocator

from minbert.core.metrics import pearson
from minbert.core.tasks import TASKS
from minbert.report.formats import fmt_metric
from minbert.report.grids import Grid
from minbert.report.tables import Table

STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
         "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
         "grid.alpha": 0.3, "svg.hashsalt": "minbert-report"}
COLORS = ["#3b6ea5", "#e07b39", "#5a9e57", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c",
          "#ccb974", "#64b5cd"]
DPI = 110


def to_data_uri(fig: Figure, tight: bool = False) -> str:
    """PNG data URI. Figures lay themselves out with fixed margins: "tight" bounding boxes and
    constrained layout cost extra draws, which add up over dozens of pages."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight" if tight else None,
                metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def study_plot(table: Table, split: str = "dev") -> str | None:
    """The study's bar chart (`study_figure`) as a data URI."""
    with rc_context(STYLE):
        fig = study_figure(table, split)
        return to_data_uri(fig, tight=True) if fig is not None else None      # the legend sits outside the axes


def study_figure(table: Table, split: str = "dev") -> Figure | None:
    """Grouped bars: one group per metric, one bar per row (the study's comparison), each with its
    95% bootstrap interval as an error bar; a repeated experiment's bar is the mean over its seeds,
    with each seed as a dot. The plain mean is left out beside the overall score (it repeats the
    three tasks), kept where it is the table's score (a paper whose score is the mean)."""
    keys = [(key, header) for s, key, header, _ in table.columns if s == split]
    if any(key == "overall" for key, _ in keys):
        keys = [(key, header) for key, header in keys if key != "mean"]
    rows = [r for r in table.rows if r.has_results]
    if not keys or not rows:
        return None
    with rc_context(STYLE):
        fig = Figure(figsize=(max(5.0, 1.2 + 0.35 * len(rows) * len(keys)), 3.0))
        ax = fig.add_subplot()
        low = 0.0
        for i, row in enumerate(rows):
            colour = COLORS[table.rows.index(row) % len(COLORS)]   # a row keeps its colour as results arrive
            low = min(low, _row_bars(ax, row, [key for key, _ in keys], split, i - (len(rows) - 1) / 2,
                                     0.8 / len(rows), colour))
        ax.set_ylim(low - 0.05 if low < 0 else 0.0, 1.0)   # room below a negative Pearson r
        ax.set_ylabel(f"{split} score")
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fit_tick_labels(fig, ax, np.arange(len(keys)), [h for _, h in keys])
        return fig


def _row_bars(ax, row, keys: list[str], split: str, offset: float, width: float, colour: str) -> float:
    """One row's bars (a missing metric is no bar, not 0), error bars and seed dots; returns the
    lowest value drawn (or 0)."""
    cells = [row.cells[(split, key)] for key in keys]
    shown = [j for j, c in enumerate(cells) if c.value is not None]
    pos = np.arange(len(keys))[shown] + offset * width
    values = [cells[j].value for j in shown]
    label = row.name + (" (baseline)" if row.is_baseline else "")
    if row.kind == "group":
        label += f" (mean of {max(c.n_seeds or 0 for c in cells)} seeds)"
    ax.bar(pos, values, width, label=label, color=colour, hatch="//" if row.kind == "ensemble" else None,
           edgecolor="white")
    with_iv = [(p, cells[j]) for p, j in zip(pos, shown) if cells[j].interval is not None]
    if with_iv:
        err = np.array([[c.value - c.interval.low for _, c in with_iv],
                        [c.interval.high - c.value for _, c in with_iv]]).clip(0, None)
        ax.errorbar([p for p, _ in with_iv], [c.value for _, c in with_iv], yerr=err, fmt="none",
                    ecolor="#222", elinewidth=0.9, capsize=2.5)
    for seed_row in row.seeds:
        dots = [(p, v) for p, j in zip(pos, shown) if (v := seed_row.cells[(split, keys[j])].value) is not None]
        if dots:
            ax.plot([p for p, _ in dots], [v for _, v in dots], linestyle="none", marker="o", markersize=2.8,
                    markerfacecolor="white", markeredgecolor="#222", markeredgewidth=0.7)
    return min([0.0, *values, *(c.interval.low for _, c in with_iv)])


LABEL_WIDTHS = (None, 24, 18, 14, 11, 8, 6)     # characters per line tried, widest first (None: as written)


def fit_tick_labels(fig: Figure, ax, positions, labels: list[str]) -> None:
    """Tick labels at `positions` that never run into each other: as written when they fit the room
    between two ticks, else wrapped to the widest line width that fits, else cut with an ellipsis."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    ax.get_xlim()                                       # settles the autoscaled limits the positions map through
    x = ax.transData.transform([(p, 0.0) for p in positions])[:, 0]
    room = 0.92 * (float(np.min(np.diff(x))) if len(x) > 1 else ax.get_window_extent(renderer).width)

    def fits(texts) -> bool:
        ax.set_xticks(positions, texts)
        return all(t.get_window_extent(renderer).width <= room for t in ax.get_xticklabels())

    for width in LABEL_WIDTHS:
        if fits(labels if width is None else [textwrap.fill(t, width) for t in labels]):
            return
    cut = [textwrap.fill(t, LABEL_WIDTHS[-1]) for t in labels]
    for chars in range(LABEL_WIDTHS[-1], 0, -1):         # a slot narrower than six characters: cut the lines
        cut = ["\n".join(line if len(line) <= chars else line[:chars] + "\u2026" for line in t.split("\n"))
               for t in cut]
        if fits(cut):
            return
    ax.set_xticks(positions, [""] * len(positions))      # no room for any text: no label rather than an overlap


# ------------------------------------------------------------------ grids

HEAT_MAP = "YlGnBu"                 # sequential, light (low) to dark blue (high); colour-blind safe
HEAT_RANGE = (0.08, 0.78)           # the part of it used: the lightest is not white, the darkest keeps text legible


def heat_colours(fraction) -> tuple[str, str]:
    """(background, text) colours of a grid cell at `fraction` of the grid's range (0: its lowest
    value, 1: its highest); the text is white on the dark end."""
    lo, hi = HEAT_RANGE
    r, g, b, _ = colormaps[HEAT_MAP](lo + (hi - lo) * min(max(float(fraction), 0.0), 1.0))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return to_hex((r, g, b)), "#ffffff" if luminance < 0.5 else "#1f2328"


def heat_gradient(steps: int = 11) -> str:
    """The colour scale as a CSS gradient (for the legend under a heatmap)."""
    return "linear-gradient(to right, " + ", ".join(heat_colours(i / (steps - 1))[0] for i in range(steps)) + ")"


def log_spaced(x) -> bool:
    """Whether positive values (three or more) are more evenly spaced on a log scale than on a
    linear one: 3e-5, 1e-4, 3e-4 are; 0.1, 0.2, 0.3 are not."""
    x = np.unique(np.asarray(x, dtype=float))
    if len(x) < 3 or x.min() <= 0:
        return False

    def unevenness(gaps):
        return float(np.std(gaps) / np.mean(gaps))
    return unevenness(np.diff(np.log(x))) < unevenness(np.diff(x))


def sweep_plot(grid: Grid) -> str | None:
    """A one-axis grid: the dev scores (overall and each task's metric) against the axis values,
    each with its 95% bootstrap interval as a band. A numeric axis is drawn to scale (logarithmic
    when its values are spaced by factors rather than steps, as learning rates are: `log_spaced`),
    any other as categories in the order of params.yaml."""
    if len(grid.axes) != 1 or not grid.series_keys or all(c.value is None and not any(
            v is not None for v, _ in c.series.values()) for c in grid.cells):
        return None
    axis = grid.axes[0]
    if axis.numeric and len(axis.values) > 1:
        x = np.array(axis.values, dtype=float)
        log = log_spaced(x)
    else:
        x, log = np.arange(len(axis.values), dtype=float), False
    order = np.argsort(x, kind="stable")
    with rc_context(STYLE):
        fig = Figure(figsize=(max(4.8, 1.6 + 0.55 * len(x)), 3.2))
        ax = fig.add_subplot()
        for k, (key, header) in enumerate(grid.series_keys):
            pts = [grid.cells[i].series.get(key, (None, None)) for i in order]
            y = np.array([v if v is not None else np.nan for v, _ in pts], dtype=float)
            if np.isnan(y).all():
                continue
            colour = "#222222" if key == grid.metric else COLORS[k % len(COLORS)]
            ax.plot(x[order], y, marker="o", markersize=4, color=colour, label=header,
                    linewidth=2.0 if key == grid.metric else 1.3)
            lo = np.array([iv.low if iv is not None else np.nan for _, iv in pts], dtype=float)
            hi = np.array([iv.high if iv is not None else np.nan for _, iv in pts], dtype=float)
            if not np.isnan(lo).all():
                ax.fill_between(x[order], lo, hi, color=colour, alpha=0.13, linewidth=0)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(x, axis.labels)
        if not axis.numeric:
            ax.set_xlim(-0.4, len(x) - 0.6)
        ax.margins(y=0.08)                     # lines, not bars: the y axis spans the scores, not 0 to 1
        ax.set_xlabel(f"{axis.name} ({axis.key})" if axis.name != axis.key else axis.key)
        ax.set_ylabel(f"{grid.split} score")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        return to_data_uri(fig, tight=True)


def training_curves(history: pd.DataFrame) -> str | None:
    """The training curves of a history (`training_figure`) as a data URI."""
    with rc_context(STYLE):
        fig = training_figure(history)
        return to_data_uri(fig) if fig is not None else None


def training_figure(history: pd.DataFrame) -> Figure | None:
    """Per trained task: metric (train, dev) on top, loss (train, dev) below, against the epoch; a
    history without per-task columns (a pretraining's) is one loss panel (`loss_figure`)."""
    tasks = [t for t in TASKS
             if any(f"{p}_{t}_{m}" in history.columns for p in ("train", "dev") for m in ("loss", "acc", "pearson"))]
    if history.empty:
        return None
    if not tasks:
        return loss_figure(history)
    metric_name = {t: (TASKS[t].metric, "Pearson r" if TASKS[t].metric == "pearson" else "accuracy") for t in tasks}
    width = 3.0 * len(tasks) + 0.6
    fig = Figure(figsize=(width, 4.4))
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, top=0.93, bottom=0.11, wspace=0.38, hspace=0.12)
    axes = fig.subplots(2, len(tasks), squeeze=False, sharex=True)
    for j, task in enumerate(tasks):
        metric, label = metric_name[task]
        for i, (suffix, ylabel) in enumerate([(metric, label), ("loss", "loss")]):
            ax = axes[i][j]
            columns = [(f"{part}_{task}_{suffix}", part) for part in ("train", "dev")]
            _history_panel(ax, history, columns, ylabel)
            if i == 0:
                ax.set_title(task.upper())
            else:
                ax.set_xlabel("epoch")
            if ax.lines and i == 0 and j == 0:
                ax.legend(frameon=False)           # one legend: the colours mean the same everywhere
    return fig


def loss_curve(history: pd.DataFrame) -> str | None:
    """A pretraining history's loss panel (`loss_figure`) as a data URI."""
    with rc_context(STYLE):
        fig = loss_figure(history)
        return to_data_uri(fig) if fig is not None else None


def loss_figure(history: pd.DataFrame) -> Figure | None:
    """A pretraining history (epoch, train_loss, dev_loss): one loss panel."""
    if not any(c in history.columns and history[c].notna().any() for c in ("train_loss", "dev_loss")):
        return None
    fig = Figure(figsize=(4.2, 2.8))
    fig.subplots_adjust(left=0.16, right=0.97, top=0.95, bottom=0.17)
    ax = fig.add_subplot()
    _history_panel(ax, history, [("train_loss", "train"), ("dev_loss", "dev")], "loss")
    ax.set_xlabel("epoch")
    ax.legend(frameon=False)
    return fig


def _history_panel(ax, history: pd.DataFrame, columns: list[tuple[str, str]], ylabel: str) -> None:
    """The history's columns [(column, legend label)] against the epoch, the first column left of a
    lone point's value and the second right of it. A column with one value (a one-epoch run) is a
    single point: drawn larger, with its value written beside it, on an axis ticked at its epoch
    with a whole epoch of room (autoscaling would tick a lone epoch 0.96-1.04)."""
    epochs = history["epoch"]
    for k, (column, label) in enumerate(columns):
        if column not in history.columns or not history[column].notna().any():
            continue
        values = history[column]
        lone = int(values.notna().sum()) == 1
        ax.plot(epochs, values, marker="o", markersize=6 if lone else 3, color=COLORS[k], label=label)
        if lone:
            at = values.notna().to_numpy().nonzero()[0][0]
            ax.annotate(fmt_metric(float(values.iloc[at])), (float(epochs.iloc[at]), float(values.iloc[at])),
                        xytext=(-8 if k == 0 else 8, 0), textcoords="offset points", va="center",
                        ha="right" if k == 0 else "left", fontsize=8, color=COLORS[k])
    ax.set_ylabel(ylabel)
    ticks = sorted({float(e) for e in epochs})
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] - 0.5, ticks[0] + 0.5)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.margins(y=0.3)                               # room above and below the written values
    elif all(t.is_integer() for t in ticks):
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.ticklabel_format(axis="y", useOffset=False)       # "+2.94e-1" offsets confuse readers


def regression_histogram(frame: pd.DataFrame, label_range: tuple = (0.0, 5.0)) -> str:
    """How the predicted scores of a regression task (STS: 0-5) are distributed against the true ones."""
    lo_label, hi_label = label_range or (0.0, 5.0)
    with rc_context(STYLE):
        fig = Figure(figsize=(4.6, 3.0))
        fig.subplots_adjust(left=0.14, right=0.97, top=0.95, bottom=0.16)
        ax = fig.add_subplot()
        lo = min(lo_label, float(frame["prediction"].min()))
        hi = max(hi_label, float(frame["prediction"].max()))
        step = (hi_label - lo_label) / 20 or 0.25
        bins = np.arange(np.floor(lo / step) * step, np.ceil(hi / step) * step + step, step)
        ax.hist(frame["label"], bins=bins, alpha=0.55, color=COLORS[0], label="true")
        ax.hist(frame["prediction"], bins=bins, alpha=0.55, color=COLORS[1], label="predicted")
        ax.set_xlabel("similarity score")
        ax.set_ylabel("pairs")
        ax.legend(frameon=False)
        return to_data_uri(fig)


DENSITY_MAP = "viridis"
KDE_MAX_POINTS = 5000                # beyond this, the density is a 2-D histogram lookup (O(n) not O(n^2))


def point_density(x, y) -> tuple[np.ndarray, str]:
    """The local density at each point, relative to the densest (1), and how it was estimated:
    a Gaussian kernel density estimate (scipy, Scott's bandwidth) or, for many points or when the
    points lie on a line, the count of points in the same cell of a 20 x 20 histogram. Both are
    deterministic (no sampling)."""
    xy = np.vstack([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    n = xy.shape[1]
    if n == 0:
        return np.zeros(0), "none"
    if 3 <= n <= KDE_MAX_POINTS:
        from scipy.stats import gaussian_kde
        try:
            density = gaussian_kde(xy)(xy)
            if np.isfinite(density).all() and density.max() > 0:
                return density / density.max(), "kernel density estimate"
        except (np.linalg.LinAlgError, ValueError):        # all points on a line: singular covariance
            pass
    counts, xe, ye = np.histogram2d(xy[0], xy[1], bins=20)
    i = np.clip(np.searchsorted(xe, xy[0], side="right") - 1, 0, counts.shape[0] - 1)
    j = np.clip(np.searchsorted(ye, xy[1], side="right") - 1, 0, counts.shape[1] - 1)
    density = counts[i, j]
    return density / density.max(), "2-D histogram"


def regression_scatter(frame: pd.DataFrame, worst_ids: list[str], label_range: tuple = (0.0, 5.0)) -> str:
    """Predicted against true scores, each dot coloured by the local density of dots (a colour
    bar says so; dense dots drawn last), with the worst pairs (listed below the plot) circled."""
    lo_label, hi_label = label_range or (0.0, 5.0)
    density, method = point_density(frame["label"], frame["prediction"])
    order = np.argsort(density, kind="stable")              # the densest on top
    with rc_context(STYLE):
        fig = Figure(figsize=(4.9, 3.6))
        fig.subplots_adjust(left=0.12, right=0.80, top=0.91, bottom=0.14)
        ax = fig.add_subplot()
        dots = ax.scatter(frame["label"].to_numpy()[order], frame["prediction"].to_numpy()[order],
                          c=density[order], cmap=DENSITY_MAP, vmin=0.0, vmax=1.0, s=9, alpha=0.85, linewidths=0)
        worst = frame[frame["id"].isin(worst_ids)]
        ax.scatter(worst["label"], worst["prediction"], s=40, facecolors="none", edgecolors=COLORS[3],
                   linewidths=1.1, label="worst pairs")
        lo = min(lo_label, float(frame["prediction"].min()))
        hi = max(hi_label, float(frame["prediction"].max()))
        ax.plot([lo, hi], [lo, hi], color="#555", linewidth=0.8, linestyle="--", label="perfect")
        ax.set_xlabel("true score")
        ax.set_ylabel("predicted score")
        r = pearson(frame["prediction"], frame["label"])          # None: undefined (constant scores)
        ax.set_title(f"Pearson r = {'undefined' if r is None else fmt_metric(r)}")
        ax.legend(frameon=True, loc="lower right")   # the worst pairs sit far off the diagonal
        bar = fig.colorbar(dots, cax=fig.add_axes((0.83, 0.14, 0.03, 0.77)))
        bar.set_label(f"density of dots ({method}; 1 = densest)", fontsize=8)
        bar.set_ticks([0.0, 0.5, 1.0])
        bar.ax.tick_params(labelsize=7.5)
        bar.solids.set_alpha(1.0)
        return to_data_uri(fig)

