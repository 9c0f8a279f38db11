"""A job file (results/jobs/<stage>/<name>.json) is checked against what the stage registry derives
for its stage, name and settings before a stage trusts it: a hand-edited or foreign file that lists
an output outside the results folder, a setting the stage does not know, reads the planner did not
derive, or that lies where the planner does not write it, is one line, and nothing is deleted
(issue 37: a stage deleted any file a job file listed as an output). A stage run by hand plans its
own job alone."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, child_env, error_line

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.pipeline.job import Job
from minbert.pipeline.plan import write_job_file


def _written(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    job = Job.build("evaluate", "a", {"tasks": ["sst"]}, Layout())
    write_job_file(job)
    return Path(job.job_file)


def _edit(path: Path, change) -> None:
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def test_a_job_file_the_planner_wrote_is_read(tmp_path, monkeypatch):
    path = _written(tmp_path, monkeypatch)
    job = Job.read(path, "evaluate", "a")
    assert job.writes == {"metrics": ["results/experiments/a/metrics.json"]}
    assert job.reads["predictions"] == ["results/experiments/a/predictions/sst-dev.csv",
                                        "results/experiments/a/predictions/sst-test.csv"]


@pytest.mark.parametrize("change,pattern", [
    (lambda i: i["job"]["writes"]["metrics"].__setitem__(0, "/etc/hostname"), r"its writes are not what the planner"),
    (lambda i: i["job"].__setitem__("run_record", "../outside.json"), r"its run_record are not what the planner"),
    (lambda i: i["description"]["reads"]["splits"].append("/etc/passwd"), r"its reads are not what the planner"),
    (lambda i: i["description"]["settings"].__setitem__("delete_everything", True),
     r"setting 'delete_everything' of evaluate: Extra inputs are not permitted"),
    (lambda i: i["description"]["settings"].__setitem__("tasks", "sst"), r"setting 'tasks' of evaluate"),
    (lambda i: i["job"].__setitem__("results", "/"), r"the job file of evaluate@a for the results folder / is "
                                                     r"/jobs/evaluate/a.json, not this file"),
    (lambda i: i["description"].__setitem__("name", "b"), r"holds job evaluate@b, not evaluate@a"),
    (lambda i: i.__setitem__("format", "minbert-job-1"), r"not a job file of this version"),
])
def test_a_foreign_or_edited_job_file_is_refused_in_one_line(tmp_path, monkeypatch, change, pattern):
    path = _written(tmp_path, monkeypatch)
    _edit(path, change)
    with pytest.raises(MinBertError, match=pattern) as e:
        Job.read(path, "evaluate", "a")
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_the_stage_deletes_nothing_a_foreign_job_file_lists(tmp_path):
    """The stage itself, started as an engine starts it, on a job file whose output is a file of the
    user's outside the results folder: one line, exit 2, the file untouched."""
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    job = Job.build("evaluate", "a", {"tasks": ["sst"]}, Layout())
    (tmp_path / "results/jobs/evaluate").mkdir(parents=True)
    text = json.loads(job.file_text())
    text["job"]["writes"]["metrics"] = [str(victim)]
    (tmp_path / job.job_file).write_text(json.dumps(text))
    r = subprocess.run([sys.executable, "-m", "stages.evaluate", "--experiment", "a", "--job", job.job_file],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "its writes are not what the planner derives for evaluate@a" in error_line(r.stderr)
    assert victim.read_text() == "mine"


def test_a_stage_run_by_hand_plans_its_own_job_alone(tmp_path, monkeypatch):
    """job_for plans the one job asked for, never the whole pipeline (issue 37: a one-second
    evaluate run by hand planned every job first, 51 s on a 30 x 30 grid)."""
    from minbert.pipeline import plan

    def whole_pipeline(*args, **kwargs):
        raise AssertionError("planned every job")

    monkeypatch.setattr(plan, "pipeline", whole_pipeline)
    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"] = {"dir": str(REPO / "data/demo"), "nli_file": None}
    params["pretrainings"], params["ensembles"], params["export"] = {}, {}, {"experiments": []}
    params["experiments"] = {"e": {}}
    params["studies"] = [{"name": "g", "title": "grid", "grid": {"experiment": "e", "axes": [
        {"key": "finetune.lr", "values": [1e-5 * (i + 1) for i in range(30)], "label": "lr"},
        {"key": "seed", "values": list(range(30)), "label": "s"}]}}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    t0 = time.perf_counter()
    job = plan.job_for("params.yaml", "evaluate", "g.lr5e-05.s7")
    seconds = time.perf_counter() - t0
    assert job.reads["predictions"][0] == "results/experiments/g.lr5e-05.s7/predictions/sst-dev.csv"
    assert seconds < 10, f"{seconds:.1f} s to plan one job of 900 experiments"
