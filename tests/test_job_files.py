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
    job = Job.build("evaluate", "a", {"predicts": ["sst"]}, Layout())
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
    (lambda i: i["description"]["settings"].__setitem__("predicts", "sst"), r"setting 'predicts' of evaluate"),
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
    job = Job.build("evaluate", "a", {"predicts": ["sst"]}, Layout())
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


def _model_copy(src: Path, dest: Path) -> Path:
    import shutil

    dest.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json"):   # the weights: alike
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
    return dest


def test_a_new_release_of_the_packaged_model_changes_its_jobs(tmp_path, monkeypatch, minilm_dir):
    """The packaged model's files are hashed into the description of every job that loads it (as
    raw data is), so a new release (here: one byte of its tokenizer) changes their job files, which
    both engines re-run; the same files elsewhere change nothing."""
    from minbert.core import models
    from minbert.core.provenance import one_pass

    monkeypatch.chdir(tmp_path)
    settings = {"model": "all-MiniLM-L6-v2", "seed": 1, "max_length": 32,
                "finetune": {"tasks": ["sst"]}}
    release = _model_copy(minilm_dir, tmp_path / "release1")
    monkeypatch.setattr(models, "packaged_minilm_folder", lambda: release)

    def described():
        with one_pass():
            return Job.build("finetune", "a", settings, Layout()).file_text()

    first = described()
    assert json.loads(first)["description"]["sources"]["all-MiniLM-L6-v2"]
    moved = _model_copy(release, tmp_path / "elsewhere")
    monkeypatch.setattr(models, "packaged_minilm_folder", lambda: moved)
    assert described() == first
    text = (moved / "tokenizer.json").read_text()
    (moved / "tokenizer.json").write_text(text.replace('"[UNK]"', '"[unk]"', 1))
    assert described() != first


def test_a_hub_model_is_the_snapshot_in_the_local_cache(tmp_path, monkeypatch):
    """A Hub id resolves to its snapshot in the local Hugging Face cache (offline, no network asked
    when it is there); a new snapshot there (`huggingface-cli download ID` fetched a release) is a
    new model for the jobs that load it."""
    from minbert.core.models import model_hash, model_folder

    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny-bert"

    def snapshot(revision: str, config: str) -> None:
        folder = repo / "snapshots" / revision
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(config)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    snapshot("a" * 40, '{"hidden_size": 32}')
    assert model_folder("org/tiny-bert") == repo / "snapshots" / ("a" * 40)
    first = model_hash("org/tiny-bert")
    snapshot("b" * 40, '{"hidden_size": 64}')
    assert model_hash("org/tiny-bert") != first
