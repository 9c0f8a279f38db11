"""Faults, second round: what a careful user or a hostile input meets, each with real files and
processes.

- predictions are scored only when complete: every id of the split they claim exactly once, no
  other id, the split's labels; a missing predictions file is an error, never a dropped task;
- an undefined metric (Pearson r of constant labels or predictions) is null with its reason, shown
  as "undefined", and never selects an epoch or a model;
- a stage deletes only what it wrote (the report's pages under --out);
- inputs are regular files read with a bound (/dev/zero, a FIFO, a sparse file), model configs
  bounded before anything is built;
- nothing under results/ is written through a symlink;
- a full disk (a real tmpfs) while a checkpoint is written, a missing package (in a subprocess),
  bidirectional controls in the report;
- one process per job: a hand-run against a running one, a crashed holder, and Snakemake, DVC and a
  hand-run against each other on one folder.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO, child_env, error_line
from scipy.stats import pearsonr
from test_evaluate import write_predictions

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.core.metrics import Undefined, pearson, selection_score, summarise
from minbert.scoring.evaluate import evaluate_folder, expected_files, summary_line

EVERY_FILE = {"dev": ["sst", "para", "sts"], "test": ["sst", "para", "sts"]}


def _one_line(stderr: str, pattern: str) -> str:
    line = error_line(stderr)
    assert re.search(pattern, line), line
    return line


# ================================================================ predictions against their split

@pytest.fixture()
def scored(tmp_path):
    """An experiment's predictions and the prepared splits they claim, as the pipeline leaves them."""
    layout = Layout(str(tmp_path / "results"))
    folder = Path(layout.predictions("a"))
    write_predictions(folder, splits=Path(layout.data))
    return layout, folder


def _edit(path: Path, change) -> None:
    frame = pd.read_csv(path, dtype={"id": str}, keep_default_na=False)
    change(frame).to_csv(path, index=False)


def test_complete_predictions_score_as_before(scored):
    layout, folder = scored
    assert evaluate_folder(folder, EVERY_FILE, layout) == evaluate_folder(folder)


def test_missing_rows_are_an_error_naming_the_first_missing_id(scored):
    layout, folder = scored
    _edit(folder / "sst-dev.csv", lambda f: f.drop(index=[3, 7, 8, 20, 39]))
    with pytest.raises(MinBertError) as err:
        evaluate_folder(folder, EVERY_FILE, layout)
    msg = str(err.value)
    assert msg.startswith(f"{folder / 'sst-dev.csv'}: no prediction for id 's3' of {layout.split('sst', 'dev')}")
    assert "(5 of 40 rows missing)" in msg and "\n" not in msg


def test_extra_ids_and_other_labels_are_errors(scored):
    layout, folder = scored
    _edit(folder / "sts-test.csv", lambda f: pd.concat([f, f.iloc[[0]].assign(id="zz")]))
    with pytest.raises(MinBertError, match=r"sts-test.csv: line 42: id 'zz' is not in .*sts-test.tsv \(1 such rows\)"):
        evaluate_folder(folder, EVERY_FILE, layout)
    write_predictions(folder, splits=Path(layout.data))
    _edit(folder / "para-dev.csv", lambda f: f.assign(id=f["id"].where(f.index != 4, "q4x")))
    with pytest.raises(MinBertError, match=r"para-dev.csv: line 6: id 'q4x' is not in"):
        evaluate_folder(folder, EVERY_FILE, layout)
    write_predictions(folder, splits=Path(layout.data))
    _edit(folder / "para-dev.csv", lambda f: f.assign(label=np.where(f.index == 2, 1 - f["label"].astype(int),
                                                                     f["label"].astype(int))))
    with pytest.raises(MinBertError, match=r"para-dev.csv: line 4: id 'q2' has label \d, .*para-dev.tsv says \d"):
        evaluate_folder(folder, EVERY_FILE, layout)


def test_a_missing_predictions_file_is_an_error_not_a_dropped_task(scored):
    layout, folder = scored
    (folder / "sts-dev.csv").unlink()
    with pytest.raises(MinBertError, match=r"sts-dev.csv: predictions file not found; re-run the predict stage"):
        evaluate_folder(folder, EVERY_FILE, layout)


def _params(tmp_path, text: str = "experiments:\n  a: {}\n") -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def _stage(stage: str, tmp_path, *args, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"stages.{stage}", "--params", str(tmp_path / "params.yaml"),
                           "--results", str(tmp_path / "results"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, **kw)


def test_evaluate_stage_refuses_incomplete_predictions_and_writes_nothing(scored, tmp_path):
    layout, folder = scored
    _params(tmp_path)
    (folder / "para-test.csv").unlink()
    r = _stage("evaluate", tmp_path, "--experiment", "a")
    assert r.returncode == 2
    _one_line(r.stderr, r"para-test.csv: predictions file not found")
    assert not Path(layout.metrics("a")).exists()
    write_predictions(folder, splits=Path(layout.data))
    _edit(folder / "sst-dev.csv", lambda f: f.iloc[:35])
    r = _stage("evaluate", tmp_path, "--experiment", "a")
    assert r.returncode == 2
    _one_line(r.stderr, r"sst-dev.csv: no prediction for id 's35' .*\(5 of 40 rows missing\)")
    assert not Path(layout.metrics("a")).exists()


def test_every_predictions_file_is_a_declared_output(tmp_path):
    """Both engines see each file (a deleted one re-runs predict: tests/test_reruns.py runs it)."""
    from minbert.pipeline.plan import pipeline

    params = _params(tmp_path, "experiments:\n  a: {}\n  b: {finetune: {tasks: [sst]}}\n"
                               "ensembles:\n  ab: {members: [a, b]}\n")
    jobs = {j.id: j for j in pipeline(str(params), Layout())}
    assert jobs["predict@a"].outs == [f"results/experiments/a/predictions/{t}-{s}.csv"
                                      for t in ("sst", "para", "sts") for s in ("dev", "test")]
    assert expected_files(jobs["evaluate@a"].reads["predictions"]) == EVERY_FILE
    assert set(jobs["predict@a"].outs) <= set(jobs["evaluate@a"].deps)
    assert jobs["ensemble@ab"].outs == ["results/ensembles/ab/predictions/sst-dev.csv",
                                        "results/ensembles/ab/predictions/sst-test.csv"]


def test_experiments_predicting_other_tasks_get_a_snakemake_rule_of_their_own():
    """params/papers.yaml predicts five different task sets: each job is matched by exactly one rule,
    whose output patterns are that job's own files."""
    from workflow import dag

    jobs = [j for j in dag.jobs("params/papers.yaml") if j.stage in ("predict", "ensemble")]
    groups = [g for g in dag.rule_groups(jobs)]
    assert [g[0] for g in groups if g[1] == "predict"][:2] == ["predict", "predict_2"]
    for job in jobs:
        rules = [(rule, sample) for rule, stage, sample, pattern in groups
                 if stage == job.stage and re.fullmatch(pattern, job.name)]
        assert len(rules) == 1, (job.id, rules)
        sample = rules[0][1]        # the layout's paths with the name {name}
        assert [p.format(name=job.name) for p in sample.outputs] == job.outputs


# ================================================================ undefined metrics

@pytest.mark.parametrize("constant", ["labels", "predictions"])
def test_pearson_is_undefined_exactly_where_scipy_says_so(constant):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    assert pearson(x, y) == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    if constant == "labels":
        y = np.full(30, 3.0)
    else:
        x = np.full(30, 2.5)
    with pytest.warns(Warning):                         # scipy: ConstantInputWarning, r = nan
        assert math.isnan(pearsonr(x, y)[0])
    assert pearson(x, y) is None
    assert pearson([1.0], [2.0]) is None


def test_undefined_parts_make_overall_and_selection_undefined():
    metrics = summarise({"sst_acc": 0.5, "para_acc": 0.7, "sts_pearson": None})
    assert metrics["overall"] is None and metrics["mean"] is None
    assert selection_score(metrics) is None
    assert selection_score(metrics, ["sst", "para"]) == pytest.approx(0.6)   # STS is not asked for here
    assert selection_score(summarise({"sst_acc": 0.5, "para_acc": 0.7, "sts_pearson": 0.2})) == \
        pytest.approx((0.5 + 0.7 + 0.6) / 3)


def _constant_labels(split: Path, label: str) -> None:
    """A prepared split whose label column (the last) holds one value."""
    lines = split.read_text(encoding="utf-8").splitlines()
    split.write_text("\n".join([lines[0]] + [ln.rsplit("\t", 1)[0] + "\t" + label for ln in lines[1:]]) + "\n")


@pytest.mark.parametrize("constant", ["labels", "predictions"])
def test_constant_sts_gives_null_with_a_reason_and_a_warning(scored, tmp_path, caplog, constant):
    layout, folder = scored
    column = "label" if constant == "labels" else "prediction"
    _edit(folder / "sts-dev.csv", lambda f: f.assign(**{column: 2.0}))
    if constant == "labels":                  # the split itself has constant labels
        _constant_labels(Path(layout.split("sts", "dev")), "2.0")
    with caplog.at_level(logging.WARNING):
        metrics = evaluate_folder(folder, EVERY_FILE, layout)
    dev = metrics["dev"]
    assert dev["sts_pearson"] is None and dev["overall"] is None and dev["mean"] is None
    assert dev["sst_acc"] is not None and dev["para_acc"] is not None
    assert f"the {constant} are constant (all 2)" in dev["undefined"]["sts_pearson"]
    assert dev["undefined"]["overall"] == "sts_pearson undefined"
    assert any("sts_pearson is undefined" in r.getMessage() for r in caplog.records)
    assert "sts_pearson=undefined" in summary_line("a", metrics) and "overall=undefined" in summary_line("a", metrics)
    # through the stage: null in metrics.json (JSON, no NaN), exit 0, the warning on stderr
    _params(tmp_path)
    r = _stage("evaluate", tmp_path, "--experiment", "a")
    assert r.returncode == 0, r.stderr
    assert "sts_pearson is undefined" in r.stderr
    written = json.loads(Path(layout.metrics("a")).read_text())
    assert written["dev"]["sts_pearson"] is None and written["dev"]["overall"] is None
    assert "NaN" not in Path(layout.metrics("a")).read_text()


def test_report_says_undefined_and_never_picks_it_as_best(tmp_path):
    from minbert.params import load_params
    from minbert.report.data import load_report_data
    from minbert.report.render import render_reports
    from minbert.report.best import best_model
    from minbert.report.formats import fmt_metric
    from minbert.report.scores import ScoreBook

    params = _params(tmp_path, "experiments:\n  good: {}\n  flat: {seed: 2}\n"
                               "studies: [{name: s, title: S, experiments: [good, flat]}]\n")
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    for name, seed in (("good", 0), ("flat", 1)):
        folder = Path(layout.predictions(name))
        write_predictions(folder, seed=seed)
        if name == "flat":          # better SST and Quora, constant STS predictions
            _edit(folder / "sts-dev.csv", lambda f: f.assign(prediction=2.5))
            for task in ("sst", "para"):
                _edit(folder / f"{task}-dev.csv", lambda f: f.assign(prediction=f["label"]))
        Path(layout.metrics(name)).write_text(json.dumps(evaluate_folder(folder)))
    data = load_report_data(load_params(params), layout)
    value = data.runs["flat"].split_metrics("dev")["sts_pearson"]
    assert isinstance(value, Undefined) and "constant" in value.reason and fmt_metric(value) == "undefined"
    assert best_model(data, ScoreBook(data)).name == "good"
    render_reports(load_params(params), layout, progress=False)
    page = Path(layout.experiment_report("flat")).read_text(encoding="utf-8")
    assert "undefined" in page
    final = Path(layout.final_report).read_text(encoding="utf-8")
    assert "undefined" in final


def test_finetune_never_selects_an_epoch_with_an_undefined_metric(tmp_path, tiny_model_dir):
    """Constant STS dev labels: every epoch's Pearson r is undefined, so no epoch is selected as
    the best (none gets a score, none is recorded as chosen); the run keeps its last model and says
    so, and the metrics of its predictions stay undefined."""
    _training_params(tmp_path, tiny_model_dir, epochs=2)
    assert _stage("prepare", tmp_path).returncode == 0
    _constant_labels(tmp_path / "results" / "data" / "sts-dev.tsv", "3.0")
    r = _stage("finetune", tmp_path, "--experiment", "e", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("dev sts_pearson is undefined (the labels are constant (all 3);") == 2
    assert "no epoch had every dev metric defined, so none is selected as the best" in r.stderr
    history = pd.read_csv(tmp_path / "results" / "experiments" / "e" / "finetune" / "history.csv")
    assert history["dev_sts_pearson"].isna().all() and history["dev_score"].isna().all()
    assert history["dev_sst_acc"].notna().all()
    import torch

    ckpt = torch.load(tmp_path / "results" / "experiments" / "e" / "finetune" / "model.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["dev_metrics"] == {}          # the last epoch's, not a selected one


# ================================================================ stages delete only what they own

def test_report_out_keeps_the_users_own_files(tmp_path):
    """`report --out DIR`: the stage removes the pages it wrote before (its manifest lists them),
    never another file in DIR/experiments."""
    from stages import report

    out = tmp_path / "mine"
    (out / "experiments").mkdir(parents=True)
    own = {out / "experiments" / "notes.html": "my notes", out / "experiments" / "a.html.bak": "backup",
           out / "index.html": "my index"}
    for path, text in own.items():
        path.write_text(text)
    params = _params(tmp_path, "experiments: {a: {}, gone: {seed: 3}}\n")
    argv = ["--params", str(params), "--results", str(tmp_path / "results"), "--out", str(out)]
    report.main(argv)
    assert (out / "experiments" / "gone.html").is_file() and (out / "final.html").is_file()
    params.write_text("experiments: {a: {}}\n")          # `gone` left the params: its page goes
    report.main(argv)
    assert not (out / "experiments" / "gone.html").exists() and (out / "experiments" / "a.html").is_file()
    for path, text in own.items():
        assert path.read_text() == text, path
    assert json.loads((out / "experiments" / ".written.json").read_text()) == ["a.html"]


# ================================================================ bounded reads of regular files only

@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_params_from_dev_zero_or_a_fifo_is_one_line_at_once(tmp_path):
    import os

    fifo = tmp_path / "params.fifo"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), r"a FIFO \(named pipe\)")):
        r, peak = _with_peak_rss([sys.executable, "-m", "stages.prepare", "--params", path, "--results",
                                  str(tmp_path / "results")])
        assert r.returncode == 2
        _one_line(r.stderr, rf"^error: {re.escape(path)}: is {kind}, not a regular file; give a regular file as "
                            rf"the parameter file$")
        assert peak < 1024, peak                           # the process did not grow (it was 9.5 GB)


def _with_peak_rss(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run `cmd` under a Python of its own that reports the command's peak memory (MiB): the test
    process's own children figure counts every earlier test's children too (a CUDA torch among them
    is over 1 GB)."""
    import json as _json

    probe = ("import json, resource, subprocess, sys; "
             "r = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True, timeout=60); "
             "print(json.dumps([r.returncode, r.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    out = subprocess.run([sys.executable, "-c", probe, _json.dumps(cmd)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True)
    code, stderr, peak_kib = _json.loads(out.stdout)
    return subprocess.CompletedProcess(cmd, code, "", stderr), peak_kib / 1024


def test_size_bounds_refuse_before_reading(tmp_path):
    from minbert.core.io import read_input
    from minbert.params import load_params

    big = tmp_path / "params.yaml"
    with open(big, "wb") as f:                             # sparse: 17 MiB of nothing, on no disk
        f.truncate(17 << 20)
    with pytest.raises(MinBertError, match=r"params.yaml: 17.0 MiB, more than a parameter file may be \(16.0 MiB\)"):
        load_params(big)
    small = tmp_path / "x.txt"
    small.write_bytes(b"x" * 100)
    assert read_input(small, limit=100) == b"x" * 100
    with pytest.raises(MinBertError, match=r"x.txt: 100 bytes, more than a file may be \(99 bytes\)"):
        read_input(small, limit=99)


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_nli_file_that_is_not_a_regular_file_is_one_line(tmp_path, kind):
    import os

    target = kind
    if kind == "fifo":
        target = str(tmp_path / "nli.fifo")
        os.mkfifo(target)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"data": {"dir": str(REPO / "data" / "demo"), "nli_file": target}, "experiments": {"a": {}}}))
    r = _stage("prepare", tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    _one_line(r.stderr, rf"{re.escape(target)}: is a (character device|FIFO \(named pipe\)), not a regular file")
    assert not (tmp_path / "results" / "data").exists()


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "layers"])
def test_model_config_that_is_endless_or_oversized_is_one_line(tmp_path, tiny_model_dir, kind):
    import os
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = model / "config.json"
    if kind == "layers":
        config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 100000}))
    else:
        config.unlink()
        if kind == "fifo":
            os.mkfifo(config)
        else:
            config.symlink_to("/dev/zero")
    code = ("import sys; from minbert.model.weights import load_encoder; from minbert.entry import run; "
            "run(lambda argv: load_encoder(sys.argv[1]))")
    r, peak = _with_peak_rss([sys.executable, "-c", code, str(model)])
    assert r.returncode == 2
    pattern = {"layers": r"num_hidden_layers is 100000, more than any BERT has \(at most 256\)",
               "fifo": r"is a FIFO \(named pipe\), not a regular file",
               "/dev/zero": r"is a character device, not a regular file"}[kind]
    _one_line(r.stderr, rf"config.json: .*{pattern}" if kind == "layers" else rf"config.json: {pattern}")
    # against a process that only imports torch (with CUDA's libraries where torch has them): nothing grew
    _, torch_alone = _with_peak_rss([sys.executable, "-c", "import torch"])
    assert peak < torch_alone + 512, (peak, torch_alone)


def test_config_bounds_and_the_parameter_count_against_transformers():
    import transformers

    from minbert.model.bert import BertConfig

    for sizes in ({}, {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2,
                       "intermediate_size": 64, "vocab_size": 1000, "max_position_embeddings": 40}):
        with torch_device_meta():
            hf = transformers.BertModel(transformers.BertConfig(**sizes))
        assert BertConfig(**sizes).num_parameters() == sum(p.numel() for p in hf.parameters())
    with pytest.raises(ValueError, match=r"the sizes describe a model of .* billion parameters"):
        BertConfig(hidden_size=16384, num_hidden_layers=200, num_attention_heads=128, intermediate_size=65536)


def torch_device_meta():
    import torch

    return torch.device("meta")


# ================================================================ no writes through links under results/

def _evaluate_ready(tmp_path) -> tuple[Layout, Path]:
    layout = Layout(str(tmp_path / "results"))
    write_predictions(Path(layout.predictions("a")), splits=Path(layout.data))
    _params(tmp_path)
    return layout, tmp_path / "elsewhere"


@pytest.mark.parametrize("link", ["output file", "output folder", "state", "lock folder"])
def test_symlinks_under_results_are_refused(tmp_path, link):
    layout, elsewhere = _evaluate_ready(tmp_path)
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the pipeline's")
    path = {"output file": layout.metrics("a"), "output folder": layout.experiment("a"),
            "state": layout.state("evaluate", "a"), "lock folder": str(Path(layout.lock("evaluate", "a")).parent)}[link]
    path = Path(path)
    if link == "output folder":                       # the experiment's folder, moved away and linked back
        path.rename(elsewhere / "a")
        path.symlink_to(elsewhere / "a")
        target = elsewhere / "a"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        target = elsewhere / ("metrics.json" if link == "output file" else "")
        path.symlink_to(target)
    before = sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*"))
    r = _stage("evaluate", tmp_path, "--experiment", "a")
    assert r.returncode == 2
    _one_line(r.stderr, rf"{re.escape(str(path))}: is a symlink \(to {re.escape(str(target))}\) inside the results "
                        rf"folder .*remove the link \(rm {re.escape(str(path))}\)")
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before      # nothing written there
    assert (elsewhere / "keep.txt").read_text() == "not the pipeline's"


def test_a_results_folder_that_is_itself_a_link_is_fine(tmp_path):
    layout, elsewhere = _evaluate_ready(tmp_path)
    (tmp_path / "results").rename(elsewhere)
    (tmp_path / "results").symlink_to(elsewhere)       # results on another disk
    r = _stage("evaluate", tmp_path, "--experiment", "a")
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "experiments" / "a" / "metrics.json").is_file()


# ================================================================ one process per job

def _training_params(tmp_path, tiny_model_dir, epochs: int) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"data": {"dir": str(REPO / "data" / "demo"), "nli_file": None},
         "base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "max_length": 32,
                  "finetune": {"epochs": epochs, "batch_size": 8, "max_steps_per_epoch": 2,
                               "downsample": {"mode": "fixed", "size": 16}}},
         "experiments": {"e": {}}}))


def _wait_for_holder(lock: Path, pid: int, process, timeout: float = 240) -> dict:
    """The lock file's record once process `pid` holds it (it is training by then)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-2000:]
        try:
            info = json.loads(lock.read_text())
            if info.get("pid") == pid:
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{lock} never named PID {pid}")


def _training_started(state: Path, process, timeout: float = 240) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not (state / "last.pt").is_file():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-2000:]
        time.sleep(0.2)


def _read_until(process, pattern: str, timeout: float = 240) -> str:
    """A process's stderr, read line by line until a line matches `pattern` (what it said so far)."""
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(process.stderr, selectors.EVENT_READ)
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=1):
            line = process.stderr.readline()
            seen += line
            if re.search(pattern, line):
                return seen
            if not line and process.poll() is not None:
                break
    raise AssertionError(f"never printed {pattern!r}; it said:\n{seen[-3000:]}")


@pytest.mark.slow
def test_a_second_process_waits_and_takes_over_a_crashed_holder_from_its_state(tmp_path, tiny_model_dir):
    """Real processes: a fine-tune runs; the same job started beside it says once who runs it and
    waits, leaving the holder's state alone (it must not fail: an engine then deletes the outputs of
    the failed job, which are the other process's); the holder killed with SIGKILL, its lock is
    stale, and the waiting process takes it over and resumes the holder's state instead of training
    from scratch."""
    import signal
    import socket

    _training_params(tmp_path, tiny_model_dir, epochs=400)
    assert _stage("prepare", tmp_path).returncode == 0
    layout = Layout(str(tmp_path / "results"))
    lock, state = Path(layout.lock("finetune", "e")), Path(layout.state("finetune", "e"))
    cmd = [sys.executable, "-m", "stages.finetune", "--params", str(tmp_path / "params.yaml"),
           "--results", layout.results, "--experiment", "e"]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        holder = _wait_for_holder(lock, first.pid, first)
        assert holder["engine"] == "hand" and holder["host"] == socket.gethostname()
        _training_started(state, first)
        second = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = _read_until(second, "waiting for it to finish")
        assert re.search(rf"finetune@e is already running \(hand, PID {first.pid} on "
                         rf"{re.escape(socket.gethostname())} since .*\); waiting for it to finish", said), said
        assert first.poll() is None and second.poll() is None and (state / "last.pt").is_file()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        said = _read_until(second, r"resuming from .*last\.pt at phase 0 epoch [1-9]")
        assert f"taking over the lock of hand, PID {first.pid}" in said
        assert json.loads(lock.read_text())["pid"] == second.pid
        second.send_signal(signal.SIGTERM)                # stops like Ctrl-C: the state kept, the lock released
        assert second.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert lock.read_text() == "" and (state / "last.pt").is_file()


@pytest.mark.slow
def test_a_job_that_waited_for_its_holder_keeps_the_holders_outputs(tmp_path, tiny_model_dir):
    """The holder finishes while the same job waits: the waiting one finds the outputs made for its
    own settings, inputs and code, checks them by content, keeps them as they are (same files, same
    dates) and exits 0 with one line. Run again by hand it is up to date; with --force it trains
    again."""
    _training_params(tmp_path, tiny_model_dir, epochs=60)
    assert _stage("prepare", tmp_path).returncode == 0
    layout = Layout(str(tmp_path / "results"))
    lock, state = Path(layout.lock("finetune", "e")), Path(layout.state("finetune", "e"))
    cmd = [sys.executable, "-m", "stages.finetune", "--params", str(tmp_path / "params.yaml"),
           "--results", layout.results, "--experiment", "e"]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_holder(lock, first.pid, first)
        _training_started(state, first)
        second = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _read_until(second, "waiting for it to finish")
        assert first.wait(timeout=600) == 0
        out, err = second.communicate(timeout=300)
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.returncode == 0, err
    assert "finetune@e: finished by the process it waited for, for these settings, inputs and code; its outputs " \
           "are in place (checked by content): nothing to run" in err and "epoch 1" not in err
    model, record = Path(layout.model("e", "finetune")), Path(layout.run_record("finetune", "e"))
    assert json.loads(record.read_text())["stage"] == "finetune" and model.is_file()
    made = (model.stat().st_ino, model.stat().st_mtime_ns)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stderr and "--force runs it again" in again.stderr
    assert (model.stat().st_ino, model.stat().st_mtime_ns) == made          # left as it was
    forced = subprocess.run(cmd + ["--force"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert forced.returncode == 0 and "up to date" not in forced.stderr and "epoch 1" in forced.stderr
    assert model.stat().st_ino != made[0]
    # an output edited in place or removed is no longer the finished work: tests/test_finished.py


# ================================================================ full disk, missing package, bidi text

@pytest.fixture()
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for the prepared demo data, not for a checkpoint (needs root, or
    CAP_SYS_ADMIN, as in CI's container; skipped elsewhere)."""
    import os

    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode(errors='replace').strip()[:80]})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        assert not os.path.ismount(mount)


def test_torch_save_on_a_full_disk_is_the_no_space_error(small_disk):
    import torch

    from minbert.core.io import torch_save

    with pytest.raises(OSError) as err:
        torch_save({"weights": torch.zeros(2_000_000)}, small_disk / "model.pt")     # 8 MB on 3 MiB
    assert err.value.errno == 28 and err.value.filename == str(small_disk / "model.pt")
    assert list(small_disk.iterdir()) == []                                         # no temporary left
    torch_save({"weights": torch.arange(5)}, small_disk / "small.pt")
    assert torch.load(small_disk / "small.pt", weights_only=True)["weights"].tolist() == [0, 1, 2, 3, 4]


def test_finetune_on_a_full_disk_says_no_space_in_one_line(small_disk, tmp_path, tiny_model_dir):
    _training_params(tmp_path, tiny_model_dir, epochs=1)
    results = small_disk / "results"
    prepare = subprocess.run([sys.executable, "-m", "stages.prepare", "--params", str(tmp_path / "params.yaml"),
                              "--results", str(results)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert prepare.returncode == 0, prepare.stderr
    r = subprocess.run([sys.executable, "-m", "stages.finetune", "--params", str(tmp_path / "params.yaml"),
                        "--results", str(results), "--experiment", "e"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2
    assert "unexpected pos" not in r.stderr and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: no space left on {re.escape(str(results))}/state/finetune/e/\S+\.pt; free some "
                        rf"space \(or point --results elsewhere\) and run again", last), last
    assert not [p for p in results.rglob(".*.tmp")]


def _file_size_limit(limit: int):
    """A child process under RLIMIT_FSIZE, SIGXFSZ ignored: a write past the limit fails with EFBIG (as
    a 4 GiB+ file on FAT32 does)."""
    import resource
    import signal

    def limit_it():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_it


def test_a_file_too_large_is_one_line_naming_the_file(tmp_path, tiny_model_dir):
    """EFBIG in prepare and finetune: the file named, not "the disk" (issue 33, case 12)."""
    _training_params(tmp_path, tiny_model_dir, epochs=1)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "stages.prepare", "--params", str(tmp_path / "params.yaml"), "--results", str(results)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit(20_000))
    assert r.returncode == 2
    pattern = (rf"^error: {re.escape(str(results))}/\S+: file too large for its file system or for the file size "
               rf"limit \(ulimit -f; FAT32 holds at most 4 GiB per file\); write to another file system")
    assert re.search(pattern, _one_line(r.stderr, pattern)).group(0)
    assert not (results / "data").exists() and not [p for p in results.rglob(".*.tmp")]
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([sys.executable, "-m", "stages.finetune", "--params", str(tmp_path / "params.yaml"),
                        "--results", str(results), "--experiment", "e"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, preexec_fn=_file_size_limit(200_000))
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and "unexpected pos" not in r.stderr, r.stderr[-3000:]
    assert re.search(pattern, last), last
    assert not (results / "experiments" / "e" / "finetune" / "model.pt").exists()
    assert not [p for p in results.rglob(".*.tmp")]


def test_an_installed_package_that_fails_to_import_is_one_line(tmp_path):
    """An ImportError inside an installed package (a broken install), not a missing one (issue 33, case 15)."""
    site = tmp_path / "site"
    (site / "scipy").mkdir(parents=True)
    (site / "scipy" / "__init__.py").write_text("from scipy._lib import _ccallback_c\n")
    (site / "scipy" / "_lib.py").write_text("raise ImportError('libopenblas.so.0: cannot open shared object file')\n")
    _params(tmp_path)
    r = subprocess.run([sys.executable, "-m", "stages.report", "--params", str(tmp_path / "params.yaml"), "--results",
                        str(tmp_path / "results"), "--out", str(tmp_path / "reports")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=child_env(f"{site}{os.pathsep}{REPO}"))
    assert r.returncode == 2
    _one_line(r.stderr, r"^error: the Python package 'scipy' is installed but cannot be imported \(ImportError: "
                        r"libopenblas.so.0: cannot open shared object file\); a broken or mismatched installation: "
                        r"reinstall it with `pip install --force-reinstall 'scipy")
    # a name the project's own code fails to import is a bug: its traceback stays
    code = ("from minbert.entry import run; "
            "run(lambda _: exec('from minbert.core import no_such_name', {'__name__': 'minbert.x'}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" in r.stderr and "no_such_name" in r.stderr


@pytest.mark.parametrize("module,package", [("matplotlib", "matplotlib>=3.7"), ("scipy", "scipy>=1.10")])
def test_a_missing_package_is_one_line_naming_it_and_the_install_command(tmp_path, module, package):
    """The report stage in a Python where the package cannot be imported (a real subprocess)."""
    _params(tmp_path)
    code = (f"import sys, runpy; sys.modules[{module!r}] = None; "   # `import {module}` now fails as if absent
            f"sys.argv = ['stages.report', '--params', {str(tmp_path / 'params.yaml')!r}, "
            f"'--results', {str(tmp_path / 'results')!r}, '--out', {str(tmp_path / 'reports')!r}]; "
            "runpy.run_module('stages.report', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    _one_line(r.stderr, rf"^error: the Python package .{module}. is not installed \(import {module}[.\w]* failed\); "
                        rf"install it with `pip install '{re.escape(package)}'`")
    assert not (tmp_path / "reports" / "final.html").exists()


def test_bidirectional_controls_in_data_text_are_shown_not_obeyed(tmp_path):
    from html.parser import HTMLParser

    from minbert.params import load_params
    from minbert.report.render import render_reports

    params = _params(tmp_path, "experiments:\n  a: {}\n")
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    folder = Path(layout.predictions("a"))
    write_predictions(folder)
    controls = "\u202e\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    for task in ("sst", "para", "sts"):
        column = "sentence" if task == "sst" else "sentence1"
        _edit(folder / f"{task}-dev.csv", lambda f: f.assign(**{column: f"abc \u202eevil{controls} xyz"}))
    Path(layout.metrics("a")).write_text(json.dumps(evaluate_folder(folder)))
    render_reports(load_params(params), layout, progress=False)
    page = Path(layout.experiment_report("a")).read_text(encoding="utf-8")
    assert "abc \u27e6U+202E\u27e7evil" in page                       # shown, visibly
    assert not any(c in page for c in controls)                        # and never obeyed

    class Texts(HTMLParser):
        dirs: list = []

        def handle_starttag(self, tag, attrs):
            if tag == "td" and ("class", "text") in attrs:
                self.dirs.append(None)
            elif tag == "div" and self.dirs and self.dirs[-1] is None:
                self.dirs[-1] = dict(attrs).get("dir")

    texts = Texts()
    texts.feed(page)
    assert texts.dirs and set(texts.dirs) == {"auto"}                  # each text isolated in its own direction


def _wait_for_engine(lock: Path, engine: str, process, timeout: float = 300) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0][-3000:]
        try:
            info = json.loads(lock.read_text())
            if info.get("engine") == engine:
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{lock} never named {engine}")


def _stop(process) -> None:
    import os
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_for_text(path: Path, text: str, process, timeout: float = 300) -> str:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.is_file() else ""
        if text in content:
            return content
        assert process.poll() is None, (process.communicate()[0] or "")[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{path} never said {text!r}")


def _engine_repo(tmp_path, tiny_model_dir, epochs: int):
    from test_workflow import DVC, SNAKEMAKE, git_dvc_project, make_copy, run

    if SNAKEMAKE is None or DVC is None:
        pytest.skip("snakemake and dvc are not installed (pip install -e .[workflow])")
    params = {"data": {"dir": "data/demo", "nli_file": None},
              "base": {"model": "models/tiny", "device": "cpu", "threads": 1, "max_length": 32,
                       "finetune": {"epochs": epochs, "batch_size": 8, "max_steps_per_epoch": 2,
                                    "downsample": {"mode": "fixed", "size": 16}}},
              "experiments": {"a": {}}}
    repo = git_dvc_project(make_copy(REPO, tmp_path / "repo", tiny_model_dir, params))
    run([SNAKEMAKE, "--cores", "1", "results/data/sst-train.tsv"], repo)       # prepared: only fine-tuning to do
    return repo


OUTPUTS = ["results/experiments/a/finetune/model.pt", "results/experiments/a/finetune/history.csv",
           "results/runs/finetune/a.json"]


@pytest.mark.slow
def test_an_engine_never_deletes_what_another_process_finished(tmp_path, tiny_model_dir):
    """Issue: a job refused by the lock failed, and Snakemake then removed the "output files of the
    failed job": the files another process was writing. Real processes, Snakemake's two ways into it:
    a fine-tune started by hand, then `snakemake` while it runs; and Snakemake's own orphan (its
    master killed with SIGKILL), then `--unlock` and `--rerun-incomplete` while the orphan still
    trains. Each time the engine's job waits, finds the finished outputs made for its description,
    keeps them (exit 0) and nothing is trained twice. The holder is paused (SIGSTOP) while the engine
    starts, so the order holds on a machine of any speed."""
    import datetime as dt
    import os
    import signal
    import time

    from test_workflow import SNAKEMAKE, run

    repo = _engine_repo(tmp_path, tiny_model_dir, epochs=20)
    lock, state, log = (repo / "results/locks/finetune/a.lock", repo / "results/state/finetune/a",
                        repo / "results/logs/finetune/a.log")
    target = OUTPUTS[0]

    hand = subprocess.Popen([sys.executable, "-m", "stages.finetune", "--experiment", "a"], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    snake = None
    try:
        _wait_for_engine(lock, "hand", hand)
        _training_started(state, hand)
        os.kill(hand.pid, signal.SIGSTOP)
        snake = subprocess.Popen([SNAKEMAKE, "--cores", "1", target], cwd=repo, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _wait_for_text(log, "waiting for it to finish", snake)
        os.kill(hand.pid, signal.SIGCONT)
        assert hand.wait(timeout=600) == 0
        out = snake.communicate(timeout=600)[0]
    finally:
        _stop(hand)
        if snake is not None:
            _stop(snake)
    assert snake.returncode == 0, out[-3000:]
    assert "Removing output files of failed job" not in out
    assert "finished by the process it waited for" in log.read_text()
    assert all((repo / o).is_file() for o in OUTPUTS)
    assert json.loads((repo / OUTPUTS[2]).read_text())["description"]["stage"] == "finetune"

    # Snakemake's orphan: its master killed, the job goes on; the recovery Snakemake prints itself
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["base"]["finetune"]["epochs"] = 21                 # another description: it trains again
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    first = subprocess.Popen([SNAKEMAKE, "--cores", "1", target], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    second = None
    try:
        orphan = _wait_for_engine(lock, "snakemake", first)
        _training_started(state, first)
        os.kill(orphan["pid"], signal.SIGSTOP)
        os.kill(first.pid, signal.SIGKILL)                     # the master only: its job goes on
        first.wait(timeout=60)
        assert json.loads(lock.read_text())["pid"] == orphan["pid"]
        run([SNAKEMAKE, "--unlock"], repo)
        recovery_started = time.time()
        second = subprocess.Popen([SNAKEMAKE, "--cores", "1", "--rerun-incomplete", target], cwd=repo,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _wait_for_text(log, "waiting for it to finish", second)
        os.kill(orphan["pid"], signal.SIGCONT)
        out = second.communicate(timeout=900)[0]
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        try:
            os.kill(orphan["pid"], signal.SIGCONT)
        except (ProcessLookupError, NameError):
            pass
    assert second.returncode == 0, out[-3000:]
    assert "Removing output files of failed job" not in out
    assert all((repo / o).is_file() for o in OUTPUTS) and "finished by the process it waited for" in log.read_text()
    # the outputs are the orphan's run, which started before the recovery: trained once
    started = dt.datetime.fromisoformat(json.loads((repo / OUTPUTS[2]).read_text())["started"]).timestamp()
    assert started < recovery_started and not state.exists()
