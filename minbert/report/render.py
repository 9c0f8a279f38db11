"""Render reports/final.html and one page per experiment (and ensemble) with Jinja2.

Pages are deterministic (no clock, stable images) and self-contained (CSS and images inline,
links only to sibling pages), and every text that comes from the data is HTML-escaped.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from tqdm import tqdm

from ..io import write_text
from ..metrics import pearson
from ..params import LoadedParams, load_params
from . import plots
from .analysis import analyse
from .data import ReportData, RunResults, load_report_data
from .tables import (DASH, METRIC_COLUMNS, best_experiment, delta_class, ensemble_tables, fmt_delta, fmt_metric,
                     is_number, selection_score, study_tables)

TEMPLATES = Path(__file__).resolve().parents[2] / "workflow" / "templates"


def fmt_duration(seconds) -> str:
    if not is_number(seconds):
        return DASH
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_value(v) -> str:
    """A parameter value as it would be written in params.yaml."""
    if v is None:
        return "null"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v).lower() if isinstance(v, bool) else str(v)


def fmt_history(v, column: str) -> str:
    """One cell of a history.csv table: epochs as integers, lr in scientific notation, seconds
    as a duration, scores and losses like every other score; text (e.g. the stage) as is."""
    if isinstance(v, str):
        return v
    if not is_number(v):
        return DASH
    if column == "epoch":
        return str(int(v))
    if column == "lr":
        return f"{v:.2e}"
    if column == "seconds":
        return fmt_duration(v)
    if column.endswith(("_loss", "_acc", "_pearson", "_overall", "_score", "_mean")):
        return fmt_metric(v)
    return f"{v:.4g}"                          # anything else a training stage records


def short_id(example_id) -> str:
    """Hash-like ids (CS224N's are 32 hex digits) cut to a readable prefix; the page keeps the
    full id in the tooltip."""
    text = str(example_id)
    return text if len(text) <= 12 else text[:10] + "\u2026"


def fmt_label(v, task: str) -> str:
    if not is_number(v):
        return DASH
    return f"{v:.2f}" if task == "sts" else str(int(v))


def heat(rate) -> str:
    """Background for a confusion-matrix cell: stronger blue for a larger share of the row."""
    rate = float(rate) if is_number(rate) else 0.0
    return f"background-color: rgba(59, 110, 165, {0.08 + 0.72 * rate:.2f}); color: {'#fff' if rate > 0.55 else 'inherit'}"


def environment(templates: Path = TEMPLATES) -> Environment:
    env = Environment(loader=FileSystemLoader(str(templates)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True)
    env.filters.update(metric=fmt_metric, delta=fmt_delta, duration=fmt_duration, value=fmt_value, history=fmt_history, short_id=short_id,
                       label=fmt_label, heat=heat, delta_class=delta_class)
    env.globals.update(DASH=DASH, METRIC_COLUMNS=METRIC_COLUMNS)
    return env


# ------------------------------------------------------------------ page contexts

def error_analysis(run: RunResults, k: int) -> dict:
    """The analysis of the dev predictions, with the similarity plots."""
    result = analyse(run, k)
    if result["sts"] is not None:
        frame = run.labelled("sts", "dev")
        result["sts"]["pearson"] = pearson(frame["prediction"], frame["label"])
        result["sts"]["histogram"] = plots.sts_histogram(frame)
        result["sts"]["scatter"] = plots.sts_scatter(frame, [r["id"] for r in result["sts"]["worst"]])
    return result


def metrics_rows(run: RunResults) -> list[dict]:
    """One row per split with scores, for a run's own summary table."""
    rows = []
    for split in ("dev", "test"):
        m = run.split_metrics(split)
        if m:
            rows.append({"split": split, "scores": [m.get(key) for key, _, _ in METRIC_COLUMNS],
                         "n": m.get("n") or {}})
    return rows


def provenance(data: ReportData) -> dict:
    infos = data.run_infos
    revisions = Counter(str(i.get("git_revision", "unknown")) for i in infos)
    hardware = defaultdict(list)
    for i in infos:
        key = (i.get("device", DASH), i.get("gpu") or DASH, i.get("platform", DASH),
               i.get("cpu_count", DASH), i.get("threads", DASH), i.get("torch", DASH))
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
        "data_summary": data.data_summary,
        "params_yaml": yaml.safe_dump(data.params.raw, sort_keys=False, allow_unicode=True),
    }


def run_overview(data: ReportData) -> list[dict]:
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
                    "score": selection_score(run), "overall": run.split_metrics("dev").get("overall")})
    return out


def final_context(data: ReportData) -> dict:
    k = data.params.params.report.worst_k
    tables = study_tables(data)
    best = best_experiment(data)
    return {
        "title": data.params.params.report.title,
        "studies": [{"table": t, "plot": plots.study_plot(t)} for t in tables],
        "ensembles": [{"table": t, "plot": None} for t in ensemble_tables(data)],
        "overview": run_overview(data),
        "best": best,
        "best_score": selection_score(data.runs[best]) if best else None,
        "best_has_overall": bool(best) and is_number(data.runs[best].split_metrics("dev").get("overall")),
        "best_analysis": error_analysis(data.runs[best], k) if best else None,
        "provenance": provenance(data),
        "worst_k": k,
        "link_prefix": "experiments/",
    }


def experiment_context(data: ReportData, name: str) -> dict:
    run = data.runs[name]
    k = data.params.params.report.worst_k
    ctx = {"title": data.params.params.report.title, "run": run, "name": name, "kind": run.kind,
           "metrics_rows": metrics_rows(run), "analysis": error_analysis(run, k), "worst_k": k,
           "runs": [i for i in data.run_infos if i.get("name") == name], "link_prefix": ""}
    if run.kind == "experiment":
        exp = data.params.experiments[name]
        ctx["description"] = exp.description
        ctx["overrides"] = sorted(data.params.overrides(name).items())
        ctx["members"] = []
        order = {"pretrain": 0, "finetune": 1, "retrain_heads": 2}
        ctx["curves"] = [{"stage": stage, "plot": plots.training_curves(h), "history": h,
                          "caption": (f"Further pretraining {exp.pretrain} (shared with the experiments "
                                      f"that use it): loss after each epoch." if stage == "pretrain" else
                                      "Per task: the metric (top) and the loss (bottom) on the training "
                                      "and dev data after each epoch.")}
                         for stage, h in sorted(run.histories.items(), key=lambda kv: order.get(kv[0], 9))]
        ctx["used_in"] = [n for n, e in data.params.params.ensembles.items() if name in e.members]
    else:
        ens = data.params.params.ensembles[name]
        ctx["description"] = ens.description
        ctx["overrides"] = [("classification", ens.classification), ("similarity", ens.similarity)]
        ctx["members"] = list(ens.members)
        ctx["curves"] = []
        ctx["used_in"] = []
    ctx["studies"] = [st.title for st in data.params.params.studies if name in st.experiments]
    return ctx


# ------------------------------------------------------------------ entry point

def render_reports(params: str | Path | LoadedParams, results_dir: str | Path, out_dir: str | Path,
                   templates: Path = TEMPLATES, progress: bool = True) -> list[Path]:
    """Write out_dir/final.html and out_dir/experiments/<name>.html; returns the paths written."""
    params = params if isinstance(params, LoadedParams) else load_params(params)
    data = load_report_data(params, Path(results_dir))
    env = environment(templates)
    out_dir = Path(out_dir)
    written = []
    names = list(data.runs)
    for name in tqdm(names, desc="report pages", unit="page", disable=not progress):
        html = env.get_template("experiment.html.j2").render(**experiment_context(data, name))
        path = out_dir / "experiments" / f"{name}.html"
        write_text(path, html)
        written.append(path)
    html = env.get_template("final.html.j2").render(**final_context(data))
    write_text(out_dir / "final.html", html)
    written.append(out_dir / "final.html")
    # A page of an experiment no longer in params.yaml would be linked from nowhere and mislead.
    for stale in sorted(set((out_dir / "experiments").glob("*.html")) - set(written)):
        stale.unlink()
    return written
