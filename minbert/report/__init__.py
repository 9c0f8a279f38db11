"""The report stage's library: load results, build the papers' tables and error analyses, and
render them into self-contained HTML with Jinja2 (templates in minbert/report/templates/, package data)."""
from minbert.report.data import ReportData, load_report_data
from minbert.report.render import render_reports
from minbert.report.tables import best_experiment, fmt_delta, fmt_metric

__all__ = ["ReportData", "load_report_data", "render_reports", "best_experiment", "fmt_metric", "fmt_delta"]
