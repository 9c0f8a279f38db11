"""`predict_test: false` (the laptop scale's): an experiment predicts its dev split alone. The planner
declares dev files only for its predictions, their scoring and every ensemble it is a member of; the
predict stage writes those and nothing else; the scores have no test split; a claim that compares test
scores of such a row is refused in one line."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from minbert.core.errors import MinBertError
from minbert.params import read_yaml, validate_params
from minbert.pipeline.plan import pipeline

PARAMS = {
    "experiments": {"devonly": {"predict_test": False}, "both": {}},
    "ensembles": {"pair": {"members": ["devonly", "both"]}},
}


def _jobs(tmp_path) -> dict:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(PARAMS))
    return {(j.stage, j.name): j for j in pipeline(path)}


def _splits(paths) -> set[str]:
    return {p.rsplit("-", 1)[1].removesuffix(".csv").removesuffix(".tsv") for p in paths}


def test_the_planner_declares_dev_alone_where_test_is_off(tmp_path):
    jobs = _jobs(tmp_path)
    assert _splits(jobs["predict", "devonly"].writes["predictions"]) == {"dev"}
    assert _splits(jobs["predict", "devonly"].reads["splits"]) == {"dev"}
    assert _splits(jobs["evaluate", "devonly"].reads["predictions"]) == {"dev"}
    assert _splits(jobs["predict", "both"].writes["predictions"]) == {"dev", "test"}
    # an ensemble predicts the splits every member predicts, and reads only those of each member
    ens = jobs["ensemble", "pair"]
    assert _splits(ens.writes["predictions"]) == {"dev"} and _splits(ens.reads["predictions"]) == {"dev"}
    assert jobs["predict", "devonly"].description()["settings"]["splits"] == ["dev"]


def test_the_predict_stage_writes_dev_alone_and_the_scores_have_no_test(tmp_path, tiny_model_dir):
    """The stages themselves, on the demo data: prepare, a frozen fine-tune of one update, predict,
    evaluate."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "base": {"model": str(tiny_model_dir), "predict_test": False,
                 "finetune": {"tasks": ["sst"], "epochs": 1, "max_steps_per_epoch": 1, "batch_size": 4,
                              "freeze_encoder": True}},
        "experiments": {"e": {}}}))
    results = tmp_path / "results"
    for stage, flag in (("prepare", []), ("finetune", ["--experiment", "e"]), ("predict", ["--experiment", "e"]),
                        ("evaluate", ["--experiment", "e"])):
        r = subprocess.run([sys.executable, "-m", f"stages.{stage}", "--params", str(params), "--results",
                            str(results), *flag], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, (stage, r.stderr[-2000:])
    predictions = results / "experiments" / "e" / "predictions"
    assert sorted(p.name for p in predictions.iterdir()) == ["sst-dev.csv"]
    metrics = json.loads((results / "experiments" / "e" / "metrics.json").read_text())
    assert metrics["test"] is None and "sst_acc" in metrics["dev"]


def _claim_on_test(scale: str) -> dict:
    raw = copy.deepcopy(read_yaml(REPO / "params" / "papers.yaml"))
    raw["scale"] = scale
    study = next(st for st in raw["studies"] if st["name"] == "p002_methods")
    study["paper"]["claims"][0]["split"] = "test"
    return raw


def test_a_claim_on_test_scores_needs_rows_that_predict_test():
    validate_params(_claim_on_test("paper"), "papers.yaml")      # the papers' scale predicts test
    with pytest.raises(MinBertError) as err:
        validate_params(_claim_on_test("laptop"), "papers.yaml")
    message = str(err.value)
    assert "\n" not in message and "key 'studies[4].paper.claims[0].split'" in message
    assert "which predicts dev only (predict_test: false)" in message
