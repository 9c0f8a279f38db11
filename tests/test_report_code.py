"""The report's code, one module per concern: small modules and functions, each the report job's
code alone, and one predictions reader shared with the jobs that score and combine predictions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from minbert.pipeline import code, plan
from workflow import dag

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "minbert" / "report"
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 60, 8


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
            yield node, [n for n in names if n not in ("self", "cls")]


def test_report_modules_and_functions_are_small():
    """No module over 500 lines, no function over 60 lines (its whole definition) or 8 parameters
    (self and cls not counted)."""
    too_big = []
    for path in sorted(REPORT.glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{path.name}: {len(text.splitlines())} lines")
        for node, params in _functions(ast.parse(text)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES or len(params) > MAX_PARAMETERS:
                too_big.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines, {len(params)} parameters")
    assert not too_big, "\n".join(too_big)


def test_the_measure_finds_a_long_function_and_many_parameters():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def f(a, b, c, d, e, f, g, h, i):\n{long_body}\n\nclass C:\n    def m(self, a):\n        pass\n")
    measured = {node.name: (node.end_lineno - node.lineno + 1, len(params)) for node, params in _functions(tree)}
    assert measured == {"f": (MAX_FUNCTION_LINES + 1, 9), "m": (2, 1)}


@pytest.fixture(scope="module")
def demo_closures(repo_root):
    with dag._in(repo_root):
        return {j.id: set(code.code_closure(*(j.code_roots or [j.module]))) for j in plan.pipeline("params.yaml")}


def test_every_report_module_is_code_of_the_report_job_alone(demo_closures):
    modules = [p.relative_to(REPO).as_posix() for p in sorted(REPORT.glob("*.py"))]
    assert len(modules) >= 10
    for module in modules:
        assert {job for job, closure in demo_closures.items() if module in closure} == {"report"}, module


def test_one_predictions_reader_for_the_jobs_that_read_predictions(demo_closures):
    """The reader is code of every job that reads predictions files, and the report no longer runs
    the scoring of metrics.json (evaluate's) to read them."""
    readers = {job.split("@")[0] for job, closure in demo_closures.items()
               if "minbert/scoring/predictions.py" in closure}
    assert {"evaluate", "ensemble", "report"} <= readers
    assert "minbert/scoring/evaluate.py" not in demo_closures["report"]
