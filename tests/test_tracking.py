"""Experiment tracking with the real libraries (DVCLive, TensorBoard, MLflow's local file store read
back with MLflow's own client), offline, on the tiny BERT: what they hold is the run's history
(every evaluation, at its update, the same numbers as history.csv) plus each update's learning rate
and training losses, each logged once per update; an interrupted run resumes its logs without the
updates it will redo; the engines declare the logs as the job's outputs, DVCLive's summary as a DVC
metrics file; a tracker whose package is absent is one line when the params load, and in the run."""
from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from test_train import finetune_experiment, make_exp, write_prepared

pytest.importorskip("dvclive")
pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=24)


def dvclive_series(folder, name) -> list[tuple[int, float]]:
    with open(folder / "dvclive" / "plots" / "metrics" / f"{name}.tsv", newline="") as f:
        return [(int(r["step"]), float(r[name])) for r in csv.DictReader(f, delimiter="\t")]


def tensorboard_series(folder, name) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(name)]


def mlflow_client(folder):
    """MLflow's own client on a run's store (the file store, which MLflow 3 serves when asked to)."""
    import os

    import mlflow

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.MlflowClient(tracking_uri=(folder / "mlflow").resolve().as_uri())


def mlflow_run(folder):
    client = mlflow_client(folder)
    experiments = client.search_experiments()
    assert [e.name for e in experiments] == ["minbert"]
    runs = client.search_runs([experiments[0].experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def mlflow_series(folder, name) -> list[tuple[int, float]]:
    client, run = mlflow_run(folder)
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, name),
                                              key=lambda m: (m.step, m.timestamp))]


SERIES = (dvclive_series, tensorboard_series, mlflow_series)
TRACKED = {"tracking": ["dvclive", "tensorboard", "mlflow"], "epochs": 2, "max_steps_per_epoch": 3, "evals_per_epoch": 2,
           "tasks": ["sst", "sts"]}


def test_the_trackers_hold_the_history_and_every_update(tiny_model_dir, prepared, tmp_path):
    out = tmp_path / "run"
    finetune_experiment(make_exp(tiny_model_dir, **TRACKED), prepared, out, name="tracked")
    history = pd.read_csv(out / "history.csv")
    assert sorted(p.name for p in out.iterdir()) == ["dvclive", "history.csv", "mlflow", "model.pt", "tensorboard"]
    assert not (tmp_path / "run.state").exists()
    for series in SERIES:
        # every evaluation at its update, with history.csv's numbers (the single source)
        for col in ("dev_score", "dev_sst_acc", "dev_sts_pearson", "train_sst_acc"):
            got = series(out, col)
            assert [s for s, _ in got] == history["update"].tolist(), (series.__name__, col)
            assert [v for _, v in got] == pytest.approx(history[col].tolist(), rel=1e-5), (series.__name__, col)
        # each of the 6 updates' lr, once (an evaluation's row does not log it again, issue 51); each
        # task's one-update loss where the update trained it, once (round robin over each epoch's three
        # updates: sst, sts, sst)
        assert [s for s, _ in series(out, "lr")] == [1, 2, 3, 4, 5, 6], series.__name__
        assert [s for s, _ in series(out, "train_sst_loss")] == [1, 3, 4, 6], series.__name__
        assert [s for s, _ in series(out, "train_sts_loss")] == [2, 5], series.__name__
    summary = json.loads((out / "dvclive" / "metrics.json").read_text())
    assert summary["dev_score"] == pytest.approx(history["dev_score"].iloc[-1], rel=1e-5)
    # the MLflow run: named after the experiment, finished, the run's settings as its params, its
    # artifact location in the store where it lies (copied there when the run finished, not moved)
    _, run = mlflow_run(out)
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.001" and run.data.params["epochs"] == "2"
    assert run.data.params["downsample.size"] == "32"
    assert run.info.artifact_uri.startswith((out / "mlflow").resolve().as_uri() + "/")
    assert run.data.metrics["dev_score"] == pytest.approx(history["dev_score"].iloc[-1], rel=1e-5)


def test_an_interrupted_tracked_run_resumes_its_logs_without_repeating_an_update(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, **TRACKED)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    finetune_experiment(exp, prepared, straight)
    finetune_experiment(exp, prepared, resumed, stop_after_epochs=1)
    assert (tmp_path / "resumed.state" / "tracking" / "dvclive" / "metrics.json").is_file()   # live, in the state
    finetune_experiment(exp, prepared, resumed)
    for series in SERIES:
        for col in ("dev_score", "lr", "train_sst_loss"):
            a, b = series(straight, col), series(resumed, col)
            assert [s for s, _ in b] == [s for s, _ in a], (series.__name__, col)
            assert [v for _, v in b] == pytest.approx([v for _, v in a], rel=1e-5), (series.__name__, col)


def test_the_engines_declare_the_logs_as_outputs_and_dvc_shows_the_summary(tiny_model_dir, tmp_path):
    import yaml

    from workflow import dag, dvc

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"data": {"dir": str(dag.REPO / "data" / "demo"), "nli_file": None}, "base": {"model": str(tiny_model_dir)},
         "experiments": {"t": {"finetune": {"tracking": ["dvclive", "tensorboard", "mlflow"]}}, "u": {}}}))
    jobs = {j.id: j for j in dag.jobs("params.yaml", repo=tmp_path)}
    t = jobs["finetune@t"]
    assert "results/experiments/t/finetune/tensorboard" in t.outs and "results/experiments/t/finetune/mlflow" in t.outs
    assert t.metrics == ["results/experiments/t/finetune/dvclive/metrics.json"]
    assert t.plots == ["results/experiments/t/finetune/history.csv", "results/experiments/t/finetune/dvclive/plots"]
    u = jobs["finetune@u"]
    assert u.outs == ["results/experiments/u/finetune/model.pt"] and not u.metrics
    # under DVC a training stage's output is its folder, the trackers' logs in it; their metrics and
    # plots are dvc.yaml's views, so turning a tracker on (`dvc exp run -S`) leaves the stages as they are
    generated = dvc.dvc_yaml("params.yaml", repo=tmp_path)
    stages = generated["stages"]
    assert stages["finetune-t"]["outs"] == ["results/experiments/t/finetune", "results/runs/finetune/t.json"]
    assert generated["metrics"] == ["results/experiments/t/finetune/dvclive/metrics.json"]
    assert "results/experiments/t/finetune/dvclive/plots" in generated["plots"]
    assert {k: v for k, v in stages["finetune-t"].items() if k != "cmd"} == \
        {k: v.replace("/u", "/t") if isinstance(v, str) else [x.replace("/u", "/t") for x in v]
         for k, v in stages["finetune-u"].items() if k != "cmd"}


@pytest.mark.parametrize("tool", ["dvclive", "tensorboard", "mlflow"])
def test_a_missing_tracker_library_is_one_line_at_params_load_and_in_the_run(tiny_model_dir, prepared, tmp_path,
                                                                              monkeypatch, tool):
    """Tracking asked of a package that is not installed: the params check says it, in one line naming
    the key, before any job is planned (it failed inside the training job before); a run given such
    settings directly says the same."""
    import sys

    import yaml

    from minbert.core.errors import MinBertError
    from minbert.params import load_params

    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=1, tracking=[tool])   # checked while it is there
    monkeypatch.setitem(sys.modules, tool, None)
    demo = tmp_path / "p.yaml"
    demo.write_text(yaml.safe_dump({"data": {"dir": "data/demo", "nli_file": None}, "base": {"model": str(tiny_model_dir)},
                                    "experiments": {"t": {"finetune": {"tracking": [tool]}}}}))
    with pytest.raises(MinBertError) as err:
        load_params(demo)
    package = {"mlflow": "mlflow-skinny"}.get(tool, tool)
    assert str(err.value) == (f"{demo}: key 'experiments.t.finetune.tracking': lists {tool}, which is not installed: "
                              f"pip install {package} (or the project's `tracking` extra), or take {tool} out of "
                              f"finetune.tracking")
    if tool == "tensorboard":
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MinBertError, match=rf"^finetune.tracking lists {tool}, which is not installed: pip install "
                                           rf"{package} \(or") as err:
        finetune_experiment(exp, prepared, tmp_path / "run")
    assert "\n" not in str(err.value)
