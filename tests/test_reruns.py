"""Exact re-runs, end to end in a copy of the repository (demo data, tiny random BERT), under both
engines: after a first full run, each edit re-runs exactly the jobs whose description (settings,
inputs, code) changed, and undoing the edit re-runs nothing. Then a resumed fine-tune starts fresh
when its configuration changed (one line saying what) and continues to a bit-identical result
when it did not."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_workflow import (
    DVC,
    SNAKEMAKE,
    commands_run,
    dag,
    dvc,
    job_ids,
    make_copy,
    needs_dvc,
    needs_snakemake,
    run,
    tiny_params,
)

EVERY_EXPERIMENT = ("a", "b", "c", "d")
EVERY_JOB = frozenset({"every job"})                      # stands for the whole DAG in EDITS
PRETRAININGS = {"pretrain@pf", "pretrain@mlm_tiny"}      # paraphrase-first and masked LM: both train
# c is exported too (its own target under Snakemake, one more stage under DVC)
PARAMS = {**tiny_params("models/tiny"), "export": {"experiments": ["c"]}}
TARGETS = ["all", "results/exports/c"]


def chain(*experiments: str, predictions_only: bool = False) -> set[str]:
    """An experiment's jobs from fine-tuning (or predicting) on, plus what reads them: the ensemble
    of a and b reads their predictions; the teacher ab reads their models, and the student d its
    outputs."""
    out = {"report"}
    for e in experiments:
        out |= {f"predict@{e}", f"evaluate@{e}"} | (set() if predictions_only else {f"finetune@{e}"})
        if e == "c":                 # its export reads its model and its predictions
            out.add("export@c")
        if e in ("a", "b"):
            out.add("ensemble@ab")
            if not predictions_only:
                out |= {"teach@ab"} | chain("d")
    return out


def edit_params(folder: Path, change) -> str:
    path = folder / "params.yaml"
    before = path.read_text()
    p = yaml.safe_load(before)
    change(p)
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return before


def set_key(p, keys, value):
    for k in keys[:-1]:
        p = p.setdefault(k, {})
    p[keys[-1]] = value


# Each edit, the jobs it must re-run (Snakemake's plan: by date, DVC: by hash) and the jobs whose own
# description it changes (what `dvc status` lists). `predict_batch_size` re-runs the predictions;
# under Snakemake what reads them follows in the plan (new files), under DVC only if their content
# changed. Code counts for what it does: a comment, a docstring or a help text re-runs nothing.
FITTING = {f"finetune@{e}" for e in EVERY_EXPERIMENT}
EDITS = {
    "report code": ("code", "minbert/report/plots.py", {"report"}, {"report"}),
    "description": ("params", (("experiments", "a", "description"), "plain, described anew"), {"report"}, {"report"}),
    "predict_batch_size": ("params", (("base", "predict_batch_size"), 7),
                           chain(*EVERY_EXPERIMENT, predictions_only=True),
                           {"predict@a", "predict@b", "predict@c", "predict@d", "report"}),
    "one experiment's predict_batch_size": ("params", (("experiments", "c", "predict_batch_size"), 7),
                                            chain("c", predictions_only=True), {"predict@c", "report"}),
    # dev alone predicted: its predictions, their scores, the ensemble it is in (the splits it combines)
    "one experiment's predict_test": ("params", (("experiments", "b", "predict_test"), False),
                                      {"predict@b", "evaluate@b", "ensemble@ab", "report"},
                                      {"predict@b", "evaluate@b", "ensemble@ab", "report"}),
    "para head of base": ("params", (("base", "finetune", "heads", "para"), "concat_mult"),
                          {"pretrain@pf"} | chain("a", "c", "d"),
                          {"pretrain@pf", "finetune@a", "finetune@c", "finetune@d", "report"}),
    "one experiment's lr": ("params", (("experiments", "a", "finetune", "lr"), 3e-4), chain("a"),
                            {"finetune@a", "report"}),
    "a student-free experiment's lr": ("params", (("experiments", "c", "finetune", "lr"), 3e-4), chain("c"),
                                       {"finetune@c", "report"}),
    # the export's own settings and code re-run the export alone (and the report, which shows the params)
    "export license": ("params", (("export", "license"), "mit"), {"export@c", "report"}, {"export@c", "report"}),
    "export code": ("code", "minbert/share/export.py", {"export@c"}, {"export@c"}),
    # the batch sampler is run by the training jobs only (not prepare, predict, evaluate or the report)
    "batch sampler code": ("code", "minbert/data/sampler.py", PRETRAININGS | chain(*EVERY_EXPERIMENT),
                           PRETRAININGS | FITTING),
    # the fine-tuning loop: the fine-tunings and paraphrase-first, not the masked-LM pretraining
    "training loop code": ("code", "minbert/train/loop.py", {"pretrain@pf"} | chain(*EVERY_EXPERIMENT),
                           {"pretrain@pf"} | FITTING),
    # what only documents, and what only checks or explains the params, is no job's code
    "a comment in the loop": ("comment", "minbert/train/loop.py", set(), set()),
    "a comment in prepare": ("comment", "minbert/data/prepare.py", set(), set()),
    "a docstring of the encoder": ("docstring", "minbert/model/bert.py", set(), set()),
    "a key's help text": ("help", "minbert/params/schema.py", set(), set()),
    "a params check": ("code", "minbert/params/validate.py", set(), set()),
    "a params message": ("code", "minbert/params/messages.py", set(), set()),
    # raw data counts by content, not by date: a copy or a fresh checkout re-runs nothing; one changed
    # sentence re-runs prepare, and everything reads the prepared data
    "raw data date": ("touch", "data/demo/sts-train.csv", set(), set()),
    "raw data bytes": ("data", "data/demo/sts-train.csv", EVERY_JOB, {"prepare"}),
}
# DVC re-runs for real (each a repro and its undo): the edits that differ in kind; an experiment's
# own lr is run for real under DVC by test_dvc_experiments_and_revisions_compare
# each kind of outcome once under DVC (every edit is planned under Snakemake above): the report alone, a
# setting of the predictions alone (one experiment's: the base's re-runs every prediction, the same
# outcome four times), a base setting, the export, a new date, nothing at all (a comment), a params check
DVC_EDITS = ["report code", "one experiment's predict_batch_size", "para head of base", "export license",
             "raw data date", "a comment in the loop", "a params check"]


def apply(folder: Path, edit):
    kind, what = edit[:2]
    if kind == "touch":                # new date, same bytes
        later = time.time() + 2
        os.utime(folder / what, (later, later))
        return lambda: None
    if kind == "data":                 # one sentence of the first row changed, still valid data
        path = folder / what
        before = path.read_bytes()
        head, first, rest = before.split(b"\n", 2)
        assert b" is " in first, first
        path.write_bytes(b"\n".join([head, first.replace(b" is ", b" was ", 1), rest]))
        return lambda: path.write_bytes(before)
    if kind in CODE_EDITS:
        path = folder / what
        before = path.read_text()
        after = CODE_EDITS[kind](before)
        assert after != before, (kind, what)
        path.write_text(after)
        return lambda: path.write_text(before)
    keys, value = what
    before = edit_params(folder, lambda p: set_key(p, keys, value))
    return lambda: (folder / "params.yaml").write_text(before)


CODE_EDITS = {
    "code": lambda text: text + "\n_EDITED_FOR_A_TEST = True         # code: it changes what the module does\n",
    "comment": lambda text: text + "\n# an edit that changes nothing but the file\n",
    "docstring": lambda text: text.replace('"""', '"""Edited: ', 1),
    "help": lambda text: text.replace('description="', 'description="(edited) ', 1),
}


@pytest.fixture(scope="module")
def snake_repo(repo_root, tmp_path_factory, tiny_model_dir):
    if SNAKEMAKE is None:
        pytest.skip("snakemake is not installed")
    folder = make_copy(repo_root, tmp_path_factory.mktemp("snake") / "repo", tiny_model_dir, PARAMS)
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], folder)
    assert job_ids(folder, commands_run(log)) == {j.id for j in dag.jobs("params.yaml", repo=folder)}
    return folder


def snakemake_plan(folder: Path, *options: str) -> set[str]:
    return job_ids(folder, commands_run(run([SNAKEMAKE, "-n", "--printshellcmds", "--cores", "2", *options, *TARGETS],
                                            folder)))


# Snakemake compares the checksums of input files under 1 MB before their dates; the real training
# files are larger (Quora's, SST's), so a raw-data edit is planned as for those: by date alone
BY_DATE = ("--max-checksum-file-size", "0")


@pytest.mark.slow
@needs_snakemake
@pytest.mark.parametrize("edit", list(EDITS))
def test_snakemake_reruns_exactly_what_an_edit_changes(snake_repo, edit):
    assert snakemake_plan(snake_repo) == set()
    expected = EDITS[edit][2]
    if expected is EVERY_JOB:
        expected = {j.id for j in dag.jobs("params.yaml", repo=snake_repo)}
    options = BY_DATE if EDITS[edit][0] in ("touch", "data") else ()
    undo = apply(snake_repo, EDITS[edit])
    try:
        assert snakemake_plan(snake_repo, *options) == expected
    finally:
        undo()
    assert snakemake_plan(snake_repo, *options) == set(), "undoing the edit must leave nothing to do"


# a change to prepare's code that leaves every file it writes as it was: prepare runs, then only the
# report, which shows every job's run record (the one of prepare is new); nothing reads the same data anew
SAME_OUTPUTS = ("code", "minbert/data/prepare.py")


@pytest.mark.slow
@needs_snakemake
def test_snakemake_stops_where_the_outputs_come_out_the_same(snake_repo):
    """Snakemake's plan is made before prepare runs (every reader of its files is planned), but each
    rule is a checkpoint: once prepare has run, Snakemake judges its readers again by content and
    runs none of them, as DVC does by hash."""
    undo = apply(snake_repo, SAME_OUTPUTS)
    try:
        log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], snake_repo)
        assert job_ids(snake_repo, commands_run(log)) == {"prepare", "report"}
        assert snakemake_plan(snake_repo) == set()
    finally:
        undo()
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], snake_repo)   # the first code again
    assert job_ids(snake_repo, commands_run(log)) == {"prepare", "report"}
    assert snakemake_plan(snake_repo) == set()


@pytest.mark.slow
@needs_snakemake
def test_snakemake_runs_the_edit_and_then_nothing(snake_repo):
    undo = apply(snake_repo, EDITS["a student-free experiment's lr"])
    try:
        log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], snake_repo)
        assert job_ids(snake_repo, commands_run(log)) == chain("c")
        assert snakemake_plan(snake_repo) == set()
    finally:
        undo()
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], snake_repo)   # back to the first settings
    assert job_ids(snake_repo, commands_run(log)) == chain("c")
    # the report lists the HTML pages and the metrics for `snakemake --report`
    run([SNAKEMAKE, "--report", "report.zip"], snake_repo)
    import zipfile

    names = zipfile.ZipFile(snake_repo / "report.zip").namelist()
    assert any(n.endswith("final.html") for n in names) and any(n.endswith("metrics.json") for n in names)


@pytest.mark.slow
@needs_snakemake
def test_snakemake_reruns_predict_for_a_deleted_predictions_file(snake_repo):
    """Each predictions file is an output of its own: deleting one re-runs the predict job that
    writes it, not only the evaluation. Its readers are planned too (the file will be new), then
    judged again by content once it is written: the same predictions re-run none of them but the
    report, which shows the new run record."""
    path = snake_repo / "results/experiments/c/predictions/sts-dev.csv"
    before = path.read_bytes()
    path.unlink()
    # with the export of c, which reads the predictions
    assert snakemake_plan(snake_repo) == chain("c", predictions_only=True)
    log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds", *TARGETS], snake_repo)   # the plan's targets
    # predict's new run record is new content the report shows (where each number was made)
    assert job_ids(snake_repo, commands_run(log)) == {"predict@c", "report"}
    assert path.read_bytes() == before
    assert snakemake_plan(snake_repo) == set()


def _started(record) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(json.loads(record.read_text())["started"]).timestamp()


@pytest.mark.slow
@needs_snakemake
def test_snakemake_forcerun_runs_the_job_again(snake_repo, monkeypatch):
    """Issue 37: `snakemake --forcerun` started the stage, which found its kept outputs for the same
    fingerprint and said "up to date", so docs/workflow.md's way to redo `precision: auto` jobs in
    bf16 left the fp32 model. A job an engine starts always runs: the forced fine-tune trains, and
    its run record says bf16."""
    record = snake_repo / "results/runs/finetune/c.json"
    before = _started(record)
    time.sleep(1.1)                            # the record's start has whole seconds
    monkeypatch.setenv("MINBERT_AUTO_PRECISION", "bf16")
    # the target before --forcerun, which takes every word after it as a rule or file to force
    log = run([SNAKEMAKE, "results/experiments/c/finetune/model.pt", "--cores", "2", "--printshellcmds",
               "--forcerun", "finetune"], snake_repo)
    assert job_ids(snake_repo, commands_run(log)) == {"finetune@c"}
    assert _started(record) > before and json.loads(record.read_text())["precision"] == "bf16"
    assert "up to date" not in (snake_repo / "results/logs/finetune/c.log").read_text()
    # the last test of snake_repo: what reads c's new model is left to run


# ---------------------------------------------------------------- DVC

@pytest.fixture(scope="module")
def dvc_repo(repo_root, tmp_path_factory, tiny_model_dir):
    if DVC is None:
        pytest.skip("dvc is not installed")
    folder = make_copy(repo_root, tmp_path_factory.mktemp("dvc") / "repo", tiny_model_dir, PARAMS)
    run(["git", "init", "-q"], folder)
    if not (folder / ".dvc").is_dir():
        run([DVC, "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "copy"], folder)
    log = run([DVC, "repro"], folder)
    assert stages_run(log) == {"resolve"} | {dvc.dvc_stage_name(j) for j in dag.jobs("params.yaml", repo=folder)}
    return folder


def stages_run(log: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", log))


def dvc_names(ids: set[str]) -> set[str]:
    return {i.replace("@", "-") for i in ids}


def dvc_status(folder: Path) -> set[str]:
    """The stages `dvc status` calls changed once the description files are current."""
    run([DVC, "repro", "resolve"], folder)
    out = run([DVC, "status", "--json"], folder)
    return set(json.loads(out[out.index("{"):])) - {"resolve"}


@pytest.mark.slow
@needs_dvc
def test_snakemake_after_dvc_has_nothing_to_do_then_sees_a_change(dvc_repo):
    """Both engines decide from the same description files: after `dvc repro`, Snakemake sees
    nothing to do, and a later params edit re-runs exactly its jobs under Snakemake too. (It runs
    first on the DVC copy: outputs DVC later restores from its cache get new dates, which Snakemake,
    having no record of DVC's runs, reads as new.)"""
    if SNAKEMAKE is None:
        pytest.skip("snakemake is not installed")
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
        assert dvc_status(dvc_repo) == direct          # the jobs the edit concerns directly
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
def test_dvc_stops_where_the_outputs_come_out_the_same(dvc_repo):
    undo = apply(dvc_repo, SAME_OUTPUTS)
    try:
        assert dvc_status(dvc_repo) == {"prepare"}
        assert stages_run(run([DVC, "repro"], dvc_repo)) - {"resolve"} == {"prepare", "report"}
    finally:
        undo()
    run([DVC, "repro"], dvc_repo)
    assert "up to date" in run([DVC, "status"], dvc_repo)


# ---------------------------------------------------------------- resuming a fine-tune

@pytest.fixture()
def results_with_data(repo_root, tmp_path, tiny_model_dir, monkeypatch):
    """A folder with params for one tiny experiment and the prepared demo data."""
    from stages import prepare

    params = {"data": {"dir": str(repo_root / "data" / "demo"), "nli_file": None},
              "base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "max_length": 32,
                       "finetune": {"epochs": 3, "batch_size": 8, "max_steps_per_epoch": 3,
                                    "downsample": {"mode": "fixed", "size": 24}}},
              "experiments": {"e": {}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    prepare.main(["--params", "params.yaml"])
    return tmp_path


def interrupted_then_resumed(folder: Path, change=None):
    """Fine-tune `e` for one epoch only (an interruption), optionally change something, then run
    the stage; returns the final model's weights."""
    from minbert.core.layout import Layout
    from minbert.params.settings import FinetuneSettings
    from minbert.pipeline.plan import job_for
    from minbert.train import experiment
    from minbert.train.training import FitOptions
    from stages import finetune

    L = Layout()
    job = job_for("params.yaml", "finetune", "e", L)
    s = FinetuneSettings(**job.settings)
    options = FitOptions(Path(L.training("e", "finetune")), state_dir=Path(L.state("finetune", "e")),
                         description=job.runtime_description(), stop_after_epochs=1,
                         checkpoint_extra={"experiment": "e", "stage": "finetune"})
    experiment.finetune_experiment(s, L.data, options, start_model=s.model)
    assert (folder / L.state("finetune", "e") / "last.pt").is_file()
    if change:
        change(folder)
    finetune.main(["--params", "params.yaml", "--experiment", "e"])
    return torch.load(folder / L.model("e", "finetune"), weights_only=True)["state_dict"]


def uninterrupted(folder: Path):
    from stages import finetune

    shutil.rmtree(folder / "results" / "state", ignore_errors=True)
    finetune.main(["--params", "params.yaml", "--experiment", "e", "--no-resume", "--force"])
    return torch.load(folder / "results/experiments/e/finetune/model.pt", weights_only=True)["state_dict"]


def test_resume_with_nothing_changed_is_bit_identical(results_with_data, capsys):
    resumed = interrupted_then_resumed(results_with_data)
    assert "resuming from results/state/finetune/e/last.pt at phase 0 epoch 1" in capsys.readouterr().err
    full = uninterrupted(results_with_data)
    assert resumed.keys() == full.keys() and all(torch.equal(resumed[k], full[k]) for k in full)


def _edit(key_path, value):
    def change(folder):
        edit_params(folder, lambda p: set_key(p, key_path, value))
    return change


def _new_model(folder):
    import shutil as sh

    src = yaml.safe_load((folder / "params.yaml").read_text())["base"]["model"]
    sh.copytree(src, folder / "other-model")
    _edit(("base", "model"), str(folder / "other-model"))(folder)


def _new_data(folder):
    path = folder / "results" / "data" / "sst-train.tsv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))          # one training sentence fewer


@pytest.mark.parametrize("change,notice", [
    (_edit(("base", "max_length"), 24), "settings.max_length: 32 -> 24"),
    (_edit(("base", "precision"), "bf16"), "settings.precision: 'auto' -> 'bf16'"),
    (_new_model, "settings.model: "),
    (_new_data, "input results/data/sst-train.tsv changed"),
])
def test_resume_after_a_change_starts_fresh_and_says_what_changed(results_with_data, capsys, change, notice):
    resumed = interrupted_then_resumed(results_with_data, change)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "another configuration" in line]
    assert len(lines) == 1 and notice in lines[0] and "starting fresh" in lines[0], lines
    assert "resuming from" not in err
    full = uninterrupted(results_with_data)        # the changed configuration from scratch
    assert all(torch.equal(resumed[k], full[k]) for k in full)


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
        assert "results/experiments/c/finetune/history.csv" in plots
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
    assert dvc_status(dvc_repo) == {"predict-c", "evaluate-c", "export-c", "report"}
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
