"""Figures for the report, as inline PNG data URIs (the pages open from disk with no network).

Uses matplotlib's object API (no pyplot global state) and writes no timestamp or software tag
into the PNG, so the same inputs give byte-identical images.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure

from .tables import Table, fmt_metric

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
    """Grouped bars: one group per metric, one bar per experiment (the study's comparison)."""
    keys = [(key, header) for s, key, header, _ in table.columns if s == split and key != "mean"]
    rows = [r for r in table.rows if r.has_results]
    if not keys or not rows:
        return None
    with rc_context(STYLE):
        fig = Figure(figsize=(max(5.0, 1.2 + 0.35 * len(rows) * len(keys)), 3.0))
        ax = fig.add_subplot()
        width = 0.8 / len(rows)
        x = np.arange(len(keys))
        for i, row in enumerate(rows):
            colour = COLORS[table.rows.index(row) % len(COLORS)]   # a row keeps its colour as results arrive
            values = [row.cells[(split, key)].value for key, _ in keys]
            shown = [j for j, v in enumerate(values) if v is not None]   # a missing metric is no bar, not 0
            ax.bar(x[shown] + (i - (len(rows) - 1) / 2) * width, [values[j] for j in shown], width,
                   label=row.name + (" (baseline)" if row.is_baseline else ""), color=colour,
                   hatch="//" if row.kind == "ensemble" else None, edgecolor="white")
        ax.set_xticks(x, [h for _, h in keys])
        low = min([0.0] + [row.cells[(split, k)].value or 0.0 for row in rows for k, _ in keys])
        ax.set_ylim(low - 0.05 if low < 0 else 0.0, 1.0)   # room below a negative Pearson r
        ax.set_ylabel(f"{split} score")
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        return to_data_uri(fig, tight=True)        # the legend sits outside the axes


def training_curves(history: pd.DataFrame) -> str | None:
    """Per trained task: metric (train, dev) on top, loss (train, dev) below, against the epoch."""
    tasks = [t for t in ("sst", "para", "sts")
             if any(f"{p}_{t}_{m}" in history.columns for p in ("train", "dev") for m in ("loss", "acc", "pearson"))]
    if history.empty:
        return None
    if not tasks:
        return loss_curve(history)
    metric_name = {"sst": ("acc", "accuracy"), "para": ("acc", "accuracy"), "sts": ("pearson", "Pearson r")}
    with rc_context(STYLE):
        width = 3.0 * len(tasks) + 0.6
        fig = Figure(figsize=(width, 4.4))
        fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, top=0.93, bottom=0.11,
                            wspace=0.38, hspace=0.12)
        axes = fig.subplots(2, len(tasks), squeeze=False, sharex=True)
        epochs = history["epoch"]
        for j, task in enumerate(tasks):
            metric, label = metric_name[task]
            for i, (suffix, ylabel) in enumerate([(metric, label), ("loss", "loss")]):
                ax = axes[i][j]
                for k, part in enumerate(("train", "dev")):
                    col = f"{part}_{task}_{suffix}"
                    if col in history.columns and history[col].notna().any():
                        ax.plot(epochs, history[col], marker="o", markersize=3, color=COLORS[k], label=part)
                ax.set_ylabel(ylabel)
                if i == 0:
                    ax.set_title(task.upper())
                else:
                    ax.set_xlabel("epoch")
                ax.xaxis.get_major_locator().set_params(integer=True)
                ax.ticklabel_format(axis="y", useOffset=False)   # "+2.94e-1" offsets confuse readers
                if ax.lines and i == 0 and j == 0:
                    ax.legend(frameon=False)           # one legend: the colours mean the same everywhere
        return to_data_uri(fig)


def loss_curve(history: pd.DataFrame) -> str | None:
    """A pretraining history (epoch, train_loss, dev_loss): one loss panel."""
    cols = [c for c in ("train_loss", "dev_loss") if c in history.columns and history[c].notna().any()]
    if not cols:
        return None
    with rc_context(STYLE):
        fig = Figure(figsize=(4.2, 2.8))
        fig.subplots_adjust(left=0.16, right=0.97, top=0.95, bottom=0.17)
        ax = fig.add_subplot()
        for k, col in enumerate(cols):
            ax.plot(history["epoch"], history[col], marker="o", markersize=3, color=COLORS[k],
                    label=col.removesuffix("_loss"))
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(frameon=False)
        return to_data_uri(fig)


def sts_histogram(frame: pd.DataFrame) -> str:
    """How the predicted similarity scores are distributed against the true ones (0-5)."""
    with rc_context(STYLE):
        fig = Figure(figsize=(4.6, 3.0))
        fig.subplots_adjust(left=0.14, right=0.97, top=0.95, bottom=0.16)
        ax = fig.add_subplot()
        lo = min(0.0, float(frame["prediction"].min()))
        hi = max(5.0, float(frame["prediction"].max()))
        bins = np.arange(np.floor(lo * 4) / 4, np.ceil(hi * 4) / 4 + 0.25, 0.25)
        ax.hist(frame["label"], bins=bins, alpha=0.55, color=COLORS[0], label="true")
        ax.hist(frame["prediction"], bins=bins, alpha=0.55, color=COLORS[1], label="predicted")
        ax.set_xlabel("similarity score")
        ax.set_ylabel("pairs")
        ax.legend(frameon=False)
        return to_data_uri(fig)


def sts_scatter(frame: pd.DataFrame, worst_ids: list[str]) -> str:
    """Predicted against true similarity, with the worst pairs (listed below the plot) circled."""
    with rc_context(STYLE):
        fig = Figure(figsize=(4.0, 3.6))
        fig.subplots_adjust(left=0.14, right=0.97, top=0.91, bottom=0.14)
        ax = fig.add_subplot()
        ax.scatter(frame["label"], frame["prediction"], s=8, alpha=0.45, color=COLORS[0], linewidths=0)
        worst = frame[frame["id"].isin(worst_ids)]
        ax.scatter(worst["label"], worst["prediction"], s=40, facecolors="none", edgecolors=COLORS[3],
                   linewidths=1.0, label="worst pairs")
        lo = min(0.0, float(frame["prediction"].min()))
        hi = max(5.0, float(frame["prediction"].max()))
        ax.plot([lo, hi], [lo, hi], color="#555", linewidth=0.8, linestyle="--", label="perfect")
        ax.set_xlabel("true score")
        ax.set_ylabel("predicted score")
        r = np.corrcoef(frame["label"], frame["prediction"])[0, 1] if len(frame) > 1 else float("nan")
        ax.set_title(f"Pearson r = {fmt_metric(float(r))}")
        ax.legend(frameon=True, loc="lower right")   # the worst pairs sit far off the diagonal
        return to_data_uri(fig)
