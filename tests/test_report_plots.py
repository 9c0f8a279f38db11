"""The report's figures as a reader sees them, checked on the drawn matplotlib figures: a one-epoch
history is labelled points on an axis ticked at its epoch, and bar-chart labels never run into
each other."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minbert.report import plots
from minbert.report.formats import fmt_metric
from minbert.report.render import curves_caption
from minbert.report.tables import PAPER_OVERALL_HEADERS, Cell, Row, Table
from minbert.scoring.stats import Interval


def _annotations(ax) -> dict[str, tuple[float, float]]:
    return {t.get_text(): tuple(float(v) for v in t.xy) for t in ax.texts}


def test_a_one_epoch_pretraining_is_two_labelled_points_on_an_axis_ticked_at_its_epoch():
    history = pd.DataFrame({"epoch": [1], "train_loss": [3.1042], "dev_loss": [3.3218]})
    ax = plots.loss_figure(history).axes[0]
    assert ax.get_xticks().tolist() == [1.0] and [t.get_text() for t in ax.get_xticklabels()] == ["1"]
    assert ax.get_xlim() == (0.5, 1.5)                            # a whole epoch of room, not 0.96-1.04
    assert _annotations(ax) == {"3.104": (1.0, 3.1042), "3.322": (1.0, 3.3218)}
    low, high = ax.get_ylim()
    assert low < 3.1042 and 3.3218 < high
    assert [line.get_markersize() for line in ax.lines] == [6, 6]
    assert curves_caption("pretrain", history, "mlm").endswith(
        "loss after its one epoch: one point per curve, with its value (a curve needs two epochs or more).")


def test_a_one_epoch_fine_tuning_labels_every_panel_and_longer_histories_stay_curves():
    one = pd.DataFrame({"epoch": [1], "train_sst_loss": [1.2], "train_sst_acc": [0.41],
                        "dev_sst_loss": [1.3], "dev_sst_acc": [0.385], "dev_sts_pearson": [0.2]})
    fig = plots.training_figure(one)
    labelled = {}
    for ax in fig.axes:
        assert ax.get_xticks().tolist() == [1.0] and ax.get_xlim() == (0.5, 1.5)
        labelled |= _annotations(ax)
    assert set(labelled) == {fmt_metric(v) for v in (1.2, 0.41, 1.3, 0.385, 0.2)}

    two = pd.DataFrame({"epoch": [1, 2], "train_loss": [3.1, 2.4], "dev_loss": [3.3, 2.9]})
    ax = plots.loss_figure(two).axes[0]
    FigureCanvasAgg(ax.figure).draw()
    low, high = ax.get_xlim()
    assert not ax.texts and all(float(t).is_integer() for t in ax.get_xticks() if low <= t <= high)
    assert curves_caption("finetune", two, None).endswith("on the training and dev data after each epoch.")


def _table(headers: list[str], rows: int, keys: list[str] | None = None) -> Table:
    columns = [("dev", key, header, "") for key, header in zip(keys or [f"k{i}" for i in range(len(headers))], headers)]
    table_rows = []
    for r in range(rows):
        cells = {("dev", key): Cell(0.5 + 0.05 * r, Interval(0.45, 0.6)) for _, key, _, _ in columns}
        table_rows.append(Row(f"run{r}", "experiment", "", r == 0, True, cells))
    return Table("s", "S", "", "run0", columns, ["dev"], table_rows)


def _overlaps(fig: Figure, ax) -> list[tuple[str, str]]:
    renderer = FigureCanvasAgg(fig).get_renderer()
    labels = sorted((t for t in ax.get_xticklabels() if t.get_text()), key=lambda t: t.get_position()[0])
    boxes = [t.get_window_extent(renderer) for t in labels]
    return [(a.get_text(), b.get_text()) for a, b, ba, bb in zip(labels, labels[1:], boxes, boxes[1:]) if ba.x1 > bb.x0]


def test_bar_chart_labels_are_wrapped_so_they_never_run_into_the_next():
    """002's table names its overall score "Overall (leaderboard, the paper's)": written on one line
    it ran into "SST acc"; wrapped, every label keeps all its words and none overlaps its neighbour."""
    headers = [PAPER_OVERALL_HEADERS["leaderboard"], "SST acc", "Para acc", "STS r"]
    fig = plots.study_figure(_table(headers, 3))
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_xticklabels()]
    assert ["".join(t.split()) for t in texts] == ["".join(h.split()) for h in headers]    # wrapped, nothing cut
    assert "\n" in texts[0] and _overlaps(fig, ax) == []
    ax.set_xticks(np.arange(len(headers)), headers)           # as written, the first label runs into the second
    assert _overlaps(fig, ax) != []
    assert plots.study_plot(_table(headers, 3)).startswith("data:image/png;base64,")


def test_a_slot_too_narrow_for_any_wrap_cuts_the_labels_rather_than_overlap():
    fig = Figure(figsize=(2.0, 1.5))
    ax = fig.add_subplot()
    positions = np.arange(12)
    ax.bar(positions, np.ones(12))
    plots.fit_tick_labels(fig, ax, positions, ["Supercalifragilistic"] * 12)
    assert _overlaps(fig, ax) == []
    assert all(t.get_text() == "" or "\u2026" in t.get_text() for t in ax.get_xticklabels())


def test_the_plain_mean_is_charted_where_it_is_the_papers_score_and_left_out_beside_the_overall():
    def charted(keys, headers):
        fig = plots.study_figure(_table(headers, 2, keys))
        return [" ".join(t.get_text().split()) for t in fig.axes[0].get_xticklabels()]

    tasks = (["sst_acc", "para_acc", "sts_pearson"], ["SST acc", "Para acc", "STS r"])
    assert charted(tasks[0] + ["mean"], tasks[1] + [PAPER_OVERALL_HEADERS["mean"]]) == tasks[1] + [
        PAPER_OVERALL_HEADERS["mean"]]
    assert charted(["overall", *tasks[0], "mean"], ["Overall", *tasks[1], "Mean"]) == ["Overall", *tasks[1]]
