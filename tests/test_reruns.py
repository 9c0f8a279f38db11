"""Exact re-runs, end to end in a copy of the repository (demo data, tiny random BERT), under
Snakemake (DVC: tests/test_reruns_dvc.py, from the same edits): after a first full run, each edit
re-runs exactly the jobs whose description (settings, inputs, code) changed, and undoing the edit
re-runs nothing. Then a resumed fine-tune starts fresh when its configuration changed (one line
saying what) and continues to a bit-identical result when it did not."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import error_line
from test_workflow import SNAKEMAKE, commands_run, dag, job_ids, make_copy, needs_snakemake, run, tiny_params

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
    # a head is the code of every job that trains or loads a model with it: their descriptions change
    "para head of base": ("params", (("base", "finetune", "heads", "para"), "concat_mult"),
                          {"pretrain@pf"} | chain("a", "c", "d"),
                          {"pretrain@pf", "finetune@a", "finetune@c", "finetune@d", "predict@a", "predict@c",
                           "predict@d", "teach@ab", "export@c", "report"}),
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


# The copies whose last plan was empty, unchanged since: the test that planned it as its last step
# says so, and the next edit starts from there without planning the same empty plan again.
SETTLED: set[Path] = set()


def settled(folder: Path) -> Path:
    """`folder` with nothing to do, checked unless the test before checked it last; the caller then
    changes it."""
    if folder not in SETTLED:
        assert snakemake_plan(folder) == set()
    SETTLED.discard(folder)
    return folder


# Snakemake compares the checksums of input files under 1 MB before their dates; the real training
# files are larger (Quora's, SST's), so a raw-data edit is planned as for those: by date alone
BY_DATE = ("--max-checksum-file-size", "0")


@pytest.mark.slow
@needs_snakemake
@pytest.mark.parametrize("edit", list(EDITS))
def test_snakemake_reruns_exactly_what_an_edit_changes(snake_repo, edit):
    settled(snake_repo)
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
    SETTLED.add(snake_repo)


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


# ---------------------------------------------------------------- accepting a reviewed edit, hand runs

# a reviewed edit that computes the same: a loss's value given a name before it is returned (every
# fine-tune trains sts with mse; the pretrainings train no regression task)
NO_OP = ("minbert/model/losses/mse.py",
         lambda text: text.replace("        return F.mse_loss(output.float(), target.float())",
                                   "        loss = F.mse_loss(output.float(), target.float())\n        return loss"))


# another such edit (its arguments named), so that one test's acceptance leaves the next one's to do
NO_OP_AGAIN = ("minbert/model/losses/mse.py",
               lambda text: text.replace("F.mse_loss(output.float(), target.float())",
                                         "F.mse_loss(input=output.float(), target=target.float())"))


def edit_code(folder: Path, path: str, change):
    before = (folder / path).read_text()
    assert change(before) != before
    (folder / path).write_text(change(before))
    return lambda: (folder / path).write_text(before)


def accept_code(folder: Path, *jobs: str, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "minbert.cli", "accept-code", *jobs], cwd=folder, capture_output=True,
                       text=True, timeout=600)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r


@pytest.mark.slow
@needs_snakemake
def test_accept_code_keeps_the_work_a_reviewed_no_op_edit_redescribes(snake_repo):
    """After a no-op edit of a loss, every job that trains with it is re-described and would re-run;
    `minbert accept-code` records the new code as their last runs' and Snakemake has nothing to do,
    nor has a hand run. Undone, the code that ran is theirs again."""
    settled(snake_repo)
    undo = edit_code(snake_repo, *NO_OP)
    try:
        assert snakemake_plan(snake_repo) >= FITTING
        out = accept_code(snake_repo).stdout
        assert {line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("accepted ")} == FITTING
        assert snakemake_plan(snake_repo) == set()
        hand = run([sys.executable, "-m", "stages.finetune", "--experiment", "a"], snake_repo)
        assert "up to date" in hand
        assert "nothing to accept" in accept_code(snake_repo).stdout
    finally:
        undo()
    assert snakemake_plan(snake_repo) == set()
    SETTLED.add(snake_repo)


@pytest.mark.slow
@needs_snakemake
def test_accept_code_refuses_a_job_whose_settings_changed(snake_repo):
    """A real edit (here a setting, with the no-op code edit beside it) is refused in one line, and
    nothing is accepted; unnamed, the job is said and left to run, the others accepted."""
    settled(snake_repo)
    undo_code = edit_code(snake_repo, *NO_OP_AGAIN)
    undo_params = apply(snake_repo, EDITS["one experiment's lr"])
    try:
        r = accept_code(snake_repo, "finetune@b", "finetune@a", ok=False)
        assert r.returncode == 2 and error_line(r.stderr) == (
            "error: accept-code: finetune@a its settings or inputs changed (settings.finetune.lr: 0.0001 -> "
            "0.0003); run it")
        assert snakemake_plan(snake_repo) >= FITTING            # nothing was accepted
        out = accept_code(snake_repo).stdout
        assert "not accepted finetune@a: its settings or inputs changed" in out and "accepted finetune@b" in out
        assert snakemake_plan(snake_repo) == chain("a")
    finally:
        undo_params()
        undo_code()
    assert snakemake_plan(snake_repo) == set()
    SETTLED.add(snake_repo)


@pytest.mark.slow
@needs_snakemake
def test_a_hand_run_on_inputs_put_back_since_is_not_taken_as_current(snake_repo):
    """A stage run by hand on hand-edited predictions writes scores of those; the predictions put
    back byte for byte (a new date, or their old one), its scores are still the edited ones': the
    job is not up to date, by hand nor under Snakemake, until it runs on what is in place."""
    settled(snake_repo)
    preds = snake_repo / "results/experiments/a/predictions/sst-dev.csv"
    metrics = snake_repo / "results/experiments/a/metrics.json"
    kept, good, stat = preds.read_bytes(), metrics.read_bytes(), preds.stat()
    frame = pd.read_csv(preds, dtype=str, keep_default_na=False)
    frame["prediction"] = frame["label"]                  # every answer right
    frame.to_csv(preds, index=False)
    evaluate = [sys.executable, "-m", "stages.evaluate", "--experiment", "a"]
    run(evaluate, snake_repo)
    assert json.loads(metrics.read_text())["dev"]["sst_acc"] == 1.0
    preds.write_bytes(kept)
    os.utime(preds, ns=(stat.st_atime_ns, stat.st_mtime_ns))    # put back as it was, its date too
    assert snakemake_plan(snake_repo) == {"evaluate@a", "report"}
    assert "up to date" not in run(evaluate, snake_repo)   # by hand: it runs, on what is in place
    assert metrics.read_bytes() == good
    # what remains is the report, which shows evaluate@a's run record (new at each run)
    assert snakemake_plan(snake_repo) == {"report"}
    run([SNAKEMAKE, "--cores", "2", *TARGETS], snake_repo)
    assert snakemake_plan(snake_repo) == set()
    SETTLED.add(snake_repo)


@pytest.mark.slow
@needs_snakemake
def test_snakemake_forcerun_runs_the_job_again(snake_repo, monkeypatch):
    """Issue 37: `snakemake --forcerun` started the stage, which found its kept outputs for the same
    fingerprint and said "up to date", so docs/workflow.md's way to redo `precision: auto` jobs in
    bf16 left the fp32 model. A job an engine starts always runs: the forced fine-tune trains, and
    its run record says the precision `auto` means now (the other one than the last run's)."""
    record = snake_repo / "results/runs/finetune/c.json"
    before = _started(record)
    other = {"bf16": "fp32", "fp32": "bf16"}[json.loads(record.read_text())["precision"]]
    time.sleep(1.1)                            # the record's start has whole seconds
    monkeypatch.setenv("MINBERT_AUTO_PRECISION", other)
    # the target before --forcerun, which takes every word after it as a rule or file to force
    log = run([SNAKEMAKE, "results/experiments/c/finetune/model.pt", "--cores", "2", "--printshellcmds",
               "--forcerun", "finetune"], snake_repo)
    assert job_ids(snake_repo, commands_run(log)) == {"finetune@c"}
    assert _started(record) > before and json.loads(record.read_text())["precision"] == other
    assert "up to date" not in (snake_repo / "results/logs/finetune/c.log").read_text()
    # the last test of snake_repo: what reads c's new model is left to run


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
