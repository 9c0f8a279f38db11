"""The docs say what the code does: the demo's counts in README.md and docs/workflow.md come out
of the shipped params as the planner reads them, and every command of README.md and docs/*.md is
run by a test (tests/test_shipped_demo.py runs them on the demo, or names the test that does) or
says what it needs (GPU, cluster, network, the CS224N data, a browser)."""
from __future__ import annotations

import re

import pytest
from test_shipped_demo import CHANGED, COVERED, DOCS, doc_commands, marked, without_comment

from minbert.data.demo import NLI_PREMISES, SIZES

WORDS = {"three": 3, "five": 5, "seven": 7}


@pytest.fixture(scope="module")
def demo(repo_root):
    from workflow import dag

    jobs = dag.jobs("params.yaml", repo=repo_root)
    lp = dag.load("params.yaml", repo_root)
    return jobs, lp


def count(jobs, stage=None, but=()):
    return sum(1 for j in jobs if (stage is None or j.stage == stage) and j.stage not in but)


def test_the_readme_counts_the_demo_as_the_planner_does(repo_root, demo):
    jobs, lp = demo
    text = " ".join((repo_root / "README.md").read_text().split())
    fine_tunes = re.search(r"a masked-LM pretraining and (\w+) short fine-tunings", text).group(1)
    assert WORDS[fine_tunes] == count(jobs, "finetune") == 7
    seeds = re.search(r"round-robin with cosine heads in (\w+) seeds", text).group(1)
    assert WORDS[seeds] == len(lp.groups["multitask_rr"])
    assert int(re.search(r"the reports \((\d+) jobs;", text).group(1)) == count(jobs, but=("export",))
    rows = re.search(r"\((\d+)/(\d+)/(\d+) template-generated rows per task and (\d+) NLI pairs", text)
    assert tuple(map(int, rows.groups())) == (SIZES["train"], SIZES["dev"], SIZES["test"], 3 * NLI_PREMISES)


def test_the_workflow_page_describes_the_demo_as_it_runs(repo_root, demo):
    jobs, lp = demo
    text = (repo_root / "docs" / "workflow.md").read_text()
    flat = " ".join(text.split())
    m = re.search(r"It runs (\d+) experiments \((\d+) fine-tunes: `multitask_rr` in (\w+) seeds\), (\d+) MLM "
                  r"pretraining and (\d+) ensemble: (\d+) jobs, the report and the export of `(\w+)` included", flat)
    assert m, "the demo paragraph of docs/workflow.md"
    experiments, fine_tunes, seeds, pretrainings, ensembles, all_jobs, exported = m.groups()
    default_jobs = count(jobs, but=("export",))
    assert lp.params.export.experiments == [exported]
    assert int(experiments) == len(lp.params.experiments)
    assert int(fine_tunes) == count(jobs, "finetune") and WORDS[seeds] == len(lp.groups["multitask_rr"])
    assert int(pretrainings) == count(jobs, "pretrain") and int(ensembles) == count(jobs, "ensemble")
    assert int(default_jobs) == count(jobs, but=("export",)) and int(all_jobs) == len(jobs)
    table = text[text.index("| experiment | what it is |"):text.index("and three studies")]
    assert set(re.findall(r"^\| `([^`]+)` \|", table, re.M)) == set(lp.params.experiments) | set(lp.params.ensembles)
    assert f"On the demo ({len(jobs)} jobs)" in flat
    assert "and three studies" in flat and len(lp.params.studies) == 3
    # the jobs whose code a one-file edit changes, as the table says
    from minbert.pipeline.code import code_closure

    closures = {j.id: set(code_closure(*(j.code_roots or [j.module]))) for j in jobs}
    for path, n in [("minbert/data/sampler.py", 8), ("minbert/train/loop.py", 7), ("minbert/train/schedules.py", 7),
                    ("minbert/data/prepare.py", 1), ("minbert/scoring/evaluate.py", 9)]:
        assert sum(path in c for c in closures.values()) == n, path
    for row in ("| the batch sampler (`minbert/data/sampler.py`) | 8:",
                "| the schedules or the training loop (`minbert/train/schedules.py`, `loop.py`) | 7:",
                "| preparation (`minbert/data/prepare.py`) | 1:", "| scoring (`minbert/scoring/evaluate.py`) | 9:"):
        assert row in text, row


def test_a_measured_figure_of_the_demo_is_said_in_one_place(repo_root):
    """The demo's wall time is a measurement: the README gives it, the workflow page points there."""
    readme = (repo_root / "README.md").read_text()
    workflow = (repo_root / "docs" / "workflow.md").read_text()
    assert re.search(r"\d+ min \d+ s from a fresh clone", readme)
    assert not re.search(r"\d+ min \d+ s wall", workflow)


def test_every_documented_command_is_run_by_a_test_or_says_what_it_needs(repo_root):
    commands = [(page, c) for page in DOCS for c in doc_commands(repo_root / page)]
    assert len(commands) > 60
    for page, command in commands:
        text = without_comment(command)
        assert marked(command) or text in COVERED or text in CHANGED or not text.startswith("[") and text, \
            (page, command)
    # what the issue met: a target no job makes, a command needing an uninstalled tool, unnamed
    texts = {without_comment(c) for _, c in commands}
    assert "snakemake --cores all results/experiments/multitask_rr/metrics.json" not in texts
    dag_line = next(c for _, c in commands if c.startswith("snakemake --dag | dot"))
    assert "Graphviz" in dag_line and "apt-get install graphviz" in dag_line
    for page in DOCS:
        for line in (repo_root / page).read_text().splitlines():
            assert not re.search(r"(?<!-m )(?<![\w/.-])pytest (-|tests/)", line), (page, line)   # python3 -m pytest


def _option(words: list[str], name: str) -> str | None:
    return next((words[k + 1] for k, w in enumerate(words[:-1]) if w == name), None)


def test_an_estimate_prices_the_run_the_command_under_it_starts(repo_root):
    """README.md estimated with the default threads while the command under it ran `--max-threads 1`
    (1 h 38 min against 33 min): in every block of the docs, a `minbert estimate` and the `snakemake`
    run after it name the same params file, threads a job and cores."""
    import shlex

    pairs = 0
    for page in DOCS:
        blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", (repo_root / page).read_text(), re.DOTALL)
        for block in blocks:
            estimate = None
            for line in block.splitlines():
                try:
                    words = shlex.split(without_comment(line))
                except ValueError:           # a line continued on the next: no estimate or run starts there
                    continue
                if words[:2] == ["minbert", "estimate"]:
                    estimate = words
                elif words[:1] == ["snakemake"] and estimate is not None and "-n" not in words:
                    config = dict(w.split("=", 1) for w in words[words.index("--config") + 1:] if "=" in w) \
                        if "--config" in words else {}
                    assert _option(estimate, "--params") == config.get("params"), (page, line)
                    assert _option(estimate, "--threads") == _option(words, "--max-threads"), (page, line)
                    assert _option(estimate, "--cores") in (None if _option(words, "--cores") == "all" else
                                                            _option(words, "--cores"),), (page, line)
                    pairs += 1
    assert pairs >= 2
