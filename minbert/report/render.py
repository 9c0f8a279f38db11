"""Render reports/final.html and one page per experiment (and ensemble) with Jinja2.

Pages are deterministic (no clock, stable images) and self-contained (CSS and images inline,
links only to sibling pages), and every text that comes from the data is HTML-escaped.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from tqdm import tqdm

from minbert.core.io import read_manifest, write_json, write_manifest, write_text
from minbert.core.layout import Layout
from minbert.core.metrics import Undefined, pearson, pearson_undefined
from minbert.core.settings import in_own_registry
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS
from minbert.params import LoadedParams
from minbert.report import plots
from minbert.report.analysis import analyse
from minbert.report.best import BestModel, best_model
from minbert.report.data import ReportData, RunResults, load_report_data
from minbert.report.formats import (
    DASH,
    delta_class,
    fmt_delta,
    fmt_duration,
    fmt_history,
    fmt_interval,
    fmt_label,
    fmt_metric,
    fmt_std,
    fmt_value,
    is_number,
    short_id,
)
from minbert.report.grids import study_grids
from minbert.report.papers import JUDGED, VERDICT_TITLES, paper_tables, scorecard
from minbert.report.scores import ScoreBook, metric_columns
from minbert.report.tables import ensemble_tables, study_tables

TEMPLATES = Path(__file__).resolve().parent / "templates"
CODE_DATA = ("templates",)      # part of this module's code for the re-run checks (minbert.pipeline.plan)


def heat(rate) -> str:
    """Background for a confusion-matrix cell: stronger blue for a larger share of the row."""
    rate = float(rate) if is_number(rate) else 0.0
    return f"background-color: rgba(59, 110, 165, {0.08 + 0.72 * rate:.2f}); color: {'#fff' if rate > 0.55 else 'inherit'}"


def grid_heat(cell) -> str:
    """Inline style of a heatmap cell: its colour on the grid's scale; none for a cell without a value."""
    if cell.fraction is None:
        return ""
    background, ink = plots.heat_colours(cell.fraction)
    return f"background-color: {background}; color: {ink}"


# Bidirectional controls (embeddings, overrides, isolates, marks) in data texts would reorder what
# follows them on the page (a right-to-left override shows "gnirts" for "string"): every value a
# template prints shows them as visible code points instead, and data texts sit in dir="auto"
# elements, so each text keeps its own direction without turning its neighbours.
BIDI_CONTROLS = {c: f"\u27e6U+{c:04X}\u27e7" for c in
                 [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def show_bidi_controls(value):
    """`value` with every bidirectional control replaced by a visible ⟦U+XXXX⟧ (markup stays markup)."""
    if isinstance(value, Markup):
        return Markup(str.translate(value, BIDI_CONTROLS))
    if isinstance(value, str):
        return value.translate(BIDI_CONTROLS)
    return value


def environment(templates: Path = TEMPLATES) -> Environment:
    env = Environment(loader=FileSystemLoader(str(templates)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True, finalize=show_bidi_controls)
    env.filters.update(metric=fmt_metric, delta=fmt_delta, duration=fmt_duration, value=fmt_value, history=fmt_history, short_id=short_id,
                       label=fmt_label, heat=heat, grid_heat=grid_heat, delta_class=delta_class, interval=fmt_interval, std=fmt_std)
    env.globals.update(DASH=DASH, METRIC_COLUMNS=metric_columns(), VERDICT_TITLES=VERDICT_TITLES, JUDGED=JUDGED,
                       heat_gradient=plots.heat_gradient())
    return env


# ------------------------------------------------------------------ page contexts

def error_analysis(run: RunResults, k: int, book: ScoreBook, cache: dict | None = None) -> dict:
    """The analysis of the dev predictions, with each task's metric and interval and the plots of
    a regression task; kept in `cache` (by run) when given, as final.html repeats the best model's."""
    if cache is not None and run.name in cache:
        return cache[run.name]
    result = analyse(run, k)
    for section in result["sections"]:
        task = TASKS[section["task"]]
        frame = run.labelled(task.name, result["split"])
        section["interval"] = book.interval(run.name, result["split"], task.metric_key)
        if task.kind == "regression":
            section["pearson"] = pearson(frame["prediction"], frame["label"])
            if section["pearson"] is None:
                section["pearson"] = Undefined(pearson_undefined(frame["prediction"], frame["label"]))
            section["histogram"] = plots.regression_histogram(frame, task.label_range)
            section["scatter"] = plots.regression_scatter(frame, [r["id"] for r in section["worst"]],
                                                          task.label_range)
    if cache is not None:
        cache[run.name] = result
    return result


def score_columns(run: RunResults) -> list[tuple]:
    """The columns of a run's own scores table: the leaderboard's always (a missing one shows as a
    dash), any other task's (CFIMDB) when the run has it."""
    always = {"overall", "mean"} | {TASKS[t].metric_key for t in LEADERBOARD_TASKS}
    return [c for c in metric_columns()
            if c[0] in always or any(is_number(run.split_metrics(s).get(c[0])) for s in ("dev", "test"))]


def metrics_rows(run: RunResults, book: ScoreBook) -> list[dict]:
    """One row per split with scores and their intervals, for a run's own summary table."""
    rows = []
    for split in ("dev", "test"):
        m = run.split_metrics(split)
        if m:
            rows.append({"split": split, "n": m.get("n") or {},
                         "scores": [{"value": m.get(key), "interval": book.interval(run.name, split, key)}
                                    for key, _, _ in score_columns(run)]})
    return rows


def provenance(data: ReportData) -> dict:
    infos = data.run_infos
    revisions = Counter(str(i.get("git_revision", "unknown")) for i in infos)
    hardware = defaultdict(list)
    for i in infos:
        key = tuple(DASH if i.get(k) in (None, "") else i[k]      # a null in run.json reads as "—", never "None"
                    for k in ("device", "gpu", "platform", "cpu_count", "threads", "torch"))
        hardware[key].append(i.get("stage", "?"))
    stage_totals = defaultdict(float)
    for i in infos:
        if is_number(i.get("wall_seconds")):
            stage_totals[i.get("stage", "?")] += float(i["wall_seconds"])
    models = defaultdict(list)
    for name, exp in data.params.experiments.items():
        models[exp.model].append(name)
    return {
        "revisions": sorted(revisions.items()),
        "hardware": [{"device": k[0], "gpu": k[1], "platform": k[2], "cpu_count": k[3], "threads": k[4],
                      "torch": k[5], "stages": ", ".join(sorted(set(v)))} for k, v in sorted(
                          hardware.items(), key=lambda kv: tuple(str(x) for x in kv[0]))],
        "runs": infos,
        "stage_totals": sorted(stage_totals.items()),
        "total_seconds": sum(stage_totals.values()),
        "models": sorted(models.items()),
        "pretrainings": {n: p.model_dump() for n, p in data.params.params.pretrainings.items()},
        "data_summary": split_rows(data.data_summary),
        "params_yaml": yaml.safe_dump(data.params.raw, sort_keys=False, allow_unicode=True),
    }


def split_rows(summary: list[dict]) -> list[dict]:
    """The prepare summary's rows, each with `split_off`: the rows read that went to another split
    of the same file (a dev split held out of a training file, NLI's split by premise), so that read =
    kept + dropped + split off; and `split_to`, the files they went to."""
    out = []
    for r in summary:
        r = dict(r)
        read, kept, dropped = (r.get(k) for k in ("rows_read", "rows_kept", "rows_dropped"))
        if all(isinstance(x, int) for x in (read, kept, dropped)) and read > kept + dropped:
            r["split_off"] = read - kept - dropped
            task = str(r.get("file", "")).split("-")[0]
            r["split_to"] = [str(o.get("file")) for o in summary if o is not None and o.get("file") != r.get("file")
                             and str(o.get("file", "")).split("-")[0] == task and o.get("rows_read") == read]
        out.append(r)
    return out


def run_overview(data: ReportData, book: ScoreBook) -> list[dict]:
    out = []
    for name, run in data.runs.items():
        if run.kind == "experiment":
            exp = data.params.experiments[name]
            what = exp.description or ", ".join(f"{k}={fmt_value(v)}" for k, v in
                                                data.params.overrides(name).items()) or "the base settings"
        else:
            ens = data.params.params.ensembles[name]
            what = ens.description or f"ensemble of {', '.join(ens.members)}"
        out.append({"name": name, "kind": run.kind, "what": what, "has_results": run.metrics is not None,
                    "overall": run.split_metrics("dev").get("overall"),
                    "interval": book.interval(name, "dev", "overall")})
    return out


def final_context(data: ReportData, book: ScoreBook, best: BestModel | None, analyses: dict | None = None) -> dict:
    """What final.html shows; `best`: the best model (`best.best_model`), whose analysis is drawn
    once into `analyses` for its own page and this one."""
    k = data.params.params.report.worst_k
    tables = study_tables(data, book)
    grids = study_grids(data, book)
    papers = paper_tables(data, book)
    return {
        "title": data.params.params.report.title,
        "data_warnings": data_warnings(data),
        "scorecard": scorecard(papers, data),
        # a grid study's figure is its heatmap (two axes) or sweep plot (one axis), not the bar chart
        "studies": [{"table": t, "grid": grids.get(t.name), "paper": papers.get(t.name),
                     "plot": plots.study_plot(t) if t.name not in grids else None,
                     "sweep": plots.sweep_plot(grids[t.name]) if t.name in grids else None} for t in tables],
        "ensembles": [{"table": t, "plot": None} for t in ensemble_tables(data, book)],
        "overview": run_overview(data, book),
        "best": best,
        "best_runs": book.members(best.name) if best else [],
        "best_analysis": error_analysis(data.runs[best.shown], k, book, analyses) if best else None,
        "provenance": provenance(data),
        "worst_k": k,
        "link_prefix": "experiments/",
        "resamples": book.resamples,
        "confidence": book.confidence,
    }


def curves_caption(stage: str, history, pretrain: str | None) -> str:
    """What a history's figure shows; a one-epoch history is one point per curve, its value written."""
    after = "after each epoch"
    if history["epoch"].nunique() == 1:
        after = "after its one epoch: one point per curve, with its value (a curve needs two epochs or more)"
    if stage == "pretrain":
        return f"Further pretraining {pretrain} (shared with the experiments that use it): loss {after}."
    return f"Per task: the metric (top) and the loss (bottom) on the training and dev data {after}."


def experiment_context(data: ReportData, name: str, book: ScoreBook, analyses: dict | None = None) -> dict:
    run = data.runs[name]
    k = data.params.params.report.worst_k
    ctx = {"title": data.params.params.report.title, "run": run, "name": name, "kind": run.kind,
           "metrics_rows": metrics_rows(run, book), "score_columns": score_columns(run),
           "analysis": error_analysis(run, k, book, analyses), "worst_k": k,
           "runs": [i for i in data.run_infos if i.get("name") == name], "link_prefix": "",
           "resamples": book.resamples, "confidence": book.confidence, "group": None, "siblings": [],
           "data_warnings": data_warnings(data), "history_notes": list(run.history_notes)}
    if run.kind == "experiment":
        exp = data.params.experiments[name]
        ctx["description"] = exp.description
        ctx["overrides"] = sorted(data.params.overrides(name).items())
        ctx["members"] = []
        order = {"pretrain": 0, "finetune": 1, "retrain_heads": 2}
        ctx["curves"] = [{"stage": stage, "plot": plots.training_curves(h), "history": h,
                          "caption": curves_caption(stage, h, exp.pretrain)}
                         for stage, h in sorted(run.histories.items(), key=lambda kv: order.get(kv[0], 9))]
        ctx["used_in"] = [n for n, e in data.params.params.ensembles.items() if name in e.members]
        for group, seeds in data.params.groups.items():
            if name in seeds:
                ctx["group"] = group
                ctx["siblings"] = [s for s in seeds if s != name]
    else:
        ens = data.params.params.ensembles[name]
        ctx["description"] = ens.description
        ctx["overrides"] = [("classification", ens.classification), ("similarity", ens.similarity)]
        ctx["members"] = list(ens.members)
        ctx["curves"] = []
        ctx["used_in"] = []
    ctx["studies"] = [st.title for st in data.params.params.studies
                      if name in st.experiments or ctx["group"] in st.experiments]
    return ctx


# ------------------------------------------------------------------ entry point

def data_warnings(data: ReportData) -> list[str]:
    """Prepared splits that share much of their text with their train split (summary.json): every
    score on them is inflated, which each page says at its top."""
    from minbert.data.overlap import overlap_warnings

    return overlap_warnings({"files": {r.get("file"): r for r in data.data_summary}})


def summary_metrics(data: ReportData) -> dict:
    """The headline of every experiment and ensemble: its overall score on dev and, where the test
    split is labelled, on test; one small file for `dvc exp show` and `dvc metrics diff`. An
    undefined score (metrics.json says why) is left out rather than shown as a number."""
    out = {}
    for name, run in data.runs.items():
        scores = {split: run.split_metrics(split).get("overall") for split in ("dev", "test")}
        scores = {split: score for split, score in scores.items() if isinstance(score, (int, float))}
        if scores:
            out[name] = scores
    return out


def run_summary(ctx: dict, report: str) -> list[str]:
    """What a run ends on, in a few lines: the best model and its score, the scorecard's counts and
    where the report is (the report stage prints them last: on DVC's terminal, and Snakemake's at the
    end of its run)."""
    best, card = ctx["best"], ctx["scorecard"]
    lines = []
    if best is not None:
        what = "dev overall score" if best.has_overall else "dev mean of its task scores"
        seeds = f" (the mean of its {best.seeds} seeds)" if best.repeated else ""
        interval = f" {fmt_interval(best.interval)}" if best.has_overall and best.interval else ""
        lines.append(f"best model: {best.name}{seeds}, {what} {fmt_metric(best.score)}{interval}")
    if card.claims:
        counts = ", ".join(f"{n} {v}" for v, n in card.counts.items() if n and v in JUDGED)
        rest = "; ".join(f"{n} {v}" for v, n in card.counts.items() if n and v not in JUDGED)
        lines.append(f"claims: {card.judged} of {len(card.claims)} judged" + (f" ({counts})" if counts else "")
                     + (f"; {rest}" if rest else "") + (" (demo data: the verdicts only show how the page reads)"
                                                          if card.demo else ""))
    return lines + [f"report: {report}"]


@in_own_registry
def render_reports(params: LoadedParams, layout: Layout = Layout(), templates: Path = TEMPLATES,
                   progress: bool = True, reads: dict[str, list[str]] | None = None,
                   summary: list | None = None) -> list[Path]:
    """Write the final report and one page per experiment and ensemble from the outputs the report
    job reads (`reads`: its job's; minbert.report.data); returns the paths written (and, into
    `summary` when given, the run's summary lines: `run_summary`). It runs in the params' registry
    (their declared tasks, the user's losses and heads), whoever calls it."""
    data = load_report_data(params, layout, reads)
    earlier = read_manifest(layout.experiment_reports)   # the pages an earlier rendering wrote
    book = ScoreBook(data)                      # every bootstrap once, shared by all pages
    env = environment(templates)
    written = []
    names = list(data.runs)
    best = best_model(data, book)
    analyses: dict = {}                         # the best model's analysis, drawn once for two pages
    for name in tqdm(names, desc="report pages", unit="page", disable=not progress):
        ctx = experiment_context(data, name, book, analyses if best and name == best.shown else None)
        html = env.get_template("experiment.html.j2").render(**ctx)
        path = Path(layout.experiment_report(name))
        write_text(path, html)
        written.append(path)
    ctx = final_context(data, book, best, analyses)
    html = env.get_template("final.html.j2").render(**ctx)
    write_text(layout.final_report, html)
    if summary is not None:
        summary += run_summary(ctx, layout.final_report)
    written.append(Path(layout.final_report))
    write_json(layout.summary_metrics, summary_metrics(data))
    # A page of an experiment no longer in params.yaml would be linked from nowhere and mislead: the
    # pages an earlier rendering wrote go; any other file in the folder is someone else's and stays.
    pages = [p.name for p in written[:-1]]
    for stale in sorted(set(earlier) - set(pages)):
        (Path(layout.experiment_reports) / stale).unlink(missing_ok=True)
    write_manifest(layout.experiment_reports, pages)
    return written
