"""The DAG both engines run: dvc.yaml is the generated one, every job's dependencies come from the
library's job descriptions, Snakemake's tooling works as its users type it (default target, lint,
dag, summary, report), and the helpers other workflow tests use (a copy of the repository with tiny
params)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minbert.params import load_params  # noqa: E402
from workflow import dag, dvc  # noqa: E402

SNAKEMAKE = shutil.which("snakemake")
DVC = shutil.which("dvc")
needs_snakemake = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed (pip install -e .[workflow])")
needs_dvc = pytest.mark.skipif(DVC is None, reason="dvc is not installed (pip install -e .[workflow])")


# ---------------------------------------------------------------- helpers for end-to-end tests

def tiny_params(model: str) -> dict:
    """The demo data, a tiny random BERT: three experiments, an ensemble, a student distilled from
    it, an MLM pretraining and a paraphrase-first pretraining (which reads base.finetune)."""
    quick = {"epochs": 1, "batch_size": 8, "lr": 1.0e-4, "max_steps_per_epoch": 2,
             "downsample": {"mode": "fixed", "size": 32}}
    return {
        "catalogue": "demo",
        "data": {"dir": "data/demo", "nli_file": "data/demo/nli-sample.jsonl"},
        "base": {"model": model, "device": "cpu", "max_length": 32, "predict_batch_size": 64, "finetune": quick},
        "pretrainings": {"mlm_tiny": {"kind": "mlm", "epochs": 1, "batch_size": 8, "max_steps_per_epoch": 2},
                         "pf": {"kind": "para_first", "epochs": 1, "batch_size": 8, "max_steps_per_epoch": 2}},
        "experiments": {"a": {"description": "plain"},
                        "b": {"seed": 2, "pretrain": "mlm_tiny", "finetune": {"heads": {"para": "concat"}}},
                        "c": {"seed": 5, "pretrain": "pf"},
                        "d": {"finetune": {"distill": {"teacher": "ab", "weight": 0.5}}}},
        "ensembles": {"ab": {"members": ["a", "b"], "classification": "mean_prob"}},
        "studies": [{"name": "s", "title": "Tiny study", "experiments": ["a", "b", "c", "ab", "d"]}],
        "report": {"title": "tiny", "worst_k": 3},
    }


def make_copy(repo_root: Path, dest: Path, tiny_model_dir: Path, params: dict | None = None) -> Path:
    """The repository's tracked and unignored files, with tiny params and dvc.yaml regenerated."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        src = repo_root / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    shutil.copytree(tiny_model_dir, dest / "models" / "tiny")
    (dest / "params.yaml").write_text(yaml.safe_dump(params or tiny_params("models/tiny"), sort_keys=False))
    subprocess.run([sys.executable, "-m", "workflow.dag", "--write-dvc"], cwd=dest, check=True,
                   capture_output=True)
    return dest


def run(cmd: list[str], cwd: Path, timeout=1800, ok=True) -> str:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if ok:
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{(r.stdout + r.stderr)[-4000:]}"
    return r.stdout + r.stderr


# a stage command, behind the wrapper that gives a job asking for GPUs its own (workflow/gpu_slot.py)
COMMAND = re.compile(r"^(?:Shell command: )?(?:python -m workflow\.gpu_slot --count \d+ --per-gpu \d+ -- )?"
                     r"(python -m stages\.\S+(?: --\S+ \S+)*)(?: > \S+ 2>&1)?\s*$", re.M)


def commands_run(log: str) -> set[str]:
    """The stage commands a Snakemake log shows (with --printshellcmds)."""
    return set(COMMAND.findall(log))


def job_ids(folder: Path, commands: set[str]) -> set[str]:
    """Commands -> job ids (finetune@a, report, ...)."""
    by_cmd = {j.cmd: j.id for j in dag.jobs("params.yaml", repo=folder)}
    return {by_cmd[c] for c in commands}


def git_dvc_project(folder: Path) -> Path:
    """The copy as a DVC user keeps it: a git repository, DVC initialised, everything committed."""
    run(["git", "init", "-q"], folder)
    if not (folder / ".dvc").is_dir():
        run([DVC, "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "copy"], folder)
    return folder


def stages_run(log: str) -> set[str]:
    """The stages a `dvc repro` log shows running (`resolve` included)."""
    return set(re.findall(r"Running stage '([^']+)'", log))


def dvc_repro_all(folder: Path) -> Path:
    """A first `dvc repro`, which runs every job's stage once."""
    ran = stages_run(run([DVC, "repro"], folder)) - {"resolve"}
    assert ran == {dvc.dvc_stage_name(j) for j in dag.jobs("params.yaml", repo=folder)}
    return folder


def dvc_changed(folder: Path) -> set[str]:
    """The stages `dvc status` calls changed once the description files are current."""
    run([DVC, "repro", "resolve"], folder)
    out = run([DVC, "status", "--json"], folder)
    return set(json.loads(out[out.index("{"):])) - {"resolve"}


# ---------------------------------------------------------------- the DAG

def test_committed_dvc_yaml_is_the_generated_one(repo_root):
    assert (repo_root / "dvc.yaml").read_text() == dvc.render_dvc("params.yaml"), \
        "dvc.yaml is out of date: run `python -m workflow.dag --write-dvc`"


def test_jobs_of_the_shipped_params(repo_root):
    jobs = {j.id: j for j in dag.jobs("params.yaml")}
    lp = load_params(repo_root / "params.yaml")
    for name, exp in lp.experiments.items():
        ft = jobs[f"finetune@{name}"]
        assert ("results/pretrain/" + str(exp.pretrain) + "/model" in ft.deps) == bool(exp.pretrain)
        assert "results/data" in ft.deps and jobs[f"evaluate@{name}"].metrics == [f"results/experiments/{name}/metrics.json"]
        assert "description" not in json.dumps(ft.settings) and "predict_batch_size" not in json.dumps(ft.settings)
    for name, ens in lp.params.ensembles.items():
        assert all(f"results/experiments/{m}/predictions/sst-dev.csv" in jobs[f"ensemble@{name}"].deps
                   for m in ens.members)
        assert f"results/ensembles/{name}/predictions/sst-test.csv" in jobs[f"ensemble@{name}"].outs
    # every dependency is a source file or some earlier job's output; every output has one maker
    produced: set[str] = set()
    for job in dag.jobs("params.yaml"):
        for d in job.deps:
            assert d in produced or (repo_root / d).exists(), f"{job.id}: nothing makes {d}"
        assert not produced & set(job.outputs), job.id
        produced.update(job.outputs)


def test_code_a_job_depends_on_is_its_import_closure(repo_root):
    jobs = {j.id: j for j in dag.jobs("params.yaml")}
    with dag.in_repo(repo_root):
        finetune = jobs["finetune@cross_encoder"].description()["code"]
        report = jobs["report"].description()["code"]
    assert "stages/finetune.py" in finetune and "minbert/train/loop.py" in finetune and "minbert/train/losses.py" in finetune
    assert "minbert/train/regularisers.py" in finetune        # imported inside a function: still code it runs
    assert not any(p.startswith("minbert/report/") for p in finetune)
    assert "minbert/data/demo.py" not in finetune and "minbert/data/demo.py" not in report
    assert "minbert/report/plots.py" in report and "minbert/report/templates/final.html.j2" in report
    assert "minbert/train/loop.py" not in report


def test_dvc_stages_track_the_description_files_and_the_whole_params_files(repo_root, tmp_path):
    shutil.copytree(repo_root / "params", tmp_path / "params")
    shutil.copytree(repo_root / "data", tmp_path / "data")
    text = (repo_root / "params.yaml").read_text().replace("\ncatalogue: demo\n",
                                                           "\ncatalogue: papers\nscale: laptop\n")
    (tmp_path / "params.yaml").write_text(text)
    stages = dvc.dvc_yaml("params.yaml", repo=tmp_path)["stages"]
    assert stages["resolve"]["params"] == [{"params.yaml": None}, {"params/papers.yaml": None}]
    assert stages["resolve"]["outs"] == [{"results/jobs": {"persist": True, "cache": False}}]
    ft = stages["finetune-p000_sft"]
    assert ft["deps"][0] == "results/jobs/finetune/p000_sft.json" and "params" not in ft
    # the files each job reads, as the Snakefile lists them: the prepared splits of its tasks, one by one
    retrain = stages["retrain_heads-p000_sft"]["deps"]
    assert retrain[0] == "results/jobs/retrain_heads/p000_sft.json" and "results/data" not in retrain
    assert {"results/data/sst-train.tsv", "results/data/sts-dev.tsv",
            "results/experiments/p000_sft/finetune/model.pt"} <= set(retrain)
    assert not [d for d in retrain if d.startswith("results/data/") and "-test" in d]
    # a training stage's output is its folder: a tracker turned on changes what it holds, not the stage
    assert stages["retrain_heads-p000_sft"]["outs"] == ["results/experiments/p000_sft/retrain_heads",
                                                        "results/runs/retrain_heads/p000_sft.json"]
    assert stages["pretrain-para_first"]["outs"][0] == "results/pretrain/para_first/model"
    # the demo's tables are transcribed in params/papers.yaml: an edit there re-runs its resolve stage
    demo = dvc.dvc_yaml("params.yaml", repo=repo_root)["stages"]
    assert demo["resolve"]["params"] == [{"params.yaml": None}, {"params/papers.yaml": None}]


def test_the_head_of_the_longest_chain_has_the_highest_priority(repo_root):
    """Snakemake's priority of a job is the number of network-running jobs on its longest path to the
    end, so among the jobs ready to run a pretraining (then its fine-tuning, predictions) starts first;
    tests/test_shipped_demo.py sees Snakemake run it first."""
    jobs = dag.jobs("params.yaml")
    heights = dag.SnakemakeDag(jobs).heights
    lp = load_params(repo_root / "params.yaml")
    pretrained = {n: e.pretrain for n, e in lp.experiments.items() if e.pretrain}
    assert pretrained
    for name, exp in lp.experiments.items():
        after = heights[f"retrain_heads@{name}"] if exp.retrain_heads.enabled else heights[f"predict@{name}"]
        assert heights[f"finetune@{name}"] == after + 1 and heights[f"predict@{name}"] >= 1, name
        if name in pretrained:
            assert heights[f"pretrain@{exp.pretrain}"] >= heights[f"finetune@{name}"] + 1
    assert heights["report"] == 0 and all(heights[j.id] == 0 for j in jobs if j.stage == "evaluate")
    assert heights["prepare"] == max(heights.values()) > max(heights[f"finetune@{n}"] for n in lp.experiments
                                                              if n not in pretrained)


def test_resources_and_threads_are_declared_per_stage():
    for stage, res in dag.STAGE_RESOURCES.items():
        assert {"threads", "mem_mb", "runtime"} <= set(res), stage
    assert dag.stage_resources("finetune", 1)["gpu"] == 1 and "gpu" not in dag.stage_resources("finetune", 0)
    assert "gpu" not in dag.stage_resources("report", 1)


# ---------------------------------------------------------------- Snakemake as its users type it

def snake(repo: Path, *args, ok=True) -> str:
    return run([SNAKEMAKE, *args], repo, timeout=600, ok=ok)


@needs_snakemake
def test_default_target_is_the_final_report(repo_root):
    out = snake(repo_root, "-n", "--forceall")
    assert "rule all:" in out and "input: reports/final.html" in out
    n_jobs = len(dag.jobs("params.yaml"))      # the exports params.yaml lists too, as `dvc repro` builds them
    # each job once (Snakemake's own job table is quieted with its progress: profiles/default)
    assert len(set(re.findall(r"^Job (\d+): ", out, re.M))) == n_jobs, out[-2000:]
    assert len(re.findall(r"^Job \d+: export ", out, re.M)) == 1, out[-2000:]


@needs_snakemake
def test_lint_is_clean(repo_root):
    out = snake(repo_root, "--lint", ok=False)
    assert "Lints for" not in out, out[-3000:]


@needs_snakemake
@pytest.mark.parametrize("args,expect", [
    (("--dag",), "digraph"), (("--rulegraph",), "digraph"), (("--summary",), "output_file"),
    (("-n", "--profile", "profiles/default"), "This was a dry-run"),
    (("-n", "--profile", "profiles/slurm"), "This was a dry-run"),
])
def test_tooling_works_without_cores(repo_root, args, expect):
    out = snake(repo_root, *args)
    assert expect in out, out[-2000:]
