"""Knowledge distillation on the tiny BERT: the loss against the teacher (each task kind against a
torch reference; weight 0 is the gold-label loss exactly), the teach stage's outputs, and students
end to end: weight 0 trains exactly as ordinary training, the student's batches carry the teacher's
outputs for their rows, and a student learning only from a (made-up) teacher follows it."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from test_train import restore_threads, write_prepared  # noqa: F401  (fixture)

import minbert.train.objectives as objectives
from minbert.params import DistillParams, HeadsParams
from minbert.train.losses import distill_loss, task_loss
from stages import finetune, predict, teach

# compares numbers between two ways of computing them: CI runs it again with the other precision as `auto`
pytestmark = pytest.mark.numbers

HEADS = HeadsParams(sts="cosine")


def _distill(weight: float, temperature: float) -> DistillParams:
    return DistillParams(teacher="t", weight=weight, temperature=temperature)


def test_weight_zero_is_the_gold_loss_and_each_kind_matches_its_reference():
    torch.manual_seed(0)
    z, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    p = torch.softmax(torch.randn(6, 5), -1)
    assert torch.equal(distill_loss("sst", HEADS, z, y, p, _distill(0.0, 2.0)), task_loss("sst", HEADS, z, y))
    T = 2.0
    q = torch.softmax(torch.log(p) / T, -1)
    kl = (q * (torch.log(q) - torch.log_softmax(z / T, -1))).sum(-1).mean() * T * T
    expected = 0.7 * F.cross_entropy(z, y) + 0.3 * kl
    torch.testing.assert_close(distill_loss("sst", HEADS, z, y, p, _distill(0.3, T)), expected)
    zb, yb, pb = torch.randn(6), torch.tensor([0, 1, 1, 0, 1, 0]), torch.rand(6) * 0.98 + 0.01
    qb = torch.sigmoid(torch.logit(pb) / T)
    bce = -(qb * F.logsigmoid(zb / T) + (1 - qb) * F.logsigmoid(-zb / T)).mean() * T * T
    torch.testing.assert_close(distill_loss("para", HEADS, zb, yb, pb, _distill(1.0, T)), bce, rtol=1e-4, atol=1e-5)
    zs, ys, ts = torch.rand(6), torch.rand(6) * 5, torch.rand(6) * 5
    torch.testing.assert_close(distill_loss("sts", HEADS, zs, ys, ts, _distill(0.5, T)),
                               0.5 * F.mse_loss(zs, ys / 5) + 0.5 * F.mse_loss(zs, ts / 5))


@pytest.fixture()
def project(tmp_path, tiny_model_dir, monkeypatch):
    """Prepared data and params: two teacher experiments, their ensemble, students distilling from it."""
    write_prepared(tmp_path / "results" / "data", n_train=40, n_dev=24, n_test=8)
    quick = {"epochs": 2, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.0, "max_steps_per_epoch": 4,
             "downsample": {"mode": "fixed", "size": 32}, "heads": {"sts": "cosine", "dropout": 0.0},
             "hidden_dropout": 0.0, "attention_dropout": 0.0}
    params = {"base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "seed": 3, "max_length": 32,
                       "finetune": quick},
              "experiments": {"t1": {}, "t2": {"seed": 4}, "plain": {"seed": 5},
                              "zero": {"seed": 5, "finetune": {"distill": {"teacher": "ens", "weight": 0.0}}},
                              "half": {"seed": 5, "finetune": {"distill": {"teacher": "ens", "weight": 0.5}}},
                              "only": {"seed": 5, "finetune": {"distill": {"teacher": "ens", "weight": 1.0,
                                                                           "tasks": ["sst"]}}}},
              "ensembles": {"ens": {"members": ["t1", "t2"], "classification": "mean_prob", "similarity": "mean"}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    for t in ("t1", "t2"):
        finetune.main(["--experiment", t])
    teach.main(["--name", "ens"])
    return tmp_path


def weights(folder, name):
    return torch.load(folder / "results" / "experiments" / name / "finetune" / "model.pt", weights_only=True)["state_dict"]


def test_the_teacher_predicts_every_training_row(project):
    files = sorted(p.name for p in (project / "results" / "teachers" / "ens").iterdir())
    assert files == ["para-train.csv", "sst-train.csv", "sts-train.csv"]
    sst = pd.read_csv(project / "results" / "teachers" / "ens" / "sst-train.csv", dtype={"id": str})
    train_ids = pd.read_csv(project / "results" / "data" / "sst-train.tsv", sep="\t", dtype=str)["id"]
    assert sst["id"].tolist() == train_ids.tolist()          # all 40 rows, not the students' 32
    np.testing.assert_allclose(sst[[f"prob_{k}" for k in range(5)]].sum(axis=1), 1.0, atol=1e-6)
    sts = pd.read_csv(project / "results" / "teachers" / "ens" / "sts-train.csv")
    assert list(sts.columns) == ["id", "score"] and np.isfinite(sts["score"]).all()   # on the label scale, unclipped
    # the mean of the two models' probabilities, each predicted as the teach stage does: its batches,
    # and the precision its run record says ran (bf16 where the CPU has it natively)
    from minbert.core.runtime import autocast
    from minbert.data.batches import load_task_data
    from minbert.model.checkpoint import load_checkpoint
    from minbert.model.multitask import predict_task
    from minbert.train.distill import BATCH_SIZE

    cpu = torch.device("cpu")
    bf16 = json.loads((project / "results" / "runs" / "teach" / "ens.json").read_text())["precision"] == "bf16"
    probs = []
    for t in ("t1", "t2"):
        model, tok, _ = load_checkpoint(project / "results" / "experiments" / t / "finetune" / "model.pt")
        data = load_task_data(project / "results" / "data", ["sst"], model.heads_cfg, tok, splits=("train",))
        probs.append(predict_task(model, data["train"]["sst"], tok, BATCH_SIZE, cpu, lambda: autocast(cpu, bf16))["probs"])
    np.testing.assert_allclose(sst[[f"prob_{k}" for k in range(5)]].to_numpy(), np.mean(probs, 0), atol=1e-6)


def test_weight_zero_trains_exactly_as_ordinary_training(project):
    finetune.main(["--experiment", "plain"])
    finetune.main(["--experiment", "zero"])
    a, b = weights(project, "plain"), weights(project, "zero")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_students_batches_carry_the_teachers_outputs(project, monkeypatch):
    seen = []
    real = objectives.distill_loss

    def spy(task, heads, output, labels, soft, distill, pair=None):
        seen.append((task, soft.clone(), distill.weight, distill.temperature))
        return real(task, heads, output, labels, soft, distill, pair)

    monkeypatch.setattr(objectives, "distill_loss", spy)
    finetune.main(["--experiment", "half"])
    assert {t for t, *_ in seen} == {"sst", "para", "sts"} and all(w == 0.5 and T == 2.0 for _, _, w, T in seen)
    teacher = {t: pd.read_csv(project / "results" / "teachers" / "ens" / f"{t}-train.csv") for t in ("sst", "para", "sts")}
    for task, soft, _, _ in seen:
        values = teacher[task].drop(columns="id").to_numpy(dtype=np.float32)
        rows = values if values.shape[1] > 1 else values[:, 0]
        for row in soft.numpy():   # every soft target is some training row's teacher output
            assert np.isclose(rows, row, atol=1e-6).reshape(len(rows), -1).all(-1).any()


def test_a_student_learning_only_from_its_teacher_follows_it(project):
    # a made-up teacher: every sentence is neutral (class 2) with certainty
    path = project / "results" / "teachers" / "ens" / "sst-train.csv"
    frame = pd.read_csv(path, dtype={"id": str})
    frame[[f"prob_{k}" for k in range(5)]] = [[0.0, 0.0, 1.0, 0.0, 0.0]] * len(frame)
    frame.to_csv(path, index=False)
    shutil.rmtree(project / "results" / "jobs", ignore_errors=True)
    finetune.main(["--experiment", "only"])
    predict.main(["--experiment", "only"])
    dev = pd.read_csv(project / "results" / "experiments" / "only" / "predictions" / "sst-dev.csv")
    assert (dev["prediction"] == 2).mean() > 0.9, dev["prediction"].value_counts()


@pytest.mark.parametrize("distill,message", [
    ({"teacher": "nobody"}, "unknown experiment or ensemble 'nobody'"),
    ({"teacher": "s"}, "cannot be its own teacher"),
    ({"teacher": "t", "tasks": ["sts"]}, "'sts' is not trained by this experiment"),
    ({"teacher": "t", "weight": 1.5}, "distill.weight"),
])
def test_bad_distillation_params_say_which_key(tmp_path, distill, message):
    from minbert.core.errors import MinBertError
    from minbert.params import load_params

    params = {"base": {"model": "m"},
              "experiments": {"t": {}, "s": {"finetune": {"tasks": ["sst", "para"], "distill": distill}}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(MinBertError, match=message) as e:
        load_params(path)
    assert "\n" not in str(e.value) and "experiments.s.finetune.distill" in str(e.value)


def test_pretraining_and_head_retraining_ignore_the_students_distillation(tmp_path):
    from minbert.params import load_params
    from minbert.params import resolve as S

    base_ft = {"distill": {"teacher": "t"}, "walk_through": ["para"], "epoch_unit": "sst"}
    params = {"base": {"model": "m", "finetune": base_ft},
              "pretrainings": {"pf": {"kind": "para_first"}},
              "experiments": {"t": {"finetune": {"distill": None}},
                              "s": {"pretrain": "pf", "retrain_heads": {"enabled": True}}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    lp = load_params(path)
    assert lp.experiments["s"].finetune.distill.teacher == "t"
    assert S.pretrain_settings(lp, "pf").finetune.distill is None
    assert S.retrain_settings(lp.experiments["s"]).train.distill is None
    assert S.teachers(lp) == {"t": ["sst", "para", "sts"]}
