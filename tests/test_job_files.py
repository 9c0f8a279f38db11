"""A job file (results/jobs/<stage>/<name>.json) is checked against what the stage specs derive
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
    params["papers"] = {}                    # the demo's paper (its title is its catalogue's) goes with its tables
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


def test_a_model_read_put_back_with_a_new_date_is_what_the_run_read(tmp_path, monkeypatch, tiny_model_dir):
    """A job's model read is hashed as its fingerprint hashes it (the files the model loads): a copy
    of the same files with new dates (a fresh clone, DVC's checkout in a queued experiment) is what
    the last run read, so its job file names no stale read; one byte of the model changed is one."""
    import os
    import shutil

    from minbert.core.provenance import one_pass
    from minbert.pipeline.plan import LastRun

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "models/tiny")
    settings = {"model": "models/tiny", "seed": 1, "max_length": 32, "finetune": {"tasks": ["sst"]}}
    with one_pass():
        job = Job.build("finetune", "a", settings, Layout())
        recorded = job.runtime_description()
    assert "models/tiny" in recorded["read_hashes"]
    last = LastRun(job.description(), job.description(), recorded, time.time() - 60, "f")
    later = time.time() + 5
    for f in (tmp_path / "models/tiny").iterdir():
        os.utime(f, (later, later))
    with one_pass():
        assert last.changed_reads(Job.build("finetune", "a", settings, Layout())) == []
    vocab = tmp_path / "models/tiny/vocab.txt"
    vocab.write_text(vocab.read_text().replace("[UNK]", "[unk]", 1))
    with one_pass():
        assert last.changed_reads(Job.build("finetune", "a", settings, Layout())) == ["models/tiny"]


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


# ---------------------------------------------------------------- identity: the working folder is no part of it

LOSS = '''"""A loss of the user's, split into files: a test module."""
from ext.scale import HALF

from minbert.core.register import Loss, register_loss


@register_loss
class HalfSquare(Loss):
    name = "half_square"
    kinds = ("regression",)
    batch_statistic = False
    calibrate = False

    def __call__(self, output, target, pair=None):
        import numpy  # noqa: F401  (an installed package: not the user's code)

        return ((output.float() - target.float()) ** 2).mean() * HALF
'''


def _user_module(root: Path) -> Path:
    """ext/loss.py importing its helper ext/scale.py, which imports ext/numbers.py (no __init__:
    a namespace package, found on the path as Python finds it)."""
    (root / "ext").mkdir(parents=True)
    (root / "ext" / "loss.py").write_text(LOSS)
    (root / "ext" / "scale.py").write_text('"""The scale."""\nfrom ext.numbers import TWO\n\nHALF = 1 / TWO\n')
    (root / "ext" / "numbers.py").write_text("TWO = 2.0\n")
    return root / "ext" / "loss.py"


def _finetune_job(results: str, module: str) -> Job:
    return Job.build("finetune", "a", {"model": "all-MiniLM-L6-v2", "seed": 1, "max_length": 32,
                                       "finetune": {"tasks": ["sst"]}, "modules": [module]}, Layout(results))


def test_a_jobs_description_is_the_same_from_any_folder(tmp_path, monkeypatch):
    """Issue 51: the code closure was keyed by paths relative to the working folder from inside the
    project and absolute from elsewhere, so the same job run from another folder was another job
    (a finished fine-tune trained again, a killed one started afresh). Every file is now named
    relative to the project's folder (a user's module elsewhere: its resolved path)."""
    module = _user_module(tmp_path / "user")
    monkeypatch.syspath_prepend(str(tmp_path / "user"))
    described = {}
    for where in (REPO, tmp_path, tmp_path / "user" / "ext"):
        monkeypatch.chdir(where)
        described[where] = _finetune_job(str(tmp_path / "results"), str(module)).description()
    first = described[REPO]
    assert all(d == first for d in described.values())
    code = first["code"]
    assert "stages/finetune.py" in code and "minbert/pipeline/runinfo.py" in code
    assert all(not k.startswith("/") for k in code if "/user/" not in k)
    assert first["modules"] == {str(module): sorted(str(tmp_path / "user/ext" / f) for f in
                                                    ("loss.py", "numbers.py", "scale.py"))}


def test_a_user_modules_helpers_are_its_code(tmp_path, monkeypatch):
    """Issue 49: a user's module is its own file and the files of the user's it imports (here a
    helper importing another), found as Python finds them, not an installed package; an edit to
    a helper re-describes the jobs that use the module, a docstring does not."""
    from minbert.pipeline.code import code_closure, module_files

    module = _user_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert module_files("ext/loss.py") == [str(tmp_path / "ext" / f) for f in ("loss.py", "numbers.py", "scale.py")]
    closure = code_closure("ext/loss.py")
    assert "minbert/core/losses.py" in closure and not any("numpy" in f for f in closure)
    before = _finetune_job("results", "ext/loss.py").description()
    (tmp_path / "ext" / "numbers.py").write_text('"""Two, said."""\nTWO = 2.0\n')
    assert _finetune_job("results", "ext/loss.py").description() == before
    (tmp_path / "ext" / "numbers.py").write_text("TWO = 4.0\n")
    after = _finetune_job("results", "ext/loss.py").description()
    assert {k for k in after["code"] if after["code"][k] != before["code"][k]} == {str(tmp_path / "ext/numbers.py")}
    assert module.is_file()


def test_an_importable_user_module_holds_its_packages_and_relative_imports(tmp_path, monkeypatch):
    from minbert.pipeline.code import module_files

    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VERSION = 1\n")
    (pkg / "losses.py").write_text("from . import helpers\nfrom .sub import deep\n")
    (pkg / "helpers.py").write_text("import os\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("from ..helpers import os\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_files("mypkg.losses") == [str(pkg / f) for f in ("__init__.py", "helpers.py", "losses.py",
                                                                   "sub/__init__.py", "sub/deep.py")]


def test_a_hand_run_from_another_folder_is_the_same_job(tmp_path):
    """The same command, with absolute --params and --results, run in the project and then from
    another folder: the second run finds the job's outputs in place (issue 51: it ran again)."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"data": {"dir": str(REPO / "data/demo"), "nli_file": None},
                                      "experiments": {"a": {}}}))
    cmd = [sys.executable, "-m", "stages.prepare", "--params", str(params), "--results", str(tmp_path / "results")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outs = []
    for cwd in (REPO, elsewhere, tmp_path):
        r = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout + r.stderr)
    assert all("prepare: up to date" in out for out in outs[1:]), outs[1][-2000:]


def test_a_job_file_run_from_another_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    """A job file's paths (its results folder, its inputs) are the folder it was planned in's: from
    another folder the stage says where to run it, rather than "not this file"."""
    path = _written(tmp_path, monkeypatch).resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(MinBertError) as e:
        Job.read(path, "evaluate", "a")
    assert str(e.value) == f"{path}: its paths are relative to the folder it was planned in, " \
                           f"{tmp_path.resolve()}, not to this one; run the stage from there (cd {tmp_path.resolve()})"
