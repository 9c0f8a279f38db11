"""The workflow: dvc.yaml is the generated one, both engines plan the DAG of workflow/dag.py, and
end to end on the demo data (tiny random BERT) in a temporary copy of the repository, Snakemake
and DVC each run everything, then nothing, then exactly one experiment's jobs after its
learning rate changes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow import dag  # noqa: E402

SNAKEMAKE = shutil.which("snakemake")
DVC = shutil.which("dvc")
needs_snakemake = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed (pip install -e .[workflow])")
needs_dvc = pytest.mark.skipif(DVC is None, reason="dvc is not installed (pip install -e .[workflow])")


def test_committed_dvc_yaml_is_the_generated_one(repo_root):
    assert (repo_root / "dvc.yaml").read_text() == dag.render_dvc("params.yaml"), \
        "dvc.yaml is out of date: run `python -m workflow.dag --write-dvc`"


def test_jobs_of_the_shipped_params(repo_root):
    jobs = {j.id: j for j in dag.jobs("params.yaml")}
    lp = dag.load_params(repo_root / "params.yaml")
    for name, exp in lp.experiments.items():
        ft = jobs[f"finetune@{name}"]
        assert ft.params == ["base", f"experiments.{name}"] and "stages/finetune.py" in ft.deps
        assert (f"results/pretrain/{exp.pretrain}/model" in ft.deps) == bool(exp.pretrain)
        assert jobs[f"evaluate@{name}"].metrics == [f"results/experiments/{name}/metrics.json"]
    for name, ens in lp.params.ensembles.items():
        assert all(f"results/experiments/{m}/predictions" in jobs[f"ensemble@{name}"].deps for m in ens.members)
    # every dependency is a source file or some earlier job's output
    produced: set[str] = set()
    for job in dag.jobs("params.yaml"):
        for d in job.deps:
            assert d in produced or (repo_root / d).exists(), f"{job.id}: nothing makes {d}"
        produced.update(job.outputs)


def test_report_deps_cover_what_the_report_reads(repo_root):
    report_inputs = pytest.importorskip("minbert.report").report_inputs
    deps = next(j for j in dag.jobs("params.yaml") if j.stage == "report").deps
    for f in report_inputs(repo_root / "params.yaml", repo_root / "results"):
        rel = Path(f).relative_to(repo_root).as_posix() if Path(f).is_absolute() else Path(f).as_posix()
        if rel != "params.yaml":      # tracked through the report's params keys
            assert any(rel == d or rel.startswith(d + "/") for d in deps), rel


def test_dvc_params_point_at_the_catalogue_file(repo_root, tmp_path):
    shutil.copytree(repo_root / "params", tmp_path / "params")
    text = (repo_root / "params.yaml").read_text().replace("catalogue: demo", "catalogue: full")
    (tmp_path / "params.yaml").write_text(text)
    stages = dag.dvc_yaml("params.yaml", repo=tmp_path)["stages"]
    assert stages["finetune-p000_sft"]["params"] == [{"params/full.yaml": ["base", "experiments.p000_sft"]}]
    assert stages["report"]["params"] == [{"params/full.yaml": ["base", "experiments", "ensembles", "studies"]},
                                          "report"]
    assert stages["retrain_heads-p000_sft"]["deps"][-1] == "results/experiments/p000_sft/finetune/model.pt"
    assert stages["pretrain-para_first"]["outs"][0] == "results/pretrain/para_first/model"


@needs_snakemake
def test_snakemake_plans_with_the_slurm_profile(repo_root):
    r = subprocess.run([SNAKEMAKE, "-n", "--profile", "profiles/slurm", "reports/final.html"],
                       cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    n_jobs = len(dag.jobs("params.yaml"))
    assert re.search(rf"total\s+{n_jobs}\b", out), out[-2000:]


# ---------------------------------------------------------------- end to end

def tiny_params(model: str) -> dict:
    """The demo data, a tiny random BERT, two experiments + an ensemble + a shared pretraining."""
    quick = {"epochs": 1, "batch_size": 8, "max_steps_per_epoch": 2, "downsample": {"mode": "fixed", "size": 32}}
    return {
        "catalogue": "demo",
        "data": {"dir": "data/demo", "nli_file": "data/demo/nli-sample.jsonl"},
        "base": {"model": model, "device": "cpu", "max_length": 32, "predict_batch_size": 64, "finetune": quick},
        "pretrainings": {"mlm_tiny": {"kind": "mlm", "epochs": 1, "batch_size": 8, "max_steps_per_epoch": 2}},
        "experiments": {"a": {}, "b": {"seed": 2, "pretrain": "mlm_tiny"}},
        "ensembles": {"ab": {"members": ["a", "b"], "classification": "mean_prob"}},
        "studies": [{"name": "s", "title": "Tiny study", "experiments": ["a", "b", "ab"]}],
        "report": {"title": "tiny", "worst_k": 3},
    }


def make_copy(repo_root: Path, dest: Path, tiny_model_dir: Path) -> Path:
    """The repository's tracked and unignored files, with tiny params and dvc.yaml regenerated."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        src = repo_root / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    shutil.copytree(tiny_model_dir, dest / "models" / "tiny")
    (dest / "params.yaml").write_text(yaml.safe_dump(tiny_params("models/tiny"), sort_keys=False))
    subprocess.run([sys.executable, "-m", "workflow.dag", "--write-dvc"], cwd=dest, check=True,
                   capture_output=True)
    return dest


def run(cmd: list[str], cwd: Path, timeout=1800) -> str:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{(r.stdout + r.stderr)[-4000:]}"
    return r.stdout + r.stderr


def set_lr(folder: Path, experiment: str, lr: float) -> None:
    p = yaml.safe_load((folder / "params.yaml").read_text())
    p["experiments"][experiment] = {**(p["experiments"][experiment] or {}), "finetune": {"lr": lr}}
    (folder / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def expected_after_lr_change(folder: Path, experiment: str) -> set[str]:
    """The experiment's fine-tuning and everything downstream of it, as commands."""
    jobs = dag.jobs("params.yaml", repo=folder)
    dirty = {f"finetune@{experiment}"}
    outputs = set()
    for job in jobs:
        if job.id in dirty or any(d in outputs for d in job.deps):
            dirty.add(job.id)
            outputs.update(job.outputs)
    return {j.cmd for j in jobs if j.id in dirty}


def commands_run(log: str) -> set[str]:
    return set(re.findall(r"^(?:Shell command: )?(python -m stages\.\S+(?: --\S+ \S+)*)\s*$", log, flags=re.M))


@pytest.mark.slow
@needs_snakemake
def test_snakemake_end_to_end(repo_root, tmp_path, tiny_model_dir):
    folder = make_copy(repo_root, tmp_path / "repo", tiny_model_dir)
    snake = [SNAKEMAKE, "--cores", "2", "--printshellcmds", "reports/final.html"]
    log = run(snake, folder)
    assert commands_run(log) == {j.cmd for j in dag.jobs("params.yaml", repo=folder)}
    assert (folder / "reports" / "final.html").is_file()
    assert (folder / "results" / "ensembles" / "ab" / "metrics.json").is_file()

    log = run(snake, folder)
    assert "Nothing to be done" in log and not commands_run(log)

    set_lr(folder, "a", 3e-4)
    log = run(snake, folder)
    assert commands_run(log) == expected_after_lr_change(folder, "a") == {
        "python -m stages.finetune --experiment a", "python -m stages.predict --experiment a",
        "python -m stages.evaluate --experiment a", "python -m stages.ensemble --name ab",
        "python -m stages.report"}


@pytest.mark.slow
@needs_dvc
def test_dvc_end_to_end(repo_root, tmp_path, tiny_model_dir):
    folder = make_copy(repo_root, tmp_path / "repo", tiny_model_dir)
    run(["git", "init", "-q"], folder)
    if not (folder / ".dvc").is_dir():
        run([DVC, "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "copy"], folder)

    stages_run = lambda log: set(re.findall(r"Running stage '([^']+)'", log))  # noqa: E731
    log = run([DVC, "repro"], folder)
    assert stages_run(log) == {dag._dvc_stage_name(j) for j in dag.jobs("params.yaml", repo=folder)}
    metrics = run([DVC, "metrics", "show"], folder)
    assert "results/experiments/a/metrics.json" in metrics and "dev.overall" in metrics

    log = run([DVC, "repro"], folder)
    assert not stages_run(log)

    set_lr(folder, "a", 3e-4)
    log = run([DVC, "repro"], folder)
    assert stages_run(log) == {"finetune-a", "predict-a", "evaluate-a", "ensemble-ab", "report"}
    assert "up to date" in run([DVC, "status"], folder)
