"""The package's layers: imports point down, and each job's code is what its stage runs.

minbert's subpackages follow the data flow, one layer each (bottom first): core, params, data,
model, train, scoring, share, pipeline, report, then how every command ends (entry) and the front doors (api, cli); the stages
(stages/) and the engines (workflow/) stand on top. A job's code (what its fingerprint covers) is
the import closure of its stage module, so the layering is what keeps an edit from re-running jobs
that never run the edited file.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from minbert.core.provenance import canonical
from minbert.pipeline import code, plan
from workflow import dag

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["core", "params", "data", "model", "train", "scoring", "share", "pipeline", "report", "entry", "api", "cli"]


def _layer(module: str) -> str:
    return module.split(".")[1]


def _project_imports(path: Path, module: str) -> set[str]:
    return {m for m in code._imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
            if m.startswith("minbert.") and code._module_file(m, code._package_roots()) is not None}


def _modules():
    for path in sorted((REPO / "minbert").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module != "minbert":
            yield path, module


def test_every_module_belongs_to_a_layer():
    assert {_layer(m) for _, m in _modules()} == set(LAYERS)


def test_imports_point_down_the_layers():
    upward = []
    for path, module in _modules():
        for target in _project_imports(path, module):
            if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module)):
                upward.append(f"{module} imports {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_stages_and_engines_import_only_minbert_and_themselves():
    for folder in ("stages", "workflow"):
        for path in (REPO / folder).glob("*.py"):
            module = f"{folder}.{path.stem}"
            targets = code._imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
            other = {"stages", "workflow"} - {folder, "stages" if folder == "workflow" else ""}
            assert not {t for t in targets if t.split(".")[0] in other}, module


# ---------------------------------------------------------------- each job's code

@pytest.fixture(scope="module")
def demo_jobs(repo_root):
    with dag.in_repo(repo_root):
        jobs = plan.pipeline("params.yaml")
        return {j.id: set(code.code_closure(*(j.code_roots or [j.module]))) for j in jobs}


def _running(jobs: dict[str, set], path: str) -> set[str]:
    """The jobs whose description (their code) changes when `path` is edited."""
    return {job for job, code in jobs.items() if path in code}


def _of(jobs, *stages) -> set[str]:
    return {j for j in jobs if j.split("@")[0] in stages}


def test_prepare_and_evaluate_run_no_model_and_no_training(demo_jobs):
    for job in ("prepare", *_of(demo_jobs, "evaluate")):
        assert not {p for p in demo_jobs[job] if p.startswith(("minbert/train/", "minbert/model/"))}, job
        assert "minbert/report/render.py" not in demo_jobs[job], job


def test_a_batch_sampler_edit_reruns_the_training_jobs_only(demo_jobs):
    training = _of(demo_jobs, "pretrain", "finetune", "retrain_heads")
    assert training and _running(demo_jobs, "minbert/data/sampler.py") == training
    # the multi-task schedules and the loop are fine-tuning's: the masked-LM pretraining runs neither
    fine_tuning = _of(demo_jobs, "finetune", "retrain_heads")
    assert _running(demo_jobs, "minbert/train/schedules.py") == fine_tuning
    assert _running(demo_jobs, "minbert/train/loop.py") == fine_tuning


def test_a_report_edit_reruns_the_report_only(demo_jobs):
    for path in ("minbert/report/plots.py", "minbert/report/tables.py", "minbert/report/templates/final.html.j2"):
        assert _running(demo_jobs, path) == {"report"}, path


def test_the_planner_is_in_no_job_and_preparation_only_in_prepare(demo_jobs):
    # what the planner decides is each job's description itself (settings, reads)
    assert _running(demo_jobs, "minbert/pipeline/plan.py") == set()
    assert _running(demo_jobs, "minbert/data/prepare.py") == {"prepare"}
    assert _running(demo_jobs, "minbert/data/demo.py") == set()
    # prediction runs the model, not the training loop nor its batch sampler
    for job in _of(demo_jobs, "predict"):
        assert "minbert/model/multitask.py" in demo_jobs[job] and "minbert/train/loop.py" not in demo_jobs[job]
        assert "minbert/data/sampler.py" not in demo_jobs[job]


def test_reading_and_checking_the_params_is_in_no_job_but_the_report(demo_jobs):
    """A job receives its settings resolved (they are in its description) and reads them as plain
    data (minbert.core.settings): the params' schema, its checks and the settings resolution are no
    job's code; reading the params and expanding the catalogue are the report's, which reads the
    params file itself."""
    for module in ("load", "catalogue"):
        assert _running(demo_jobs, f"minbert/params/{module}.py") == {"report"}, module
    for module in ("validate", "messages", "resolve", "docs", "settings"):
        assert _running(demo_jobs, f"minbert/params/{module}.py") == set(), module
    for module in ("schema", "fields", "heads", "finetune", "tasks", "__init__"):
        assert _running(demo_jobs, f"minbert/params/{module}.py") <= {"report"}, module
    assert _running(demo_jobs, "minbert/core/settings.py") >= set(demo_jobs) - {"report"}


# ---------------------------------------------------------------- a real edit, measured on the descriptions

def _descriptions(folder: Path) -> dict[str, str]:
    """Every demo job's description as the planner computes it, over the code in `folder`."""
    code._CLOSURES.clear()
    with dag.in_repo(folder):
        return {j.id: canonical(j.description()) for j in plan.pipeline("params.yaml")}


@pytest.fixture()
def code_copy(tmp_path, monkeypatch):
    """A copy of the project's code, the demo params and data, that the closures and hashes read
    (each file hashed once per content: the measure, not the planner, caches)."""
    for folder in (*code.PROJECT_PACKAGES, "data/demo"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "params", tmp_path / "params")          # the catalogue the demo's tables name
    monkeypatch.setattr(code, "_package_roots", lambda: {pkg: tmp_path / pkg for pkg in code.PROJECT_PACKAGES})
    hashes, plain = {}, code.code_hash

    def code_hash(path):
        key = (str(path), Path(path).stat().st_mtime_ns, Path(path).stat().st_size)
        if key not in hashes:
            hashes[key] = plain(path)
        return hashes[key]

    monkeypatch.setattr(code, "code_hash", code_hash)
    monkeypatch.setattr(code, "_CLOSURES", {})
    return tmp_path


# a real change (not a comment) to one module, and the only jobs whose description it may change
REAL_EDITS = {
    # the raw CS224N reader is the prepare stage's alone
    "raw reader": ("minbert/data/raw.py", lambda text: text.replace('"column \'id\' is empty"', '"no id"', 1),
                   {"prepare"}),
    # a paper claim's check is the report's alone
    "claim check": ("minbert/params/studies.py",
                    lambda text: text.replace("names two different rows", "names 2 rows", 1), {"report"}),
    # a built-in loss's code is the trainings' that run it (every demo fine-tune trains sts with mse);
    # not prepare's, the pretraining's, the predictions', the scores' or the report's
    "loss code": ("minbert/model/losses/mse.py",
                  lambda text: text.replace("F.mse_loss(output.float(), target.float())",
                                            "F.mse_loss(output.float(), target.float(), reduction='sum') / len(output)"),
                  lambda jobs: _of(jobs, "finetune", "retrain_heads")),
    # a built-in head's code: the jobs of the experiments that use it (the demo's cross_encoder alone)
    # that train or load its model
    "head code": ("minbert/model/heads/cross.py",
                  lambda text: text + "\n    def forward(self, emb):\n        return super().forward(emb) * 1.0\n",
                  {"finetune@cross_encoder", "predict@cross_encoder"}),
}


def test_a_real_edit_redescribes_only_the_jobs_that_run_it(code_copy):
    before = _descriptions(code_copy)
    assert len(before) == 26
    for edit, (path, change, expected) in REAL_EDITS.items():
        text = (code_copy / path).read_text()
        assert change(text) != text, edit
        (code_copy / path).write_text(change(text))
        after = _descriptions(code_copy)
        (code_copy / path).write_text(text)
        assert set(after) == set(before)
        expected = expected(before) if callable(expected) else expected
        assert {job for job in before if after[job] != before[job]} == expected, edit


def test_a_new_builtin_loss_or_head_redescribes_no_job(code_copy):
    """A loss or head added to the library is one file, which no job runs until its settings name it."""
    before = _descriptions(code_copy)
    for folder, source in (("losses", "mse.py"), ("heads", "cross.py")):
        text = (code_copy / "minbert/model" / folder / source).read_text()
        added = code_copy / "minbert/model" / folder / f"new_{source}"
        added.write_text(text.replace('"mse"', '"new_mse"').replace('"cross", "cross"', '"new_cross", "cross"'))
        assert _descriptions(code_copy) == before, folder
