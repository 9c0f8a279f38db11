"""The shipped params.yaml under both engines, as a user changes it from the command line, in a
copy of the project (a fresh clone's files): the demo catalogue as it ships, made tiny by DVC's own
`-S` rewrite (the tiny random BERT, two updates an epoch; its anchors, aliases and comments
rewritten as `dvc exp run -S` rewrites them), built once (by Snakemake, the stages in its own
process, and recorded in dvc.lock). Then one experiment's key
set from the command line re-runs exactly that experiment's chain, under DVC (`dvc exp run -S`, and
a queued two-value sweep) and under Snakemake (`--config set=...`)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_workflow import DVC, SNAKEMAKE, dag, run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(DVC is None or SNAKEMAKE is None, reason="needs dvc and snakemake")]

# the shipped demo, tiny: what a laptop runs in minutes, in seconds (set as `dvc exp run -S` sets it)
TINY = ["base.model=models/tiny", "base.max_length=32", "++base.threads=1", "base.finetune.epochs=1",
        "base.finetune.max_steps_per_epoch=2", "experiments.pcgrad.finetune.max_steps_per_epoch=1",
        "pretrainings.mlm_demo.max_steps_per_epoch=2"]
KEY = "experiments.cross_encoder.finetune.heads.para"       # a key the shipped file sets
CHAIN = {"finetune@cross_encoder", "predict@cross_encoder", "evaluate@cross_encoder", "report"}


def copy_project(repo_root: Path, dest: Path, tiny_model_dir: Path) -> Path:
    """The repository's tracked and unignored files (what a clone has) and the tiny model."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if (repo_root / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / f, dest / f)
    shutil.copytree(tiny_model_dir, dest / "models" / "tiny")
    return dest


@pytest.fixture(scope="module")
def demo_repo(repo_root, tmp_path_factory, tiny_model_dir):
    from dvc.utils.hydra import apply_overrides

    folder = copy_project(repo_root, tmp_path_factory.mktemp("demo") / "repo", tiny_model_dir)
    shipped = (folder / "params.yaml").read_text()
    apply_overrides(folder / "params.yaml", TINY)                 # DVC's own rewrite of the shipped file
    text = (folder / "params.yaml").read_text()
    assert "&demo_differs" not in text or "*demo_differs" in text     # the file as DVC leaves it, readable
    assert text.count("\n") > shipped.count("\n") // 2
    run([sys.executable, "-m", "workflow.dag", "--write-dvc"], folder)   # the jobs now read the tiny model's folder
    run(["git", "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "the shipped demo, tiny"], folder)
    # built once, the stages inside Snakemake's process (no Python start-up per job), recorded in dvc.lock
    run([SNAKEMAKE, "--cores", "1", "--scheduler", "greedy", "--force-use-threads", "--config", "in_process=true",
         "dvc_commit=true", "--", "all", "results/exports/mlm_multitask"], folder, timeout=1800)
    assert "up to date" in run([DVC, "status"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "results"], folder)
    return folder


def stages_run(log: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", log))


def snakemake_plan(folder: Path, *config: str) -> set[str]:
    """The jobs `snakemake -n` plans, by their messages (the baseline was built with the stages in
    Snakemake's process, so the plan is asked in that mode too: the same jobs, job files and triggers)."""
    log = run([SNAKEMAKE, "-n", "--cores", "2", "--config", "in_process=true", *config], folder)
    by_message = {dag.STAGE_MESSAGES[j.stage].format(wildcards=SimpleNamespace(name=j.name)): j.id
                  for j in dag.jobs("params.yaml", repo=folder)}
    return {by_message[m] for m in re.findall(r"^Job \d+: (.+)$", log, re.M)}


def test_a_snakemake_override_reruns_exactly_that_experiments_chain(demo_repo):
    """Over the built project, `--config set=KEY=VALUE` plans exactly the chain of the experiment
    whose key it sets (so nothing else is stale either); a mistyped key is one line."""
    assert snakemake_plan(demo_repo, f"set={KEY}=concat") == CHAIN
    r = subprocess.run([SNAKEMAKE, "-n", "--cores", "2", "--config", "in_process=true", f"set={KEY}s=concat"],
                       cwd=demo_repo, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert f"--config set: '{KEY}s=concat': params.yaml does not set '{KEY}s' (did you mean 'para'?)" \
        in r.stdout + r.stderr


def test_dvc_exp_run_s_queues_a_two_value_sweep_on_the_shipped_params_each_rerunning_exactly_that_chain(demo_repo):
    """`dvc exp run -S` with two values and `--queue`, then `dvc exp run --run-all`: two experiments,
    each of which ran exactly the chain of the experiment whose key it set (its log, `dvc queue
    logs`), each with its params and scores in `dvc exp show`; the workspace stays the baseline."""
    run([DVC, "exp", "run", "-S", f"{KEY}=concat,concat_mult", "--queue"], demo_repo)
    run([DVC, "exp", "run", "--run-all", "--jobs", "1"], demo_repo)
    out = run([DVC, "exp", "show", "--json"], demo_repo)
    shown = json.loads(out[out.index("["):])
    exps = {e["name"]: e["revs"][0]["data"] for rev in shown for e in (rev.get("experiments") or [])}
    heads = {}
    for name, data in exps.items():
        params = data["params"]["params.yaml"]["data"]
        heads[params["experiments"]["cross_encoder"]["finetune"]["heads"]["para"]] = (name, data)
    assert set(heads) == {"concat", "concat_mult"}, list(heads)
    for value, (name, data) in heads.items():
        assert stages_run(run([DVC, "queue", "logs", name], demo_repo)) - {"resolve"} == \
            {j.replace("@", "-") for j in CHAIN}, value
        summary = data["metrics"]["results/metrics.json"]["data"]
        assert summary["cross_encoder"]["dev"] > 0 and set(summary) >= {"frozen_baseline", "cross_encoder", "pcgrad"}
    assert "para: cross" in (demo_repo / "params.yaml").read_text()
