"""A frozen, deterministic encoder's embeddings computed once per split (minbert.train.frozen): the same
embeddings as the encoder gives batch by batch, and the same trained heads and metrics as the
uncached path (to float tolerance) for the frozen baseline and head retraining."""
from __future__ import annotations

import pytest
import torch
from test_train import finetune_experiment, make_exp, state_dict, write_prepared

import minbert.train.frozen as frozen
from minbert.core.runtime import autocast
from minbert.data.batches import build_task_data, collate, to_device
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.params import ExperimentParams, HeadsParams
from minbert.params.resolve import retrain_settings
from minbert.train.experiment import retrain_heads_experiment
from minbert.train.training import FitOptions

# compares numbers between two ways of computing them: CI runs it again with the other precision as `auto`
pytestmark = pytest.mark.numbers

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=40, n_dev=24)


def test_stored_embeddings_are_the_encoders(tiny_model_dir, prepared):
    from minbert.data.read import load_splits

    encoder, _, folder = load_encoder(str(tiny_model_dir))
    tok = Tokenizer(folder, 32)
    heads = HeadsParams(para="concat", hybrid=["para"], symmetric_pairs=True, pooling="mean")
    model = MultitaskModel(encoder, heads, ["para"]).eval()
    data = build_task_data("para", load_splits(prepared, "para", ("train",))["train"], tok, heads)
    features = frozen.FrozenFeatures(model, data, tok, CPU, lambda: autocast(CPU, False))
    idx, swap = [3, 17, 0, 8, 31], [False, True, True, False, True]
    with torch.no_grad():
        expected = model.embed(to_device(collate(data, idx, tok, swap), CPU), task="para")
    torch.testing.assert_close(features.rows(idx, swap), expected, rtol=1e-5, atol=1e-6)


def _uncached(monkeypatch):
    monkeypatch.setattr(frozen, "cacheable", lambda *a, **k: False)


def test_frozen_baseline_cached_equals_uncached(tiny_model_dir, prepared, tmp_path, monkeypatch, caplog):
    exp = make_exp(tiny_model_dir, freeze_encoder=True, epochs=2, max_steps_per_epoch=None,
                   heads={"para": "concat", "sts": "cosine", "symmetric_pairs": True})
    with caplog.at_level("INFO", logger="minbert.train.loop"):
        cached = finetune_experiment(exp, prepared, tmp_path / "cached")
    assert any("computed once for sst train" in r.getMessage() for r in caplog.records)
    _uncached(monkeypatch)
    plain = finetune_experiment(exp, prepared, tmp_path / "plain")
    a, b = state_dict(tmp_path / "cached" / "model.pt"), state_dict(tmp_path / "plain" / "model.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert cached.best_epoch == plain.best_epoch
    assert cached.best_dev == pytest.approx(plain.best_dev, abs=1e-4)
    ha, hb = cached.history.drop(columns=["seconds", "examples_per_second"]), \
        plain.history.drop(columns=["seconds", "examples_per_second"])
    num = [c for c in ha.columns if c != "phase"]
    assert ha[num].to_numpy() == pytest.approx(hb[num].to_numpy(), abs=1e-4)


def test_retrain_heads_cached_equals_uncached(tiny_model_dir, prepared, tmp_path, monkeypatch):
    exp = make_exp(tiny_model_dir, epochs=1)
    exp = ExperimentParams.model_validate({**exp.model_dump(), "retrain_heads": {"enabled": True, "epochs": 2}})
    finetune_experiment(exp, prepared, tmp_path / "ft")
    cached = retrain_heads_experiment(retrain_settings(exp), tmp_path / "ft" / "model.pt", prepared, FitOptions(tmp_path / "a"))
    _uncached(monkeypatch)
    plain = retrain_heads_experiment(retrain_settings(exp), tmp_path / "ft" / "model.pt", prepared, FitOptions(tmp_path / "b"))
    a, b = state_dict(tmp_path / "a" / "model.pt"), state_dict(tmp_path / "b" / "model.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert cached.best_dev == pytest.approx(plain.best_dev, abs=1e-4)


def test_nothing_is_stored_where_the_frozen_encoder_is_not_deterministic(tiny_model_dir):
    encoder, _, _ = load_encoder(str(tiny_model_dir))
    model = MultitaskModel(encoder, HeadsParams(extra_layers={"sst": 1}), ["sst", "sts"])
    ft = make_exp(tiny_model_dir, freeze_encoder=True).finetune
    assert frozen.cacheable(model, ft, "sts")
    assert not frozen.cacheable(model, ft, "sst")                                        # a trainable branch
    assert not frozen.cacheable(model, ft.model_copy(update={"frozen_encoder_dropout": True}), "sts")
    assert not frozen.cacheable(model, ft.model_copy(update={"freeze_encoder": False}), "sts")
    assert not frozen.cacheable(model, ft.model_copy(update={"smart": ft.smart.model_copy(update={"enabled": True})}),
                                "sts")


@pytest.mark.parametrize("heads,task", [
    ({"para": "concat", "symmetric_pairs": True, "pooling": "mean"}, "para"),          # bi-encoder, both orders
    ({"para": "cross", "symmetric_pairs": True}, "para"),                               # (a, b) and (b, a) encoded
    ({"sst": "classifier", "extra_layers": {"sst": 1}}, "sst"),                           # through a branch
])
def test_prediction_embeds_each_encoding_once_and_equals_the_batch_by_batch_forward(tiny_model_dir, prepared,
                                                                                    heads, task):
    """predict_task embeds a split's encodings once (in eval mode the encoder is deterministic) and runs
    the heads over both orders of a symmetric pair: the outputs, and the loss batch by batch, equal the
    model's whole forward on each batch of rows in both orders; progress counts every row once."""
    from functools import partial

    from minbert.data.read import load_splits
    from minbert.model.multitask import predict_task
    from minbert.train.losses import task_loss

    torch.manual_seed(0)
    encoder, _, folder = load_encoder(str(tiny_model_dir))
    tok = Tokenizer(folder, 32)
    cfg = HeadsParams(**heads)
    model = MultitaskModel(encoder, cfg, [task]).eval()
    data = build_task_data(task, load_splits(prepared, task, ("dev",))["dev"], tok, cfg)
    assert data.symmetric == (task == "para") and (task in model.branches) == (task == "sst")
    amp = lambda: autocast(CPU, False)  # noqa: E731
    loss = partial(task_loss, task, cfg)
    seen = []
    got = predict_task(model, data, tok, 7, CPU, amp, progress=seen.append, loss=loss)
    assert sum(seen) == len(data) and all(n >= 0 for n in seen)
    order = sorted(range(len(data)), key=lambda i: data.lengths()[i])
    passes = [False, True] if data.symmetric else [False]
    outputs, total = {}, 0.0
    with torch.no_grad():
        for start in range(0, len(order), 7):
            idx = order[start:start + 7]
            outs = []
            for swapped in passes:
                batch = to_device(collate(data, idx, tok, [swapped] * len(idx)), CPU)
                labels = batch.pop("labels", None)
                batch.pop("soft", None)
                out, pair = model(task, batch, return_pair=True)
                outs.append((out.float(), pair))
            mean = sum(o for o, _ in outs) / len(passes)
            total += float(loss(mean, labels, outs[0][1])) * len(idx)
            outputs.update(zip(idx, mean))
    expected = torch.stack([outputs[i] for i in range(len(data))])
    torch.testing.assert_close(got["output"], expected, rtol=1e-4, atol=1e-5)
    assert got["loss"] == pytest.approx(total / len(data), rel=1e-4, abs=1e-6)
