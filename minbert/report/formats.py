"""How every number and value is written on the pages: three decimals for scores, signed
differences, intervals in brackets, durations, history cells, labels (docs/report.md, "Numbers").

Tables and plots carry raw values; the templates format them with these filters, so a number is
rounded the same way wherever it appears.
"""
from __future__ import annotations

import json
import math
import numbers

from minbert.core.metrics import Undefined
from minbert.core.tasks import TASKS

DIGITS = 3
MINUS = "\u2212"
DASH = "\u2014"


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


def fmt_std(v) -> str:
    """The spread over seeds: '± 0.004'; '' when there is none (one seed)."""
    return f"\u00b1\u2009{fmt_metric(v)}" if is_number(v) else ""


def fmt_axis_value(v) -> str:
    """A grid axis value as in the experiment names: 0.1, 1e-05, true, mean."""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


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
    """One cell of a history.csv table: epochs as they count (a fraction where dev was evaluated
    within an epoch), lr in scientific notation, seconds
    as a duration, scores and losses like every other score; text (e.g. the stage) as is."""
    if isinstance(v, str):
        return v
    if not is_number(v):
        return DASH
    if column == "epoch":
        return f"{v:g}"
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
    return f"{v:.2f}" if TASKS[task].kind == "regression" else str(int(v))
