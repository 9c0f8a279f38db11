"""The report stage's library: load results, build the papers' tables and error analyses, and
render them into self-contained HTML with Jinja2 (templates in workflow/templates/)."""
from .data import ReportData, load_report_data, report_inputs
from .render import render_reports
from .tables import best_experiment, fmt_delta, fmt_metric

__all__ = ["ReportData", "load_report_data", "report_inputs", "render_reports", "best_experiment",
           "fmt_metric", "fmt_delta"]
