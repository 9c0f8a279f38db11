"""What the papers' studies need beyond plain multi-task training, each checked on the tiny BERT:
the [u, v] head, the plain cosine, per-task head depth and pooling, shared dense layers, 003's
FREEZE_SST branch (extra transformer layers trained over a frozen model) and SST_TO_STS
prototypes, 002's walk through Quora across epochs, the correlation-trained STS head's
calibration, hidden vs attention dropout, SMART's momentum copy without dropout, and MLM's best epoch."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from test_heads import PARA, SST, STS
from test_train import finetune_experiment, make_exp, prepared, restore_threads, state_dict, write_prepared  # noqa: F401  (fixtures)

import minbert.data.batches as batches
import minbert.train.objectives as objectives
from minbert.data.batches import build_task_data, collate
from minbert.model.checkpoint import load_checkpoint
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.params import ExperimentParams, HeadsParams
from minbert.params.resolve import finetune_settings, retrain_settings
from minbert.train.experiment import retrain_heads_experiment, with_dropout
from minbert.train.training import FitOptions

# compares numbers between two ways of computing them: CI runs it again with the other precision as `auto`
pytestmark = pytest.mark.numbers

H = 32


@pytest.fixture(scope="module")
def every_label(tmp_path_factory):
    """Enough training rows that every SST label occurs (the prototypes head needs them all)."""
    return write_prepared(tmp_path_factory.mktemp("data200"), n_train=200, n_dev=32)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer(tiny_model_dir, 32)


def model_with(tiny_model_dir, heads: HeadsParams, tasks=("sst", "para", "sts"), seed=0):
    encoder, _, _ = load_encoder(tiny_model_dir)
    torch.manual_seed(seed)
    return MultitaskModel(encoder, heads, list(tasks))


def inputs(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


# ---------------------------------------------------------------- heads

def test_concat_uv_reads_u_and_v_and_a_plain_cosine_has_no_parameters(tiny_model_dir, tok):
    model = model_with(tiny_model_dir, HeadsParams(para="concat_uv", sts="cosine", cosine_affine=False, dropout=0.0))
    head = model.heads["para"]
    assert head.net[-1].in_features == 2 * H
    sts = model.heads["sts"]
    assert not list(sts.parameters())                     # the plain cosine: nothing to learn
    model.eval()
    with torch.no_grad():
        batch = collate(build_task_data("sts", STS, tok, model.heads_cfg), [0, 1, 2], tok)
        u, v = model.embed(inputs(batch)).chunk(2, 0)
        torch.testing.assert_close(model("sts", inputs(batch)), F.cosine_similarity(u, v))
        pb = collate(build_task_data("para", PARA, tok, model.heads_cfg), [0, 1], tok)
        u, v = model.embed(inputs(pb)).chunk(2, 0)
        lin = head.net[-1]
        torch.testing.assert_close(model("para", inputs(pb)), (torch.cat([u, v], -1) @ lin.weight.T + lin.bias)[:, 0])


def test_per_task_depth_pooling_and_shared_layers(tiny_model_dir, tok):
    heads = HeadsParams(para="concat_uv", sts="cosine", hidden_layers={"para": 1}, task_pooling={"sts": "mean"},
                        shared={"tasks": ["sts"], "sizes": [16, 8], "activation": "relu"}, dropout=0.0)
    model = model_with(tiny_model_dir, heads).eval()
    linears = [m for m in model.heads["para"].net if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 and len([m for m in model.heads["sst"].net if isinstance(m, torch.nn.Linear)]) == 1
    assert model.shared.out_dim == 8
    with torch.no_grad():
        batch = inputs(collate(build_task_data("sts", STS, tok, heads), [0, 1, 2], tok))
        hidden = model.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[0]
        mean = (hidden * batch["attention_mask"][..., None]).sum(1) / batch["attention_mask"].sum(1, keepdim=True)
        u, v = model.shared(mean).chunk(2, 0)                # STS: mean-pooled, through the shared layers
        torch.testing.assert_close(model("sts", batch), F.cosine_similarity(u, v) * model.heads["sts"].scale
                                   + model.heads["sts"].bias)
        sst = inputs(collate(build_task_data("sst", SST, tok, heads), [0, 1], tok))
        cls = model.encoder(sst["input_ids"], sst["attention_mask"], sst["token_type_ids"])[0][:, 0]
        torch.testing.assert_close(model("sst", sst), model.heads["sst"](cls))     # SST: [CLS], not shared


def test_an_extra_layers_branch_starts_as_copies_of_the_top_layers(tiny_model_dir, tok):
    model = model_with(tiny_model_dir, HeadsParams(extra_layers={"sst": 1}, dropout=0.0))
    branch = model.branches["sst"].layers[0]
    top = model.encoder.layers[-1]
    assert all(torch.equal(a, b) for a, b in zip(branch.state_dict().values(), top.state_dict().values()))
    assert branch is not top and branch.attn.qkv.weight.data_ptr() != top.attn.qkv.weight.data_ptr()
    model.eval()
    with torch.no_grad():
        batch = inputs(collate(build_task_data("sst", SST, tok, model.heads_cfg), [0, 1, 2], tok))
        hidden = model.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[0]
        expected = model.heads["sst"](model.branches["sst"](hidden, batch["attention_mask"])[:, 0])
        torch.testing.assert_close(model("sst", batch), expected)


# ---------------------------------------------------------------- 003's two-stage models

def two_stage_exp(tiny_model_dir, **heads) -> ExperimentParams:
    exp = make_exp(tiny_model_dir, epochs=1, tasks=["para", "sts"],
                   heads={"para": "concat", "sts": "cosine", "cosine_affine": False, **heads})
    return ExperimentParams.model_validate({**exp.model_dump(), "retrain_heads": {
        "enabled": True, "tasks": ["sst"], "schedule": "task_by_task", "epochs": 1, "batch_size": 8, "lr": 1e-3}})


@pytest.mark.parametrize("sst_head", ["extra_layers", "prototypes"])
def test_freeze_sst_trains_only_the_sst_branch_over_the_para_sts_model(tiny_model_dir, every_label, tmp_path,
                                                                       sst_head):
    prepared = every_label
    heads = {"extra_layers": {"sst": 1}} if sst_head == "extra_layers" else {"sst": "prototypes",
                                                                            "prototypes_per_label": 3}
    exp = two_stage_exp(tiny_model_dir, **heads)
    finetune_experiment(finetune_settings(exp), prepared, tmp_path / "ft")
    first = state_dict(tmp_path / "ft" / "model.pt")
    assert not any(k.startswith(("heads.sst", "branches.sst")) for k in first)        # stage 1: para, sts only
    retrain_heads_experiment(retrain_settings(exp), tmp_path / "ft" / "model.pt", prepared, FitOptions(tmp_path / "rh"))
    model, _, ckpt = load_checkpoint(tmp_path / "rh" / "model.pt")
    second = ckpt["state_dict"]
    assert model.tasks == ["para", "sts", "sst"]
    # everything of stage 1 is kept as it was: the encoder and the Para and STS heads
    assert all(torch.equal(first[k], second[k]) for k in first), [k for k in first if not torch.equal(first[k], second[k])]
    assert any(k.startswith("heads.sst") for k in second)
    if sst_head == "extra_layers":
        top, br = "encoder.layers.1.", "branches.sst.layers.0."
        enc_top = {k[len(top):]: v for k, v in first.items() if k.startswith(top)}
        branch = {k[len(br):]: v for k, v in second.items() if k.startswith(br)}
        assert branch and any(not torch.equal(branch[k], enc_top[k]) for k in branch)   # the branch trained
    else:
        head = model.heads["sst"]
        assert bool(head.ready) and head.prototypes.shape == (15, H)
        assert sorted(head.labels.tolist()) == sorted([float(c) for c in range(5) for _ in range(3)])
        torch.testing.assert_close(head.prototypes.norm(dim=-1), torch.ones(15))
    dev = pd.read_csv(tmp_path / "rh" / "history.csv")
    assert "dev_sst_acc" in dev.columns and "dev_para_acc" not in dev.columns


# ---------------------------------------------------------------- 002's walk through Quora

def test_a_walked_task_continues_across_epochs_instead_of_restarting(tiny_model_dir, prepared, tmp_path, monkeypatch):
    seen: dict[str, list] = {"para": [], "sts": []}
    original = batches.collate

    def spy(data, indices, tokenizer, swap=None, fixed_shapes=False):
        if data.task in seen:
            seen[data.task].append(list(indices))
        return original(data, indices, tokenizer, swap, fixed_shapes)

    monkeypatch.setattr(batches, "collate", spy)
    # sst (8 rows) is the epoch: 2 updates per epoch; para (32 rows: 4 batches) is walked through
    exp = make_exp(tiny_model_dir, schedule="simultaneous", epoch_unit="sst", walk_through=["para"], epochs=4,
                   max_steps_per_epoch=None, downsample={"mode": "fixed", "size": 32, "caps": {"sst": 16}})
    finetune_experiment(finetune_settings(exp), prepared, tmp_path / "run")
    para = seen["para"]
    assert len(para) == 8                                     # 4 epochs x 2 updates
    first_pass, second_pass = para[:4], para[4:]
    # one pass over all of para spans epochs 1-2, the next pass epochs 3-4: no row twice in a pass
    assert sorted(i for b in first_pass for i in b) == list(range(32))
    assert sorted(i for b in second_pass for i in b) == list(range(32))
    assert first_pass != second_pass                          # reshuffled between passes
    # sts (not walked) restarts each epoch: its first batch of each epoch is a fresh draw of the epoch
    sts_first = [seen["sts"][2 * e] for e in range(4)]
    assert len({tuple(b) for b in sts_first}) > 1


# ---------------------------------------------------------------- the correlation-trained STS head

def test_a_correlation_trained_head_is_calibrated_not_clipped(tiny_model_dir, prepared, tmp_path):
    exp = make_exp(tiny_model_dir, epochs=1, tasks=["sts"], heads={"sts": "concat", "losses": {"sts": "pearson"}})
    finetune_experiment(finetune_settings(exp), prepared, tmp_path / "run")
    model, tok, ckpt = load_checkpoint(tmp_path / "run" / "model.pt")
    scale, shift = ckpt["calibration"]["sts"]
    # the fit: the model's predictions on the training data regressed on the labels, as the run made
    # them (its precision: bf16 where the CPU has it natively, and its evaluation batches: bf16
    # outputs depend on the batch a row is in)
    from minbert.core.runtime import autocast, precision_on
    from minbert.data.downsample import downsample
    from minbert.data.read import read_split
    from minbert.model.multitask import predict_task
    from minbert.train.evaluation import EVAL_BATCH_SIZE

    frame = downsample({"sts": read_split(prepared / "sts-train.tsv")}, exp.finetune.downsample, exp.seed)["sts"]
    data = build_task_data("sts", frame, tok, model.heads_cfg)
    cpu = torch.device("cpu")
    bf16 = precision_on(exp.precision, cpu) == "bf16"
    res = predict_task(model, data, tok, EVAL_BATCH_SIZE, cpu, lambda: autocast(cpu, bf16))
    raw = res["output"].numpy().astype(np.float64) * 5.0     # the head's scale, 0-1 -> 0-5, unclipped
    assert raw.std() > 1e-3
    # float32 computes scale * raw + shift: its rounding is of the terms, which cancel where the fit is steep
    rounding = 4 * np.finfo(np.float32).eps * (abs(scale) * np.abs(raw) + abs(shift))
    np.testing.assert_allclose(res["prediction"], raw * scale + shift, rtol=0, atol=float(rounding.max()))
    a, b = np.polyfit(raw, data.labels, 1)
    assert (scale, shift) == pytest.approx((a, b), rel=1e-4, abs=1e-5)
    # no clipping: the predictions correlate with the labels as the outputs do (an affine map; a fit
    # with a negative slope turns the sign, as fitted on the training labels)
    assert np.corrcoef(res["prediction"], data.labels)[0, 1] == pytest.approx(
        np.sign(scale) * np.corrcoef(raw, data.labels)[0, 1], rel=1e-4)


# ---------------------------------------------------------------- dropout, SMART's momentum copy, MLM's best epoch

def test_hidden_and_attention_dropout_are_set_separately(tiny_model_dir):
    encoder, _, _ = load_encoder(tiny_model_dir)
    with_dropout(encoder, 0.3, None)
    assert encoder.config.hidden_dropout_prob == 0.3 and encoder.layers[0].dropout.p == 0.3
    assert encoder.layers[0].attn.attn_dropout == 0.1                   # the checkpoint's
    with_dropout(encoder, None, 0.2)
    assert encoder.layers[0].attn.attn_dropout == 0.2 and encoder.layers[0].dropout.p == 0.3


def test_the_momentum_copy_runs_without_dropout(tiny_model_dir, prepared, tmp_path, monkeypatch):
    import minbert.train.loop as loop

    modes = []
    original = objectives.bregman_term

    def spy(student, teacher_out, kind):
        modes.append(teacher_out.requires_grad)
        return original(student, teacher_out, kind)

    real_teacher = loop.MomentumModel      # the loop's name for it: the class it builds

    class Recording(real_teacher):
        def update(self, model):
            modes.append(("teacher training", self.module.training))
            return super().update(model)

    monkeypatch.setattr(objectives, "bregman_term", spy)
    monkeypatch.setattr(loop, "MomentumModel", Recording)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=2, smart={"enabled": True, "lambda_s": 0.0, "mu": 1.0})
    finetune_experiment(finetune_settings(exp), prepared, tmp_path / "run")
    assert ("teacher training", False) in modes and ("teacher training", True) not in modes


def test_mlm_keeps_the_epoch_with_the_best_dev_loss(tiny_model_dir, monkeypatch):
    import minbert.train.pretrain as pretrain
    from minbert.params import PretrainParams
    from minbert.params.settings import PretrainSettings

    snapshots, losses = [], iter([5.0, 3.0, 4.0])          # before training, after epoch 1, after epoch 2

    def fake_evaluate(objective, runtime, batch_size):
        snapshots.append({k: v.clone() for k, v in objective.encoder.state_dict().items()})
        return next(losses)

    monkeypatch.setattr(pretrain, "mean_dev_loss", fake_evaluate)
    encoder, _, folder = load_encoder(tiny_model_dir)
    tok = Tokenizer(folder, 32)
    texts = tok.encode([f"sentence number {i} about a film" for i in range(16)])
    from minbert.core.runtime import Runtime
    from minbert.train.mlm import MlmObjective, build_mlm_head

    head, _ = build_mlm_head(encoder, None)
    objective = MlmObjective(encoder, head, tok, texts, texts[:4], 0.15, 1)
    pp = PretrainParams(kind="mlm", epochs=2, batch_size=8, lr=1e-2, warmup_ratio=0.0)
    s = PretrainSettings(model=str(tiny_model_dir), seed=1, max_length=32, pretraining=pp, device="cpu")
    history, before = pretrain.train(objective, pp, s, Runtime(torch.device("cpu"), bf16=False), "mlm")
    assert before == 5.0 and [r["dev_loss"] for r in history] == [3.0, 4.0]
    after_epoch1 = snapshots[1]
    assert all(torch.equal(encoder.state_dict()[k], after_epoch1[k]) for k in after_epoch1)
    assert not all(torch.equal(snapshots[2][k], after_epoch1[k]) for k in after_epoch1)     # epoch 2 moved on
    assert pretrain._loss_summary(history, before)["best_epoch"] == 1
