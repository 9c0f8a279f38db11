"""Bad input to Snakemake is one line naming the value and what to do, never a traceback from the
workflow's own code (issue 33, case 14), and never a silent run on stale files: a target naming
an unknown experiment or an export the params do not list, a `--config` number that is not one,
a raw data folder that is not there (while results/data from another folder is)."""
from __future__ import annotations

import re
import shutil

import pytest
import yaml
from test_workflow import SNAKEMAKE, make_copy, needs_snakemake, run, tiny_params

pytestmark = needs_snakemake


@pytest.fixture(scope="module")
def repo(repo_root, tmp_path_factory, tiny_model_dir):
    return make_copy(repo_root, tmp_path_factory.mktemp("input") / "repo", tiny_model_dir,
                     {**tiny_params("models/tiny"), "export": {"experiments": ["c"]}})


def dry_run(repo, *args: str) -> str:
    out = run([SNAKEMAKE, "-n", "--cores", "1", *args], repo, timeout=300, ok=False)
    assert "Traceback" not in out or "workflow/dag.py" not in out, out[-3000:]
    assert "KeyError" not in out, out[-3000:]
    return out


@pytest.mark.parametrize("target,job_file", [
    ("results/experiments/nosuch/metrics.json", "results/jobs/evaluate/nosuch.json"),
    ("results/exports/a", "results/jobs/export/a.json"),
    ("results/experiments/nosuch/finetune/model.pt", "results/jobs/finetune/nosuch.json")])
def test_a_target_the_params_do_not_make_is_snakemakes_own_one_line(repo, target, job_file):
    """A rule's {name} is any name (a list of every name in its constraint made Snakemake's work
    quadratic in the jobs); a name the params do not have has no job file, the first input of
    every job: Snakemake's own "missing input" error, naming it. A run (not a dry run, which writes
    nothing) removes a job file left from earlier params when it plans, and runs nothing."""
    (repo / job_file).parent.mkdir(parents=True, exist_ok=True)
    (repo / job_file).write_text("{}")       # a job file left from earlier params: removed when planning
    out = run([SNAKEMAKE, "--cores", "1", target], repo, timeout=300, ok=False)
    assert "Traceback" not in out or "workflow/dag.py" not in out, out[-3000:]
    assert re.search(r"MissingInputException in rule \w+ .*\n.*\n\s+output: " + re.escape(target) +
                     r".*\n.*\n\s+affected files:\n\s+" + re.escape(job_file), out), out[-2000:]
    assert not (repo / job_file).exists()


def test_the_exported_experiment_is_a_target(repo):
    out = dry_run(repo, "results/exports/c")
    assert "export" in out and "MissingRule" not in out, out[-2000:]


@pytest.mark.parametrize("setting", ["gpu=abc", "gpu=-1", "jobs_per_gpu=two"])
def test_a_config_number_that_is_not_one_is_one_line(repo, setting):
    out = dry_run(repo, "--config", setting)
    key = setting.split("=")[0]
    assert re.search(rf"WorkflowError.*\n.*--config {key}=.*whole number", out), out[-2000:]


def test_missing_raw_data_is_one_line_not_a_run_on_stale_prepared_data(repo, tmp_path):
    """Snakemake skips a job whose inputs are missing when its outputs exist: prepare's outputs from
    another data folder would then feed every fine-tune. The planner refuses instead."""
    (repo / "results" / "data").mkdir(parents=True, exist_ok=True)
    (repo / "results" / "data" / "summary.json").write_text("{}\n")      # an earlier prepare's output
    other = yaml.safe_load((repo / "params.yaml").read_text())
    other["data"] = {"dir": "../elsewhere/cs224n", "nli_file": None}
    (repo / "other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    try:
        out = dry_run(repo, "--config", "params=other.yaml")
        assert re.search(r"\.\./elsewhere/cs224n/\S+: not found, and prepare reads it \(\d+ such path\(s\); set in "
                         r"other\.yaml: data\.dir", out), out[-2000:]
        assert "Job stats" not in out
    finally:
        shutil.rmtree(repo / "results" / "data")


def test_an_alias_bomb_is_one_line_before_the_plan(repo):
    """A 1 KB params file whose YAML aliases nest nine deep (a billion values): refused in one line
    when the Snakefile reads it (it kept Snakemake busy for hours)."""
    from test_bounds import BOMB

    (repo / "bomb.yaml").write_text(BOMB)
    out = dry_run(repo, "--config", "params=bomb.yaml")
    assert re.search(r"WorkflowError.*\n.*bomb\.yaml: its YAML aliases \(\*name\) expand to more than 1,000,000 "
                     r"values", out), out[-2000:]
