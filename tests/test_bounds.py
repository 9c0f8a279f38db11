"""Bounded work on small inputs (issue 37): a 1 KB params file whose YAML aliases nest ("billion
laughs") kept the planner, the Snakefile and every stage busy for hours; the planner was quadratic
in its jobs (a 30 x 30 grid planned in 52 s, a 100 x 100 one in about an hour); a one-line error
could quote a value whole. Now the bomb is one line in well under a second, planning is linear,
and every one-line error is bounded."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, child_env, error_line

from minbert.core.errors import MAX_MESSAGE, MinBertError
from minbert.params.load import load_params

BOMB = "".join([f"l0: &l0 [{', '.join(['lol'] * 10)}]\n"] +
               [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)] +
               ["experiments:\n  e: {description: *l8}\n"])      # 10**9 values from 1 KB


def test_an_alias_bomb_is_refused_in_one_line_in_well_under_a_second(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 1200
    t0 = time.perf_counter()
    with pytest.raises(MinBertError, match=r"params.yaml: its YAML aliases \(\*name\) expand to more than "
                                           r"1,000,000 values \(a 'billion laughs' file\?\)"):
        load_params(path)
    assert time.perf_counter() - t0 < 0.5


def test_an_alias_inside_itself_is_refused(tmp_path):
    (tmp_path / "params.yaml").write_text("experiments:\n  e: &e {description: x, also: [*e]}\n")
    with pytest.raises(MinBertError, match=r"a YAML alias \(\*name\) inside the very mapping or list it names "
                                           r"repeats it without end"):
        load_params(tmp_path / "params.yaml")


def test_anchors_a_params_file_uses_for_sharing_are_fine(tmp_path):
    (tmp_path / "params.yaml").write_text("base:\n  finetune: &ft {epochs: 1, lr: 1.0e-4}\nexperiments:\n"
                                          "  a: {finetune: *ft}\n  b: {finetune: {<<: *ft, lr: 2.0e-4}}\n")
    lp = load_params(tmp_path / "params.yaml")
    assert lp.experiments["b"].finetune.lr == 2e-4 and lp.experiments["a"].finetune.epochs == 1


def test_a_stage_run_by_hand_on_the_bomb_is_one_line(tmp_path):
    (tmp_path / "params.yaml").write_text(BOMB)
    r = subprocess.run([sys.executable, "-m", "stages.evaluate", "--experiment", "e"], cwd=tmp_path,
                       env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "billion laughs" in error_line(r.stderr)


def _grid(tmp_path, n: int) -> str:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"] = {"dir": str(REPO / "data/demo"), "nli_file": str(REPO / "data/demo/nli-sample.jsonl")}
    params["papers"] = {}                    # the demo's paper (its title is its catalogue's) goes with its tables
    params["studies"] = [{"name": "g", "title": "grid", "grid": {"experiment": "cross_encoder", "axes": [
        {"key": "finetune.lr", "values": [1e-5 * (i + 1) for i in range(n)], "label": "lr"},
        {"key": "seed", "values": list(range(n)), "label": "s"}]}}]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)


def test_planning_a_grid_is_linear_in_its_jobs(tmp_path):
    """A 30 x 30 grid (2,700 jobs and the demo's): the jobs, the Snakefile's rules and inputs and
    dvc.yaml in seconds (the quadratic planner took about a minute for the jobs alone here)."""
    from workflow import dag, dvc

    lp = load_params(_grid(tmp_path, 30))
    t0 = time.perf_counter()
    jobs = dag.jobs(lp)
    snake = dag.SnakemakeDag(jobs)
    inputs = sum(len(snake.inputs(j)) for j in jobs)
    stages = dvc.dvc_yaml("grid.yaml", tmp_path, lp, jobs)["stages"]
    seconds = time.perf_counter() - t0
    assert len(jobs) > 2700 and len(stages) == len(jobs) + 1 and inputs > 2 * len(jobs)
    report = next(j for j in jobs if j.stage == "report")
    assert len(report.deps) > 2700 and len(snake.inputs(report)) > 2700
    assert seconds < 20, f"{seconds:.1f} s to plan {len(jobs)} jobs"


def test_every_one_line_error_is_bounded(tmp_path, monkeypatch):
    """A message quoting a value of any size keeps its start (the file and key) and its end (what to
    do), on one line: an experiment name of 1 MB given on the command line, a value with line breaks."""
    from minbert.pipeline.plan import job_for

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("experiments:\n  a: {}\n")
    with pytest.raises(MinBertError) as e:
        job_for("params.yaml", "finetune", "x" * (1 << 20))
    text = str(e.value)
    assert text.startswith("params.yaml: unknown experiment 'xxx") and "characters left out" in text
    assert len(text) <= MAX_MESSAGE + 60 and "\n" not in text
    assert "\n" not in str(MinBertError("a\nb\r\nc")) and str(MinBertError("a\nb")) == "a\\nb"
