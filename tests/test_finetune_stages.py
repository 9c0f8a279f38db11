"""The finetune, retrain_heads and predict stage CLIs end to end on a tiny prepared data set,
and their one-line errors (exit status 2) on bad input."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from test_train import restore_threads, write_prepared  # noqa: E402, F401  (tests/ is on sys.path; fixture)

from minbert.data.read import read_split
from minbert.entry import run
from stages import finetune, predict, retrain_heads

FT = {"epochs": 1, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.0, "max_steps_per_epoch": 3,
      "downsample": {"mode": "fixed", "size": 24}}
PRED_COLUMNS = {
    "sst": ["id", "sentence", "label", "prediction"] + [f"prob_{k}" for k in range(5)],
    "para": ["id", "sentence1", "sentence2", "label", "prediction", "prob_1"],
    "sts": ["id", "sentence1", "sentence2", "label", "prediction"],
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=32, n_dev=24, n_test=16)


@pytest.fixture(scope="module")
def params_file(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml.safe_dump({
        "base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "seed": 3, "max_length": 32,
                 "predict_batch_size": 16, "finetune": FT},
        "experiments": {
            "with_heads": {"retrain_heads": {"enabled": True, "epochs": 1, "batch_size": 8},
                           "finetune": {"heads": {"para": "concat", "sts": "cosine"}}},
            "plain": {},
            "missing_model": {"model": "./no/such/model-folder"},
        }}), encoding="utf-8")
    return path


def cli(main, argv, capsys) -> tuple[int, str]:
    """Run a stage as `python -m stages.X` would: (exit status, stderr)."""
    code = 0
    try:
        run(main, argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def results_with(prepared, tmp_path):
    """A results folder holding the prepared data, as the prepare stage leaves it."""
    results = tmp_path / "results"
    shutil.copytree(prepared, results / "data")
    return results


def test_finetune_retrain_predict_write_the_file_contract(params_file, prepared, tmp_path, capsys):
    results = results_with(prepared, tmp_path)
    common = ["--params", str(params_file), "--results", str(results)]
    assert cli(finetune.main, ["--experiment", "with_heads", *common], capsys)[0] == 0
    base = results / "experiments" / "with_heads"
    ft = base / "finetune"
    assert {p.name for p in ft.iterdir()} == {"model.pt", "history.csv"}
    assert not (results / "state" / "finetune" / "with_heads").exists()     # finished: no resumable state
    run_info = json.loads((results / "runs" / "finetune" / "with_heads.json").read_text())
    assert run_info["stage"] == "finetune" and run_info["best_epoch"] == 1 and "sst_acc" in run_info["best_dev"]
    # provenance: the resolved description and its fingerprint
    assert run_info["description"]["settings"]["finetune"]["epochs"] == 1 and len(run_info["fingerprint"]) == 16
    assert "minbert/train/loop.py" in run_info["description"]["code"] and "minbert/report/render.py" not in \
        run_info["description"]["code"]
    ckpt = torch.load(ft / "model.pt", map_location="cpu", weights_only=True)
    assert {"encoder_config", "heads", "tasks", "state_dict", "tokenizer_json", "max_length", "epoch",
            "dev_metrics", "experiment"} <= set(ckpt)
    assert ckpt["experiment"] == "with_heads" and ckpt["tasks"] == ["sst", "para", "sts"]

    assert cli(retrain_heads.main, ["--experiment", "with_heads", *common], capsys)[0] == 0
    rh = base / "retrain_heads"
    assert {p.name for p in rh.iterdir()} == {"model.pt", "history.csv"}
    rh_ckpt = torch.load(rh / "model.pt", map_location="cpu", weights_only=True)
    enc = [k for k in ckpt["state_dict"] if k.startswith("encoder.")]
    assert all(torch.equal(ckpt["state_dict"][k], rh_ckpt["state_dict"][k]) for k in enc)

    assert cli(predict.main, ["--experiment", "with_heads", *common], capsys)[0] == 0
    pred = base / "predictions"
    assert sorted(p.name for p in pred.glob("*.csv")) == sorted(
        f"{t}-{s}.csv" for t in ("sst", "para", "sts") for s in ("dev", "test"))
    assert json.loads((results / "runs" / "predict" / "with_heads.json").read_text())["stage"] == "predict"
    for task, columns in PRED_COLUMNS.items():
        for split in ("dev", "test"):
            frame = pd.read_csv(pred / f"{task}-{split}.csv", dtype={"id": str})
            source = read_split(results / "data" / f"{task}-{split}.tsv")
            assert list(frame.columns) == columns, (task, split)
            assert frame["id"].tolist() == source["id"].tolist(), (task, split)
            if split == "test":
                assert frame["label"].isna().all()
            else:
                np.testing.assert_allclose(frame["label"], source["label"])
            if task == "sst":
                probs = frame[[f"prob_{k}" for k in range(5)]].to_numpy()
                np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-4)
                assert (frame["prediction"] == probs.argmax(1)).all()
            elif task == "para":
                assert ((frame["prob_1"] > 0.5).astype(int) == frame["prediction"]).all()
            else:                                   # STS scores: on the 0-5 scale by an affine map, not clipped
                assert np.isfinite(frame["prediction"]).all()


def test_predict_uses_finetune_model_without_head_retraining(params_file, prepared, tmp_path, capsys):
    results = results_with(prepared, tmp_path)
    common = ["--params", str(params_file), "--results", str(results)]
    assert cli(finetune.main, ["--experiment", "plain", *common], capsys)[0] == 0
    assert cli(predict.main, ["--experiment", "plain", *common], capsys)[0] == 0
    dev = pd.read_csv(results / "experiments" / "plain" / "predictions" / "sst-dev.csv")
    # the predictions are the checkpoint's: its dev accuracy is the one recomputed from the CSV
    ckpt = torch.load(results / "experiments" / "plain" / "finetune" / "model.pt", map_location="cpu",
                      weights_only=True)
    assert (dev["prediction"] == dev["label"]).mean() == pytest.approx(ckpt["dev_metrics"]["sst_acc"])


@pytest.mark.parametrize("stage,argv,message", [
    (finetune, ["--experiment", "nope"], "unknown experiment 'nope'"),
    (retrain_heads, ["--experiment", "nope"], "unknown experiment 'nope'"),
    (predict, ["--experiment", "nope"], "unknown experiment 'nope'"),
    (finetune, ["--experiment", "plain", "--results", "{empty}"], "no prepared sst data"),
    (finetune, ["--experiment", "missing_model"], "model './no/such/model-folder': folder not found"),
    (retrain_heads, ["--experiment", "plain"], "has no retrain_heads job; set retrain_heads.enabled: true"),
    (retrain_heads, ["--experiment", "with_heads"], "checkpoint not found"),
    (predict, ["--experiment", "plain"], "checkpoint not found"),
])
def test_stage_errors_are_one_line_with_exit_status_2(stage, argv, message, params_file, prepared, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{empty}", str(tmp_path / "empty")) for a in argv]
    if "--results" not in argv:
        argv += ["--results", str(results_with(prepared, tmp_path))]
    code, err = cli(stage.main, ["--params", str(params_file), *argv], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
