"""Exact re-runs under DVC, end to end in a copy of the repository (demo data, tiny random BERT; the
edits and their expected re-runs are tests/test_reruns.py's): after a first `dvc repro`, each kind
of edit re-runs exactly the stages whose description changed (`dvc status` names them), undoing it
re-runs nothing; Snakemake over DVC's outputs agrees; experiments (`dvc exp run -S`), revisions
(`dvc metrics diff`, `dvc plots diff`), a deleted output and a forced stage behave as a DVC user
expects. Apart from tests/test_reruns.py so that the two engines' runs go to two workers."""
from __future__ import annotations

import json
import os
import re
import time

import pytest
from test_reruns import (
    DVC_EDITS,
    EDITS,
    FITTING,
    NO_OP,
    PARAMS,
    SAME_OUTPUTS,
    TARGETS,
    _started,
    accept_code,
    apply,
    chain,
    edit_code,
    edit_params,
    set_key,
    snakemake_plan,
)
from test_workflow import (
    DVC,
    SNAKEMAKE,
    dvc_changed,
    dvc_repro_all,
    git_dvc_project,
    make_copy,
    needs_dvc,
    run,
    stages_run,
)


@pytest.fixture(scope="module")
def dvc_repo(repo_root, tmp_path_factory, tiny_model_dir):
    if DVC is None:
        pytest.skip("dvc is not installed")
    return dvc_repro_all(git_dvc_project(make_copy(repo_root, tmp_path_factory.mktemp("dvc") / "repo",
                                                   tiny_model_dir, PARAMS)))


def dvc_names(ids: set[str]) -> set[str]:
    return {i.replace("@", "-") for i in ids}


@pytest.mark.slow
@needs_dvc
def test_snakemake_after_dvc_has_nothing_to_do_then_sees_a_change(dvc_repo):
    """Both engines decide from the same description files: after `dvc repro`, Snakemake sees
    nothing to do, and a later params edit re-runs exactly its jobs under Snakemake too. (It runs
    first on the DVC copy: outputs DVC later restores from its cache get new dates, which Snakemake,
    having no record of DVC's runs, reads as new.)"""
    if SNAKEMAKE is None:
        pytest.skip("snakemake is not installed")
    # a run, not a dry run: two experiments' identical predictions share DVC's one copy and its date,
    # which a run dates anew (workflow/jobfiles.py: date_outputs) before it plans; it runs nothing
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], dvc_repo)
    assert not [line for line in log.splitlines() if "python -m stages." in line], log[-3000:]
    assert snakemake_plan(dvc_repo) == set()
    undo = apply(dvc_repo, EDITS["one experiment's lr"])
    try:
        assert snakemake_plan(dvc_repo) == chain("a")
    finally:
        undo()
    assert snakemake_plan(dvc_repo) == set()


@pytest.mark.slow
@needs_dvc
@pytest.mark.parametrize("edit", DVC_EDITS)
def test_dvc_reruns_exactly_what_an_edit_changes(dvc_repo, edit):
    expected, direct = dvc_names(EDITS[edit][2]), dvc_names(EDITS[edit][3])
    undo = apply(dvc_repo, EDITS[edit])
    try:
        assert dvc_changed(dvc_repo) == direct          # the jobs the edit concerns directly
        ran = stages_run(run([DVC, "repro"], dvc_repo)) - {"resolve"}
        if "predict_batch_size" in edit:       # downstream of equal predictions needs no re-run
            assert expected - {"report"} >= ran - {"report"} >= {s for s in expected if s.startswith("predict")}
        else:
            assert ran == expected
    finally:
        undo()
    run([DVC, "repro"], dvc_repo)              # back to the committed settings
    assert not stages_run(run([DVC, "repro"], dvc_repo)) - {"resolve"}
    assert "up to date" in run([DVC, "status"], dvc_repo)


@pytest.mark.slow
@needs_dvc
def test_accept_code_leaves_dvc_nothing_to_do(dvc_repo):
    """After a no-op edit of a loss, `dvc status` names every fine-tune; `minbert accept-code`
    records the new job files in dvc.lock and DVC, and Snakemake over DVC's outputs, have nothing
    to do. Undone, accepting the code that ran keeps dvc.lock in step again; a job whose settings
    changed is refused."""
    undo = edit_code(dvc_repo, *NO_OP)
    try:
        assert dvc_changed(dvc_repo) == dvc_names(FITTING)
        assert "recorded in dvc.lock" in accept_code(dvc_repo).stdout
        assert dvc_changed(dvc_repo) == set()
        if SNAKEMAKE is not None:
            assert snakemake_plan(dvc_repo) == set()
        undo_params = apply(dvc_repo, EDITS["one experiment's lr"])
        try:
            r = accept_code(dvc_repo, "finetune@a", ok=False)
            assert "finetune@a its settings or inputs changed" in r.stderr
        finally:
            undo_params()
    finally:
        undo()
    assert dvc_names(FITTING) == dvc_changed(dvc_repo)      # dvc.lock holds the code accepted
    accept_code(dvc_repo)
    assert dvc_changed(dvc_repo) == set()


@pytest.mark.slow
@needs_dvc
def test_dvc_stops_where_the_outputs_come_out_the_same(dvc_repo):
    undo = apply(dvc_repo, SAME_OUTPUTS)
    try:
        assert dvc_changed(dvc_repo) == {"prepare"}
        assert stages_run(run([DVC, "repro"], dvc_repo)) - {"resolve"} == {"prepare", "report"}
    finally:
        undo()
    run([DVC, "repro"], dvc_repo)
    assert "up to date" in run([DVC, "status"], dvc_repo)



@pytest.mark.slow
@needs_dvc
def test_dvc_experiments_and_revisions_compare(dvc_repo):
    """`dvc exp run -S` as documented (a key the params file has, and `++` for one it has not yet),
    `dvc exp show` with each experiment's params and metrics, and `dvc metrics diff` / `dvc plots
    diff` between two commits: metrics and curves are cached outputs DVC reads for any revision."""
    run(["git", "add", "-A"], dvc_repo)
    run(["git", "commit", "-q", "-m", "first results"], dvc_repo)
    try:
        # c: the experiment nothing else reads, so each DVC experiment re-runs only its chain
        run([DVC, "exp", "run", "-S", "experiments.c.seed=6"], dvc_repo)
        run([DVC, "exp", "run", "-S", "++experiments.c.finetune.lr=2e-4"], dvc_repo)
        out = run([DVC, "exp", "show", "--json"], dvc_repo)
        shown = json.loads(out[out.index("["):])
        exps = [e for rev in shown for e in (rev.get("experiments") or [])]
        assert len(exps) == 2
        for exp in exps:
            data = exp["revs"][0]["data"]
            # one metrics file: the report's summary of every experiment's headline scores
            assert set(data["metrics"]) == {"results/metrics.json"}
            summary = data["metrics"]["results/metrics.json"]["data"]
            # (an experiment whose score is undefined is left out: the tiny model's similarity scores
            # can all clip to 0, a constant whose correlation is undefined)
            assert "c" in summary and set(summary) <= {"a", "b", "c", "d", "ab"} and summary["c"]["dev"] > 0
            assert "params.yaml" in data["params"]
        # the two experiments side by side: the params they set and the scores that moved, at a glance
        table = run([DVC, "exp", "show", "--only-changed", "--csv", "--hide-workspace"], dvc_repo)
        header = table.strip().splitlines()[0].split(",")
        fixed = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
        changed = [c for c in header if c not in fixed]
        # DVC adds a hash column per dependency that moved: here only experiment c's own chain, and
        # the folders of run records the report reads; about twenty columns in all
        deps = [c for c in changed if c.startswith(("results/", "reports/", "data/"))]
        assert all(re.search(r"/c(/|\.json$)", c) or c == "results/jobs/report.json"
                   or re.fullmatch(r"results/runs(/[a-z_]+)?", c) for c in deps), " | ".join(header)
        assert len(header) <= 25, f"{len(header)} columns: " + " | ".join(header)
        # the rest: the two keys the experiments set and, where they moved, c's headline scores
        assert set(changed) - set(deps) - {"c.dev", "c.test"} == {"experiments.c.seed", "experiments.c.finetune.lr"}, \
            " | ".join(header)
        shown_c = [exp["revs"][0]["data"]["params"]["params.yaml"]["data"]["experiments"]["c"] for exp in exps]
        assert 6 in {c.get("seed") for c in shown_c}
        assert 2e-4 in {c.get("finetune", {}).get("lr") for c in shown_c}

        # two commits: the metrics and the curves differ, and DVC says how
        run(["git", "reset", "-q", "--hard"], dvc_repo)
        run([DVC, "checkout", "--force"], dvc_repo)
        # enough training that the tiny model's dev predictions move off their constant start
        edit_params(dvc_repo, lambda p: set_key(p, ("experiments", "c", "finetune"),
                                                {"lr": 3e-3, "max_steps_per_epoch": 12, "epochs": 2}))
        run([DVC, "repro"], dvc_repo)
        run(["git", "add", "-A"], dvc_repo)
        run(["git", "commit", "-q", "-m", "lr of c"], dvc_repo)
        diff = run([DVC, "metrics", "diff", "HEAD~1", "HEAD", "--json"], dvc_repo)
        changed = json.loads(diff[diff.index("{"):])
        assert set(changed) == {"results/metrics.json"}
        moved = changed["results/metrics.json"]
        assert "c.dev" in moved and not [k for k in moved if k.startswith("b.")]
        plots = run([DVC, "plots", "diff", "HEAD~1", "HEAD", "--json"], dvc_repo)
        # c's curves, a view of its history.csv (the training stage's output is its folder)
        curves = json.loads(plots[plots.index("{"):])["data"]["c-dev-curves"]
        assert curves and {"HEAD~1", "HEAD"} <= {r for c in curves for r in c.get("revisions", [])}, curves
    finally:
        run(["git", "reset", "-q", "--hard", "HEAD~1"], dvc_repo, ok=False)
        run([DVC, "checkout", "--force"], dvc_repo, ok=False)


@pytest.mark.slow
@needs_dvc
def test_dvc_restores_a_deleted_predictions_file(dvc_repo):
    """A predictions file is an output of its own under DVC too: deleted, its stage and readers are
    changed; `dvc repro` brings the file back (from the cache, the predict stage being unchanged)."""
    path = dvc_repo / "results/experiments/c/predictions/sts-dev.csv"
    before = path.read_bytes()
    dates = {p: p.stat() for p in (dvc_repo / "results").rglob("*")}
    path.unlink()
    # the stage that writes it, and its readers (c is exported: its export reads the predictions too)
    assert dvc_changed(dvc_repo) == {"predict-c", "evaluate-c", "export-c", "report"}
    run([DVC, "repro"], dvc_repo)
    assert path.read_bytes() == before
    assert "up to date" in run([DVC, "status"], dvc_repo)
    for p in sorted(dates, key=lambda q: len(q.parts), reverse=True):   # DVC re-links the stage's outputs:
        if p.exists():                                                    # their dates as they were, for
            os.utime(p, ns=(dates[p].st_atime_ns, dates[p].st_mtime_ns))  # Snakemake in later tests


@pytest.mark.slow
@needs_dvc
def test_dvc_repro_force_runs_the_stage_again(dvc_repo):
    """`dvc repro -f` runs the stage, which runs the job again (it said "up to date" and kept its
    outputs before): the run record shows the new run."""
    record = dvc_repo / "results/runs/finetune/c.json"
    before = _started(record)
    time.sleep(1.1)
    log = run([DVC, "repro", "-f", "-s", "finetune-c"], dvc_repo)
    assert stages_run(log) == {"finetune-c"} and "up to date" not in log
    assert _started(record) > before           # the last test of dvc_repo: what reads c's model is left to run
