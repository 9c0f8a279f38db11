"""minbert.scoring.evaluate / stages.evaluate: metrics against scipy/numpy computed here, test splits with
and without labels, and bad prediction files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr

from minbert.core.errors import MinBertError
from minbert.data.read import output_columns, write_split
from minbert.scoring.evaluate import evaluate_folder

rng = np.random.default_rng(0)


def write_predictions(folder, n=40, test_labels=False, seed=0, splits=None):
    """A predictions folder in the docs/pipeline.md format, with known labels and predictions. The
    labels are the same for every `seed` (the data); the predictions differ (another model).
    `splits`: a folder where the prepared splits these predictions claim are written too."""
    r = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for k, split in enumerate(("dev", "test")):
        lab = split == "dev" or test_labels
        data = np.random.default_rng(1000 + k)
        y, y2, y3 = data.integers(0, 5, n), data.integers(0, 2, n), data.uniform(0, 5, n)
        p = np.where(r.random(n) < 0.6, y, r.integers(0, 5, n))
        probs = r.dirichlet(np.ones(5), n)
        sst = pd.DataFrame({"id": [f"s{i}" for i in range(n)], "sentence": "x", "label": y if lab else None,
                            "prediction": p, **{f"prob_{k}": probs[:, k] for k in range(5)}})
        p2 = np.where(r.random(n) < 0.7, y2, 1 - y2)
        para = pd.DataFrame({"id": [f"q{i}" for i in range(n)], "sentence1": "a", "sentence2": "b",
                             "label": y2 if lab else None, "prediction": p2, "prob_1": r.random(n)})
        p3 = np.clip(y3 + r.normal(0, 1, n), 0, 5)      # the model clips its scores to the label range
        sts = pd.DataFrame({"id": [f"t{i}" for i in range(n)], "sentence1": "a", "sentence2": "b",
                            "label": y3 if lab else None, "prediction": p3})
        for task, df in (("sst", sst), ("para", para), ("sts", sts)):
            df.to_csv(folder / f"{task}-{split}.csv", index=False)
            if splits is not None:
                write_split(df[output_columns(task)], splits / f"{task}-{split}.tsv")
        truth[split] = {"sst_acc": float(np.mean(p == y)), "para_acc": float(np.mean(p2 == y2)),
                        "sts_pearson": float(pearsonr(p3, y3)[0])}
    return truth


def test_dev_metrics_match_independent_computation(tmp_path):
    truth = write_predictions(tmp_path / "predictions")
    m = evaluate_folder(tmp_path / "predictions")
    for k, v in truth["dev"].items():
        assert m["dev"][k] == pytest.approx(v, abs=1e-12)
    t = truth["dev"]
    assert m["dev"]["overall"] == pytest.approx((t["sst_acc"] + t["para_acc"] + (t["sts_pearson"] + 1) / 2) / 3)
    assert m["dev"]["mean"] == pytest.approx(np.mean(list(t.values())))
    assert m["dev"]["n"] == {"sst": 40, "para": 40, "sts": 40}
    assert m["test"] is None                       # unlabelled test files are not scored


def test_test_metrics_when_labels_exist(tmp_path):
    truth = write_predictions(tmp_path / "p", test_labels=True)
    m = evaluate_folder(tmp_path / "p")
    assert m["test"]["sst_acc"] == pytest.approx(truth["test"]["sst_acc"])
    assert m["test"]["sts_pearson"] == pytest.approx(truth["test"]["sts_pearson"])


def test_single_task_has_no_overall(tmp_path):
    write_predictions(tmp_path / "p")
    for f in (tmp_path / "p").glob("s*-*.csv"):
        f.unlink()      # keep para only
    m = evaluate_folder(tmp_path / "p")
    assert set(m["dev"]) == {"para_acc", "n"}


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(MinBertError, match="predictions folder not found"):
        evaluate_folder(tmp_path / "missing")
    write_predictions(tmp_path / "p")
    df = pd.read_csv(tmp_path / "p" / "sst-dev.csv")
    df["prediction"] = df["prediction"].astype(object)
    df.loc[3, "prediction"] = "oops"
    df.to_csv(tmp_path / "p" / "sst-dev.csv", index=False)
    with pytest.raises(MinBertError, match=r"sst-dev.csv: line 5: prediction 'oops' is not a finite number"):
        evaluate_folder(tmp_path / "p")
    df = pd.read_csv(tmp_path / "p" / "para-dev.csv")
    df.loc[2, "label"] = None
    df.to_csv(tmp_path / "p" / "para-dev.csv", index=False)
    (tmp_path / "p" / "sst-dev.csv").unlink()
    with pytest.raises(MinBertError, match=r"para-dev.csv: row 4 has no label while others do"):
        evaluate_folder(tmp_path / "p")


def test_stage_cli_writes_metrics_and_rejects_unknown_experiment(tmp_path, repo_root):
    params = tmp_path / "params.yaml"
    params.write_text("experiments:\n  exp_a: {}\n")
    truth = write_predictions(tmp_path / "results" / "experiments" / "exp_a" / "predictions",
                              splits=tmp_path / "results" / "data")
    run = lambda *a: subprocess.run([sys.executable, "-m", "stages.evaluate", "--params", str(params),  # noqa: E731
                                     "--results", str(tmp_path / "results"), *a],
                                    cwd=repo_root, capture_output=True, text=True)
    r = run("--experiment", "exp_a")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "results" / "experiments" / "exp_a" / "metrics.json").read_text())
    assert m["dev"]["para_acc"] == pytest.approx(truth["dev"]["para_acc"])
    r = run("--experiment", "exp_b")
    assert r.returncode == 2 and "unknown experiment 'exp_b' (did you mean 'exp_a'?)" in r.stderr


def _edit_csv(path, edit):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    edited = edit(frame)
    if isinstance(edited, bytes):
        path.write_bytes(edited)
    else:
        edited.to_csv(path, index=False)


def _set(column, row, value):
    def edit(frame):
        frame.loc[row, column] = value
        return frame
    return edit


# (file, edit, the one-line error): every check of the one predictions reader
BAD_PREDICTIONS = {
    "no text column": ("sst-dev.csv", lambda f: f.drop(columns=["sentence"]),
                       r"sst-dev\.csv: missing column\(s\) sentence \(expected id, sentence, label, prediction, \.\.\.\)"),
    "no rows": ("sst-dev.csv", lambda f: f.head(0), r"sst-dev\.csv: the file has no rows"),
    "not UTF-8": ("sst-dev.csv", lambda f: b"id,sentence,label,prediction\ns1,\xff,1,1\n", r"sst-dev\.csv: not UTF-8 text"),
    "id twice": ("para-dev.csv", _set("id", 3, "q0"), r"para-dev\.csv: id 'q0' appears twice"),
    "empty prediction": ("sts-dev.csv", _set("prediction", 4, ""), r"sts-dev\.csv: line 6: the prediction is empty"),
    "infinite prediction": ("sst-dev.csv", _set("prediction", 2, "inf"),
                            r"sst-dev\.csv: line 4: prediction 'inf' is not a finite number"),
    "label not a class": ("sst-dev.csv", _set("label", 1, "7"),
                          r"sst-dev\.csv: line 3: label '7' is not a sst label \(one of \[0, 1, 2, 3, 4\]\)"),
    "score outside 0-5": ("sts-dev.csv", _set("prediction", 0, "5.5"),
                          r"sts-dev\.csv: line 2: prediction '5\.5' is not a sts prediction \(from 0 to 5\)"),
    "probability not a number": ("sst-dev.csv", _set("prob_2", 5, "high"),
                                 r"sst-dev\.csv: line 7: prob_2 'high' is not a finite number"),
    "partly labelled": ("para-dev.csv", _set("label", 2, ""), r"para-dev\.csv: row 4 has no label while others do"),
}


@pytest.mark.parametrize("case", sorted(BAD_PREDICTIONS))
def test_evaluate_and_the_report_read_predictions_with_the_same_checks(tmp_path, case):
    """One predictions reader (minbert.scoring.predictions): the evaluate stage and the report refuse
    the same bad file with the same one-line error, whichever of them checked it first before."""
    from minbert.core.layout import Layout
    from minbert.params import load_params
    from minbert.report.data import load_report_data

    name, edit, message = BAD_PREDICTIONS[case]
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    folder = tmp_path / "results" / "experiments" / "a" / "predictions"
    write_predictions(folder)
    (tmp_path / "params.yaml").write_text("experiments: {a: {}}\n")
    params = load_params(tmp_path / "params.yaml")
    evaluate_folder(folder)
    load_report_data(params, layout)                  # the files as the predict stage writes them are read
    _edit_csv(folder / name, edit)
    errors = []
    for read in (lambda: evaluate_folder(folder), lambda: load_report_data(params, layout)):
        with pytest.raises(MinBertError, match=message) as caught:
            read()
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and len(errors[0].splitlines()) == 1
