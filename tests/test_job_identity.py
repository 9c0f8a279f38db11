"""A job's identity is the code that computes it: measured on the demo's planner, each job's
description before and after an edit in a copy of the project.

- the params' schema and checks are the planner's: a job reads its settings as plain data
  (minbert.core.settings), so an edit to the schema re-describes at most the report, while a change
  of a default re-describes exactly the jobs whose resolved settings it changes;
- a job that trains or loads a model holds the code of the heads (and losses) its experiment uses,
  and no other: an edit to a head re-describes the jobs of the experiments that use it.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing

import pytest
from conftest import child_env
from pydantic import BaseModel
from test_layers import _descriptions, code_copy  # noqa: F401  (fixture)

from minbert.core import settings as plain
from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.plain import as_json, read
from minbert.core.settings import read_settings
from minbert.params import load_params
from minbert.params import settings as models
from minbert.pipeline import plan, stage_specs
from minbert.pipeline.job import Job
from minbert.report.data import load_report_data

STAGE_SETTINGS = [name for name, cls in vars(models).items()
                  if isinstance(cls, type) and issubclass(cls, BaseModel) and name.endswith("Settings")
                  and cls.__module__ == models.__name__]


def _nested(annotation) -> list[type]:
    """The models (or dataclasses) a field's type holds."""
    found, todo = [], [annotation]
    while todo:
        a = todo.pop()
        if isinstance(a, type) and (issubclass(a, BaseModel) or dataclasses.is_dataclass(a)):
            found.append(a)
        todo += typing.get_args(a)
    return found


def _agree(model: type[BaseModel], cls: type, where: str) -> None:
    extra = getattr(cls, "EXTRA", None)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != extra}
    assert set(fields) == set(model.model_fields), f"{where}: {set(fields) ^ set(model.model_fields)}"
    assert (extra is not None) == (model.model_config.get("extra") == "allow"), where
    hints = typing.get_type_hints(cls)
    for name, info in model.model_fields.items():
        inner, mine = _nested(info.annotation), _nested(hints[name])
        inner = [m for m in inner if m.__name__ != "TaskParams"]      # declared tasks: JSON as declared
        assert len(inner) == len(mine), f"{where}.{name}"
        for a, b in zip(inner, mine):
            _agree(a, b, f"{where}.{name}")


@pytest.mark.parametrize("name", STAGE_SETTINGS)
def test_each_stages_plain_settings_have_the_keys_of_its_params_model(name):
    """The plain classes a stage reads its settings with hold the keys of the params' model the
    planner resolves them with, section by section (a key added to one and not the other fails)."""
    assert hasattr(plain, name), f"minbert.core.settings has no {name}"
    _agree(getattr(models, name), getattr(plain, name), name)


def test_a_stage_reads_the_settings_the_planner_wrote_back_as_they_were(repo_root):
    """Every demo job's settings, read as plain data and written back, are its settings again."""
    lp = load_params(repo_root / "params.yaml")
    jobs = plan.pipeline(lp)
    for job in jobs:
        if job.stage == "report":
            continue
        cls = getattr(plain, type(job.spec.model(**job.settings)).__name__)
        assert as_json(read_settings(cls, job.settings, job.job_file)) == job.settings, job.id


@pytest.mark.parametrize("change, key", [
    (lambda s: s["finetune"].update(lr_rate=1e-3), "finetune.lr_rate"),
    (lambda s: s["finetune"].update(epochs="3"), "finetune.epochs"),
    (lambda s: s["finetune"].update(epochs=True), "finetune.epochs"),
    (lambda s: s["finetune"]["heads"].update(hidden_layers="deep"), "finetune.heads.hidden_layers"),
    (lambda s: s["finetune"].pop("batch_size"), "finetune.batch_size"),
    (lambda s: s.update(seed=None), "seed"),
])
def test_a_bad_setting_is_one_line_naming_its_key(repo_root, change, key):
    job = next(j for j in plan.pipeline(load_params(repo_root / "params.yaml")) if j.stage == "finetune")
    settings = json.loads(json.dumps(job.settings))
    change(settings)
    with pytest.raises(MinBertError) as e:
        read_settings(plain.FinetuneSettings, settings, "results/jobs/finetune/x.json")
    assert "\n" not in str(e.value) and f"setting '{key}'" in str(e.value)


def test_plain_settings_are_frozen(repo_root):
    job = next(j for j in plan.pipeline(load_params(repo_root / "params.yaml")) if j.stage == "finetune")
    s = read(plain.FinetuneSettings, job.settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.finetune.lr = 1.0
    with pytest.raises(TypeError):
        s.finetune.heads.losses["sts"] = "pearson"
    assert isinstance(s.finetune.tasks, tuple)


# ---------------------------------------------------------------- edits, measured on the descriptions

def _changed(before: dict, after: dict) -> set[str]:
    assert set(after) == set(before)
    return {job for job in before if after[job] != before[job]}


def _edit(folder, path: str, change) -> str:
    text = (folder / path).read_text()
    assert change(text) != text, path
    (folder / path).write_text(change(text))
    return text


# code of the params' schema and checks that no computation reads (each a real change of the module)
SCHEMA_EDITS = {
    "a constant": ("minbert/params/tasks.py", lambda t: t + "\nUNUSED_LIMIT = 3\n"),
    "a check's message": ("minbert/params/finetune.py",
                          lambda t: t.replace('"needs at least one task"', '"needs one task at least"', 1)),
    "a validator": ("minbert/params/heads.py",
                    lambda t: t.replace('raise ValueError("hybrid lists a task twice")',
                                        'raise ValueError("hybrid names a task twice")', 1)),
    "a field's bound": ("minbert/params/schema.py", lambda t: t.replace("ge=8, le=512", "ge=8, le=1024", 1)),
    "the fields' base": ("minbert/params/fields.py", lambda t: t.replace("NAME_MAX = 100", "NAME_MAX = 100  \nX = 1", 1)),
    "a settings model": ("minbert/params/settings.py", lambda t: t + "\n\nclass Unused(PrepareSettings):\n    x: int = 1\n"),
}


def test_an_edit_to_the_params_schema_redescribes_at_most_the_report(code_copy):  # noqa: F811
    before = _descriptions(code_copy)
    assert len(before) == 26
    for edit, (path, change) in SCHEMA_EDITS.items():
        text = _edit(code_copy, path, change)
        after = _descriptions(code_copy)
        (code_copy / path).write_text(text)
        assert _changed(before, after) <= {"report"}, edit


def _experiments_using(lp, head: str) -> set[str]:
    """The demo's experiments whose model holds `head` (read from the params, not the planner)."""
    out = set()
    for name, exp in lp.experiments.items():
        tasks = set(exp.finetune.tasks) | set((exp.retrain_heads.tasks or []) if exp.retrain_heads.enabled else [])
        if head in {exp.finetune.heads.head_of(t) for t in tasks}:
            out.add(name)
    return out


@pytest.mark.parametrize("head", ["cosine", "classifier"])
def test_an_edit_to_a_head_redescribes_the_jobs_of_the_experiments_that_use_it(code_copy, head):  # noqa: F811
    lp = load_params(code_copy / "params.yaml")
    using = _experiments_using(lp, head)
    assert using and (head == "classifier" or using != set(lp.experiments))   # cosine: some experiments, not all
    before = _descriptions(code_copy)
    path = f"minbert/model/heads/{head}.py"
    text = _edit(code_copy, path, lambda t: t + "\n\ndef _unused(x):\n    return x * 2\n")
    after = _descriptions(code_copy)
    (code_copy / path).write_text(text)
    model_jobs = {"finetune", "retrain_heads", "predict", "export", "teach"}
    expected = {j for j in before if j.split("@")[0] in model_jobs and j.partition("@")[2] in using}
    assert _changed(before, after) == expected


def test_a_change_of_a_default_redescribes_exactly_the_jobs_whose_settings_it_changes(code_copy):  # noqa: F811
    """A default lives in the params' schema (no job's code): changing it re-describes the jobs whose
    resolved settings change (here: every fine-tune that does not set its own weight decay), and
    those jobs only because their settings changed."""
    before = _descriptions(code_copy)
    _edit(code_copy, "minbert/params/finetune.py",
          lambda t: t.replace('weight_decay: float = Field(0.01,', 'weight_decay: float = Field(0.02,', 1))
    script = ("import json; from minbert.core.provenance import canonical; from minbert.pipeline import plan; "
              "print(json.dumps({j.id: canonical(j.description()) for j in plan.pipeline('params.yaml')}))")
    r = subprocess.run([sys.executable, "-c", script], cwd=code_copy, env=child_env(code_copy), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    after = json.loads(r.stdout.splitlines()[-1])
    changed = _changed(before, after)
    settings_changed = {j for j in before if json.loads(after[j])["settings"] != json.loads(before[j])["settings"]}
    assert changed - {"report"} == settings_changed     # the report shows the params file: its code changed
    assert {j for j in changed if j != "report"} == {j for j in before if j.startswith("finetune@")}


# ---------------------------------------------------------------- the report, a stage like any other

def test_the_report_run_from_its_job_file_reads_what_its_description_names(repo_root, tmp_path):
    """The report's job lists the outputs it shows by job and name, and read back from its job file
    (as an engine starts it) it reads exactly those: what its fingerprint covers."""
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    jobs = plan.pipeline(load_params(repo_root / "params.yaml"), layout)
    report = next(j for j in jobs if j.stage == "report")
    assert report.reads["evaluate@cross_encoder:metrics"] == [layout.metrics("cross_encoder")]
    assert report.reads["finetune@pcgrad:run_record"] == [layout.run_record("finetune", "pcgrad")]
    assert not any(key.endswith(":model") for key in report.reads)           # models are not shown
    plan.write_job_file(report)
    again = Job.read(report.job_file, "report", None)
    assert again.reads == report.reads and sorted(again.read_paths) == sorted(report.read_paths)


def test_a_new_stages_outputs_reach_the_report_without_an_edit(repo_root, tmp_path, monkeypatch):
    """A stage added to the stage specs has its outputs among the report's reads, and in what the
    report loads (`ReportData.outputs`), by job and output name."""
    extra = dataclasses.replace(stage_specs.STAGES["evaluate"], name="rescore", io=lambda L, name, s:
                                stage_specs.StageIO({"predictions": []},
                                                    {"scores": [f"{L.results}/experiments/{name}/rescored.json"]}))
    monkeypatch.setitem(stage_specs.STAGES, "rescore", extra)
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    lp = load_params(repo_root / "params.yaml")
    report = next(j for j in plan.pipeline(lp, layout) if j.stage == "report")
    assert report.reads["rescore@pcgrad:scores"] == [f"{layout.results}/experiments/pcgrad/rescored.json"]
    with lp.registry.active():
        data = load_report_data(lp, layout, report.reads)
    assert data.outputs.files("rescore@pcgrad", "scores") == report.reads["rescore@pcgrad:scores"]
