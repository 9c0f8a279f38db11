"""The report stage's library: load results, build the papers' tables and error analyses, and
render them into self-contained HTML with Jinja2 (templates in minbert/report/templates/, package data)."""
from minbert.report.data import ReportData, load_report_data
from minbert.report.render import render_reports

__all__ = ["ReportData", "load_report_data", "render_reports"]
