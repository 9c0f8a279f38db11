"""The report's code, one module per concern (small modules and functions: tests/test_code_size.py),
each the report job's code alone, and one predictions reader shared with the jobs that score and
combine predictions."""
from __future__ import annotations

from pathlib import Path

import pytest

from minbert.pipeline import code, plan
from workflow import dag

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "minbert" / "report"


@pytest.fixture(scope="module")
def demo_closures(repo_root):
    with dag.in_repo(repo_root):
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
