"""The repository both engines run in, as workflow/dag.py (Snakemake) and workflow/dvc.py (dvc.yaml)
take it: its folder, the results layout, the params with the command line's settings, and the jobs
planned there (minbert.pipeline.plan). Each engine's file builds on this one; neither imports the
other's."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from minbert.core.layout import Layout  # noqa: E402
from minbert.params import LoadedParams  # noqa: E402
from minbert.params.overrides import load_with_overrides  # noqa: E402
from minbert.pipeline.job import Job  # noqa: E402
from minbert.pipeline.plan import pipeline  # noqa: E402

LAYOUT = Layout()


@contextlib.contextmanager
def in_repo(repo: Path):
    """Inside `repo` (the working folder the jobs' paths are relative to), then back."""
    old = Path.cwd()
    os.chdir(repo)
    try:
        yield
    finally:
        os.chdir(old)


def load(params: str | Path | LoadedParams = "params.yaml", repo: Path = REPO, overrides=()) -> LoadedParams:
    """The params (and catalogue) as this run takes them: with the command line's settings
    (`--config set=...`: minbert.params.overrides) applied."""
    if isinstance(params, LoadedParams):
        return params
    with in_repo(repo):
        return load_with_overrides(params, list(overrides))


def layout_for(results: str | None = None, reports: str | None = None) -> Layout:
    """Where a run writes: `results/` and `reports/` by default; with another results folder (`--config
    results=DIR`, `python -m workflow.dag --results DIR`), its reports inside it (DIR/reports) unless
    given too, so a second params file tried beside the first leaves the first one's files alone."""
    results = (str(results).strip() or LAYOUT.results) if results is not None else LAYOUT.results
    if reports is None or not str(reports).strip():
        reports = LAYOUT.reports if results == LAYOUT.results else f"{results.rstrip('/')}/reports"
    return Layout(results, str(reports))


def jobs(params: str | Path | LoadedParams = "params.yaml", repo: Path = REPO, overrides=(),
         layout: Layout = LAYOUT) -> list[Job]:
    """Every job of the pipeline, each after the jobs whose outputs it reads (paths relative to repo)."""
    lp = load(params, repo, overrides)
    with in_repo(repo):
        return pipeline(lp, layout)
