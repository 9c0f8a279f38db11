"""docs/extending.md's catalogue (params/extending.yaml) end to end on a tiny random BERT, under
Snakemake and under DVC: the user's tasks (SNLI, a pair task with three classes; a sentiment score,
a one-sentence regression task) flow through prepare, training, predictions, evaluation and the
report; `minbert predict`, the API and the export answer for them; the user's head and loss are used
by name, and an edit to the module that defines them re-runs the jobs that use it and no others,
under each engine. And the page's examples are the catalogue's and the modules' own text."""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import child_env, shared_data_dir
from test_workflow import (
    DVC,
    SNAKEMAKE,
    commands_run,
    dvc_changed,
    dvc_repro_all,
    git_dvc_project,
    job_ids,
    make_copy,
    needs_dvc,
    needs_snakemake,
    run,
)

from workflow import dag

REPO = Path(__file__).resolve().parents[1]
HEADS, LOSSES = "examples/extending/heads.py", "examples/extending/losses.py"
# a module of the test's whose loss takes the place of the built-in `mse`, said so: `mine` trains sts with it
TWICE = "ext/mse_twice.py"
TWICE_TEXT = '''"""The built-in mse, twice over: a loss of the user's used in place of a built-in one."""
import torch.nn.functional as F

from minbert.core.register import Loss, register_loss


@register_loss(replace=True)
class MseTwice(Loss):
    name, kinds = "mse", ("regression",)

    def __call__(self, output, target, pair=None):
        return 2 * F.mse_loss(output.float(), target.float())
'''


def snli_sample() -> str:
    """The SNLI sample beside the repository; the demo's SNLI-format sample where it is absent."""
    shared = shared_data_dir()
    found = shared / "nli" / "snli-sample.jsonl" if shared else None
    return str(found) if found and found.is_file() else str(REPO / "data" / "demo" / "nli-sample.jsonl")


def extending_params(model: str) -> dict:
    """The documented catalogue's tasks and modules on a tiny model, in two experiments: `mine` trains
    both declared tasks with the module's head and loss (and is exported), `plain` one of them with
    built-in heads and losses only."""
    p = yaml.safe_load((REPO / "params" / "extending.yaml").read_text())
    p["base"].update(model=model, device="cpu", threads=1, max_length=32)
    p["base"]["finetune"].update(epochs=1, batch_size=8, max_steps_per_epoch=2,
                                 downsample={"mode": "fixed", "size": 40})
    p["tasks"]["snli"]["files"]["train"] = snli_sample()
    p["modules"] = [*p["modules"], TWICE]
    p["experiments"] = {"mine": {"finetune": {"tasks": ["sts", "snli", "sst_score"],
                                              "heads": {"sts": "bilinear", "losses": {"sst_score": "huber"}}}},
                        "plain": {"finetune": {"tasks": ["sst", "snli"]}}}
    p["studies"] = [{"name": "yours", "title": "Your tasks", "experiments": ["plain", "mine"]}]
    p["export"] = {"experiments": ["mine"]}
    return p


def with_twice(folder: Path) -> Path:
    (folder / TWICE).parent.mkdir(parents=True)
    (folder / TWICE).write_text(TWICE_TEXT)
    return folder


def trained_by_hand_as_by_the_engine(folder: Path) -> None:
    """`finetune@mine` run by hand from the params (its own results folder) trains the very model the
    engine trained from the job file: the same settings name the same modules, so both processes
    work from the same registry (a module that replaces a built-in loss included)."""
    import torch

    hand = ["--params", "params.yaml", "--results", "hand"]
    run([sys.executable, "-m", "stages.prepare", *hand], folder)
    run([sys.executable, "-m", "stages.finetune", "--experiment", "mine", *hand], folder)
    job = json.loads((folder / "results/jobs/finetune/mine.json").read_text())["description"]
    assert TWICE in job["settings"]["modules"]          # the engine's process imported it too
    engine, by_hand = (torch.load(folder / r / "experiments/mine/finetune/model.pt", weights_only=True)
                       for r in ("results", "hand"))
    assert engine["state_dict"].keys() == by_hand["state_dict"].keys()
    for key, value in engine["state_dict"].items():
        assert torch.equal(value, by_hand["state_dict"][key]), key


TARGETS = ["all", "results/exports/mine"]
USING_THE_MODULES = {"finetune@mine", "predict@mine", "export@mine"}     # what runs the head's and loss's code


def plan(folder: Path) -> set[str]:
    return job_ids(folder, commands_run(run([SNAKEMAKE, "-n", "--printshellcmds", "--cores", "2", *TARGETS], folder)))


def test_the_documented_catalogue_plans_each_extension_where_it_is_used(tmp_path):
    """params/extending.yaml as documented: every experiment plans, and each module of the user's is
    code of the jobs of the experiments that use its head or loss, and of no other."""
    from minbert.params import load_params
    from minbert.pipeline import code
    from minbert.pipeline import plan as planner

    p = yaml.safe_load((REPO / "params" / "extending.yaml").read_text())
    p["tasks"]["snli"]["files"]["train"] = snli_sample()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    with dag.in_repo(REPO):
        jobs = planner.pipeline(load_params(tmp_path / "params.yaml"))
        closures = {j.id: set(code.code_closure(*(j.code_roots or [j.module]))) for j in jobs}
    assert {j for j, files in closures.items() if HEADS in files} == {"finetune@own_head", "predict@own_head"}
    assert {j for j, files in closures.items() if LOSSES in files} == \
        {"finetune@own_task_and_loss", "predict@own_task_and_loss"}
    settings = {j.id: j.settings for j in jobs}
    assert set(settings["finetune@with_snli"]["tasks"]) == {"snli"} and "tasks" not in settings["finetune@baseline"]
    assert settings["finetune@para_ranking"]["finetune"]["heads"]["losses"] == {"para": "ranking"}


@pytest.fixture(scope="module")
def snake_repo(repo_root, tmp_path_factory, tiny_model_dir):
    if SNAKEMAKE is None:
        pytest.skip("snakemake is not installed")
    folder = make_copy(repo_root, with_twice(tmp_path_factory.mktemp("extending") / "repo"), tiny_model_dir,
                       extending_params("models/tiny"))
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], folder)
    assert job_ids(folder, commands_run(log)) == {j.id for j in dag.jobs("params.yaml", repo=folder)}
    return folder


@pytest.mark.slow
@needs_snakemake
def test_the_declared_tasks_run_through_the_pipeline_and_the_report(snake_repo):
    prepared = json.loads((snake_repo / "results/data/summary.json").read_text())["files"]
    assert {"snli-train.tsv", "snli-dev.tsv", "sst_score-train.tsv", "sst_score-dev.tsv", "sst_score-test.tsv"} \
        <= set(prepared) and "snli-test.tsv" not in prepared          # no test file declared: no test split
    metrics = json.loads((snake_repo / "results/experiments/mine/metrics.json").read_text())["dev"]
    assert 0 <= metrics["snli_acc"] <= 1 and metrics["n"]["snli"] == prepared["snli-dev.tsv"]["rows_kept"]
    assert "sst_score_pearson" in metrics and metrics["n"]["sst_score"] == prepared["sst_score-dev.tsv"]["rows_kept"]
    final = (snake_repo / "reports/final.html").read_text()
    assert "Your tasks" in final and 'data-key="snli_acc"' in final    # the study table's SNLI column
    page = (snake_repo / "reports/experiments/mine.html").read_text()
    assert "Inference (SNLI): confusion matrix on dev" in page and "contradiction" in page
    assert "Sentiment score (SST, 0-4): predicted against true scores on dev" in page


@pytest.mark.slow
@needs_snakemake
def test_minbert_predict_the_api_and_the_export_answer_for_the_declared_tasks(snake_repo, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\nA man plays a guitar.\tA person plays music.\n")
    command = [sys.executable, "-m", "minbert.cli", "predict", "results/experiments/mine"]
    out = subprocess.run([*command, str(pairs)], cwd=snake_repo, env=child_env(snake_repo), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and "the model runs code it names (module " in out.stderr     # its modules: trusted?
    out = subprocess.run([*command, str(pairs), "--trust-remote-code"],
                         cwd=snake_repo, env=child_env(snake_repo), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    got = dict(zip(header.split("\t"), row.split("\t")))
    assert got["snli_class"] in ("entailment", "neutral", "contradiction") and "sts_score" in got
    assert abs(sum(float(got[f"snli_prob_{k}"]) for k in range(3)) - 1) < 1e-4
    out = subprocess.run([*command, "--trust-remote-code"], input="A gripping, funny film.\n", cwd=snake_repo, env=child_env(snake_repo),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "sentence\tsst_score_score"
    assert 0 <= float(out.stdout.splitlines()[1].split("\t")[1]) <= 4      # within the declared range
    # the export: the tasks' heads, their declarations and the module the head comes from
    export = snake_repo / "results/exports/mine"
    manifest = json.loads((export / "minbert.json").read_text())
    assert manifest["tasks"] == ["sts", "snli", "sst_score"]
    assert set(manifest["declared"]["tasks"]) == {"snli", "sst_score"} and manifest["declared"]["modules"] == \
        [HEADS, TWICE, LOSSES]
    from safetensors import safe_open

    with safe_open(str(export / "heads.safetensors"), "pt") as f:
        assert any(k.startswith("heads.snli.") for k in f.keys()) and "heads.sts.bilinear.weight" in f.keys()
    from minbert.api import load_model

    # the export carries the modules' code (code/) and its record: it loads from any folder once trusted
    assert set(manifest["declared"]["code"]) == {HEADS, TWICE, LOSSES}
    assert all((export / "code" / rel).is_file() for files in manifest["declared"]["code"].values() for rel in files)
    model = load_model(export, device="cpu", trust_remote_code=True)
    answer = model.predict("snli", [("A man plays.", "A person plays.")])
    assert list(answer.columns) == ["prediction", "class", "prob_0", "prob_1", "prob_2"]


@pytest.mark.slow
@needs_snakemake
def test_a_hand_run_trains_what_snakemake_trains(snake_repo):
    trained_by_hand_as_by_the_engine(snake_repo)


@pytest.mark.slow
@needs_snakemake
def test_an_edit_to_a_module_reruns_the_jobs_that_use_it_under_snakemake(snake_repo):
    """Each edit plans the jobs that run the module (and what reads their outputs: the evaluation
    and the report); a comment in it plans nothing."""
    reading = {"evaluate@mine", "report"}
    for path, edit, expected in ((HEADS, "code", USING_THE_MODULES | reading),
                                 (LOSSES, "code", USING_THE_MODULES | reading), (HEADS, "comment", set())):
        before = (snake_repo / path).read_text()
        (snake_repo / path).write_text(EDITS[edit](before))
        try:
            assert plan(snake_repo) == expected, (path, edit)
        finally:
            (snake_repo / path).write_text(before)
    assert plan(snake_repo) == set()


EDITS = {"code": lambda text: text + "\nEDITED_FOR_A_TEST = True\n", "comment": lambda text: text + "\n# a comment\n"}
HELPER = "examples/extending/huber_delta.py"


@contextlib.contextmanager
def loss_split_in_two(folder: Path):
    """The loss module with its constant in a helper file of its own, which it imports (issue 49: a
    module's helpers were no code of any job); the module as it was afterwards."""
    before = (folder / LOSSES).read_text()
    split = before.replace("from minbert.core.register import", "from examples.extending.huber_delta import DELTA\n"
                           "from minbert.core.register import", 1).replace("delta=0.1", "delta=DELTA")
    assert split.count("DELTA") == 2
    (folder / HELPER).write_text('"""Where the Huber loss turns linear."""\nDELTA = 0.1\n')
    (folder / LOSSES).write_text(split)
    try:
        yield
    finally:
        (folder / LOSSES).write_text(before)
        (folder / HELPER).unlink()


@contextlib.contextmanager
def edited(path: Path, edit: str):
    before = path.read_text()
    path.write_text(EDITS[edit](before))
    try:
        yield
    finally:
        path.write_text(before)


@pytest.mark.slow
@needs_snakemake
def test_an_edit_to_a_modules_helper_reruns_the_jobs_that_use_it_under_snakemake(snake_repo):
    """The split taken as done (`--touch`: nothing trains), an edit to the helper alone plans what
    an edit to the module does (a comment in a module plans nothing: the test above)."""
    with loss_split_in_two(snake_repo):
        run([SNAKEMAKE, "--touch", "--cores", "2", *TARGETS], snake_repo)
        assert plan(snake_repo) == set()
        with edited(snake_repo / HELPER, "code"):
            assert plan(snake_repo) == USING_THE_MODULES | {"evaluate@mine", "report"}


@pytest.fixture(scope="module")
def dvc_repo(repo_root, tmp_path_factory, tiny_model_dir):
    if DVC is None:
        pytest.skip("dvc is not installed")
    return dvc_repro_all(git_dvc_project(make_copy(
        repo_root, with_twice(tmp_path_factory.mktemp("extending-dvc") / "repo"), tiny_model_dir,
        extending_params("models/tiny"))))


@pytest.mark.slow
@needs_dvc
def test_a_hand_run_trains_what_dvc_trains(dvc_repo):
    trained_by_hand_as_by_the_engine(dvc_repo)


@pytest.mark.slow
@needs_dvc
def test_the_declared_tasks_and_a_modules_edit_under_dvc(dvc_repo):
    metrics = json.loads((dvc_repo / "results/experiments/mine/metrics.json").read_text())["dev"]
    assert {"snli_acc", "sst_score_pearson"} <= set(metrics) and (dvc_repo / "reports/experiments/mine.html").is_file()
    assert (dvc_repo / "results/exports/mine/heads.safetensors").is_file()
    assert dvc_changed(dvc_repo) == set()
    before = (dvc_repo / HEADS).read_text()
    (dvc_repo / HEADS).write_text(EDITS["code"](before))
    try:
        assert dvc_changed(dvc_repo) == {j.replace("@", "-") for j in USING_THE_MODULES}
    finally:
        (dvc_repo / HEADS).write_text(before)
    assert dvc_changed(dvc_repo) == set()


@pytest.mark.slow
@needs_dvc
def test_an_edit_to_a_modules_helper_reruns_the_jobs_that_use_it_under_dvc(dvc_repo):
    """The resolve stage depends on each module's helpers (dvc.yaml lists them), so an edit to the
    helper alone rewrites the job files of the jobs that use the module."""
    with loss_split_in_two(dvc_repo):
        run([sys.executable, "-m", "workflow.dag", "--write-dvc"], dvc_repo)
        assert HELPER in yaml.safe_load((dvc_repo / "dvc.yaml").read_text())["stages"]["resolve"]["deps"]
        run([DVC, "repro", "resolve"], dvc_repo)
        stale = sorted(j.replace("@", "-") for j in USING_THE_MODULES)
        run([DVC, "commit", "--force", "resolve", *stale], dvc_repo)      # the split taken as done: nothing trains
        assert dvc_changed(dvc_repo) == set()
        with edited(dvc_repo / HELPER, "code"):
            assert dvc_changed(dvc_repo) == set(stale)


# ---------------------------------------------------------------- the page's examples

def examples(page: str):
    """(file the example comes from, language, text) of every block marked `<!-- example: FILE -->`."""
    found = re.findall(r"<!-- example: (\S+) -->\n```(\w+)\n(.*?)```", page, re.S)
    assert len(found) >= 8
    return found


def contained(part, whole) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and contained(v, whole[k]) for k, v in part.items())
    return part == whole


def test_the_pages_examples_are_the_catalogues_and_the_modules_own_text():
    page = (REPO / "docs/extending.md").read_text()
    catalogue = yaml.safe_load((REPO / "params/extending.yaml").read_text())
    for source, language, text in examples(page):
        if language == "python":
            assert text == (REPO / source).read_text(), source
        else:
            assert source == "params/extending.yaml" and contained(yaml.safe_load(text), catalogue), text
            assert all(line in (REPO / source).read_text() for line in text.splitlines()), text
    assert "snakemake --cores all --config params=params/extending.yaml" in page
