"""minbert.scoring.ensemble / stages.ensemble: mode with ties to the smallest label, mean probabilities,
median / mean similarity, checked against hand-computed values; id alignment; bad members."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_evaluate import write_predictions

from minbert.core.errors import MinBertError
from minbert.scoring.ensemble import combine, ensemble_folder, mode_smallest


def sst(preds, probs=None):
    df = pd.DataFrame({"id": [f"s{i}" for i in range(len(preds))], "sentence": "x", "label": 0,
                       "prediction": preds})
    for k in range(5):
        df[f"prob_{k}"] = [p[k] for p in probs] if probs else 0.2
    return df


def test_mode_ties_go_to_smallest_label():
    votes = np.array([[3, 1, 3], [4, 2, 0], [1, 1, 2], [2, 4, 4], [0, 0, 0]])
    assert mode_smallest(votes).tolist() == [3, 0, 1, 4, 0]
    assert mode_smallest(np.array([[1, 0], [1, 1], [0, 1]])).tolist() == [0, 1, 0]   # para 1-1 split -> 0


def test_sst_mode_and_mean_prob():
    a = sst([4, 1], [[0, 0, 0, .4, .6], [.1, .5, .2, .1, .1]])
    b = sst([3, 2], [[0, 0, 0, .7, .3], [.1, .3, .5, .05, .05]])
    c = sst([3, 1], [[0, 0, .2, .5, .3], [.2, .5, .1, .1, .1]])
    assert combine("sst", [a, b, c], "mode")["prediction"].tolist() == [3, 1]
    out = combine("sst", [a, b, c], "mean_prob")
    # row 0 mean probs: [0, 0, .0667, .5333, .4] -> 3; row 1: [.133, .433, .267, .083, .083] -> 1
    assert out["prediction"].tolist() == [3, 1]
    assert out["prob_3"].iloc[0] == pytest.approx((.4 + .7 + .5) / 3)


def test_para_mean_prob_threshold_and_sts_median_mean():
    mk = lambda p, pr: pd.DataFrame({"id": ["a", "b"], "sentence1": "x", "sentence2": "y", "label": 1,  # noqa: E731
                                     "prediction": p, "prob_1": pr})
    members = [mk([1, 0], [.9, .2]), mk([0, 0], [.3, .45]), mk([0, 1], [.4, .8])]
    assert combine("para", members, "mode")["prediction"].tolist() == [0, 0]
    assert combine("para", members, "mean_prob")["prediction"].tolist() == [1, 0]  # means .533 and .483
    sts = lambda p: pd.DataFrame({"id": ["a", "b"], "sentence1": "x", "sentence2": "y", "label": 1.0,  # noqa: E731
                                  "prediction": p})
    m = [sts([1.0, 5.0]), sts([2.0, 0.0]), sts([4.5, 1.0])]
    assert combine("sts", m, similarity="median")["prediction"].tolist() == [2.0, 1.0]
    assert combine("sts", m, similarity="mean")["prediction"].tolist() == pytest.approx([7.5 / 3, 2.0])


def test_members_in_different_row_order_are_aligned_by_id():
    a = sst([1, 2, 3])
    b = sst([1, 2, 3]).iloc[::-1].reset_index(drop=True)
    c = sst([0, 2, 3])
    assert combine("sst", [a, b, c])["prediction"].tolist() == [1, 2, 3]


def test_folder_ensemble_and_mismatched_members(tmp_path):
    dirs = {}
    for i in range(3):
        dirs[f"m{i}"] = tmp_path / f"m{i}"
        write_predictions(dirs[f"m{i}"], seed=i)
    written = ensemble_folder(dirs, tmp_path / "ens", "mode", "median")
    assert sorted(written) == sorted(f"{t}-{s}.csv" for t in ("sst", "para", "sts") for s in ("dev", "test"))
    members = [pd.read_csv(d / "sts-dev.csv") for d in dirs.values()]
    got = pd.read_csv(tmp_path / "ens" / "sts-dev.csv")
    assert np.allclose(got["prediction"], np.median([m["prediction"] for m in members], axis=0))
    bad = pd.read_csv(dirs["m2"] / "sst-dev.csv")
    bad.loc[0, "id"] = "other"
    bad.to_csv(dirs["m2"] / "sst-dev.csv", index=False)
    with pytest.raises(MinBertError, match="members 'm0' and 'm2' predicted different rows"):
        ensemble_folder(dirs, tmp_path / "ens2")
    assert not (tmp_path / "ens2").exists()      # nothing half-written
    with pytest.raises(MinBertError, match="predictions of ensemble member 'x' not found"):
        ensemble_folder({"x": tmp_path / "nope", "m0": dirs["m0"]}, tmp_path / "ens3")


def test_stage_cli(tmp_path, repo_root):
    params = tmp_path / "params.yaml"
    params.write_text("experiments:\n  a: {}\n  b: {}\n  c: {}\n"
                      "ensembles:\n  abc: {members: [a, b, c], classification: mean_prob, similarity: mean}\n")
    for i, m in enumerate("abc"):
        write_predictions(tmp_path / "results" / "experiments" / m / "predictions", seed=i,
                          splits=tmp_path / "results" / "data")
    cmd = [sys.executable, "-m", "stages.ensemble", "--params", str(params), "--results", str(tmp_path / "results")]
    r = subprocess.run(cmd + ["--name", "abc"], cwd=repo_root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "results" / "ensembles" / "abc"
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["dev"]) >= {"sst_acc", "para_acc", "sts_pearson", "overall"} and metrics["test"] is None
    record = json.loads((tmp_path / "results" / "runs" / "ensemble" / "abc.json").read_text())
    assert record["description"]["settings"]["members"] == ["a", "b", "c"] and record["fingerprint"]
    r = subprocess.run(cmd + ["--name", "abd"], cwd=repo_root, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown ensemble 'abd' (did you mean 'abc'?)" in r.stderr
