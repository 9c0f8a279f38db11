"""Task heads, the multi-task model's outputs, STS target scaling, the input views, batches,
predictions and checkpoints."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from minbert.core.plain import as_json
from minbert.core.errors import MinBertError
from minbert.core.registry import builtin
from minbert.core.runtime import autocast
from minbert.data.batches import build_task_data, collate
from minbert.data.views import VIEWS, view_of
from minbert.model.checkpoint import load_checkpoint, save_checkpoint
from minbert.model.blocks import SharedBlock
from minbert.model.heads.classifier import ClassifierHead
from minbert.model.heads.cosine import CosineHead
from minbert.model.heads.cosine_linear import CosineLinearHead
from minbert.model.heads.cross import CrossPairHead
from minbert.model.multitask import MultitaskModel, predict_task
from minbert.model.outputs import predictions, regression_prediction, regression_target
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.params import HeadsParams
from minbert.train.losses import task_loss

H = 8
BI_ENCODER_HEADS = tuple(n for n, h in builtin().heads.items() if h.view == "bi")
PAIR_KINDS = ("cross",) + BI_ENCODER_HEADS
STS_TASK = builtin().tasks["sts"]


def bi_head(kind: str, hidden_layers: int = 0):
    """A built-in bi-encoder head of `kind` for sts on H-wide vectors, as the model builds it."""
    return builtin().implementation("head", kind).build(H, STS_TASK, HeadsParams(hidden_layers=hidden_layers,
                                                                                   dropout=0.0))


def test_the_bi_encoder_heads_are_the_builtin_ones():
    assert set(BI_ENCODER_HEADS) == {"concat_uv", "concat", "concat_mult", "concat_cos", "cosine", "cosine_linear"}


@pytest.mark.parametrize("kind", BI_ENCODER_HEADS)
@pytest.mark.parametrize("hidden_layers", [0, 2])
def test_bi_pair_head_shapes_and_gradients(kind, hidden_layers):
    torch.manual_seed(0)
    head = bi_head(kind, hidden_layers)
    u, v = torch.randn(5, H, requires_grad=True), torch.randn(5, H, requires_grad=True)
    out = head(u, v)
    assert out.shape == (5,)
    out.sum().backward()
    assert u.grad is not None and v.grad is not None and u.grad.abs().sum() > 0
    assert all(p.grad is not None for p in head.parameters())


def test_sentiment_and_cross_heads_shapes():
    torch.manual_seed(0)
    emb = torch.randn(4, H, requires_grad=True)
    sst = ClassifierHead(H, 5, 1, 0.0)
    assert sst(emb).shape == (4, 5)
    assert ClassifierHead(H, 1, 0, 0.0)(emb).shape == (4,)          # a binary one-sentence task
    cross = CrossPairHead(H, 1, 0, 0.0)
    out = cross(emb)
    assert out.shape == (4,)
    (out.sum() + sst(emb).sum()).backward()
    assert emb.grad.shape == (4, H)
    shared = SharedBlock(H, [H // 2, 3], "relu", 0.0)
    assert shared(emb).shape == (4, 3) and shared.out_dim == 3


def test_cosine_head_gives_cosine_on_known_vectors():
    head = CosineHead()   # scale 1, bias 0: the plain cosine
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0], [3.0, 4.0], [1.0, 2.0]])
    v = torch.tensor([[1.0, 1.0], [0.0, 2.0], [-3.0, -4.0], [2.0, 4.0]])
    expected = torch.tensor([1 / math.sqrt(2), 0.0, -1.0, 1.0])
    torch.testing.assert_close(head(u, v), expected)
    # the affine map: para starts as 10 cos - 7.5 (cos 0.75 -> logit 0)
    para = CosineHead(init_scale=10.0, init_bias=-7.5)
    torch.testing.assert_close(para(u, v), 10 * expected - 7.5)
    # cosine_linear: the cosine plus a linear term on [u, v, |u-v|]; zero that term to see the cosine
    cl = CosineLinearHead(2, 0, 0.0)
    with torch.no_grad():
        for p in cl.net.parameters():
            p.zero_()
    torch.testing.assert_close(cl(u, v), expected)


def test_concat_heads_read_the_documented_features():
    torch.manual_seed(1)
    u, v = torch.randn(3, H), torch.randn(3, H)
    for kind, feats in (("concat", [u, v, (u - v).abs()]), ("concat_mult", [u, v, (u - v).abs(), u * v]),
                        ("concat_cos", [u, v, F.cosine_similarity(u, v)[:, None]])):
        head = bi_head(kind)
        linear = head.net[-1]
        expected = torch.cat(feats, -1) @ linear.weight.T + linear.bias
        torch.testing.assert_close(head(u, v), expected.squeeze(-1))


@pytest.mark.parametrize("sts_head,target", [("cross", "0_1"), ("cosine", "0_1"), ("cosine", "-1_1"),
                                             ("concat", "-1_1")])
def test_sts_target_prediction_round_trip(sts_head, target):
    heads = HeadsParams(sts=sts_head, cosine_target=target)
    labels = torch.tensor([0.0, 1.2, 2.5, 4.0, 5.0])
    t = regression_target("sts", heads, labels)
    lo = -1.0 if (sts_head == "cosine" and target == "-1_1") else 0.0   # only cosine heads use [-1, 1]
    assert float(t.min()) == pytest.approx(lo) and float(t.max()) == pytest.approx(1.0)
    torch.testing.assert_close(regression_prediction("sts", heads, t), labels)
    # predictions out of range are not clipped: the map onto 0-5 is affine, so it keeps Pearson r
    out = torch.tensor([-1.4, 0.1, 0.5, 0.9, 1.3])
    pred = regression_prediction("sts", heads, out)
    assert float(pred.min()) < 0.0 and float(pred.max()) > 5.0
    truth = np.array([0.0, 1.0, 2.6, 3.9, 4.8])
    assert stats.pearsonr(pred.numpy(), truth)[0] == pytest.approx(stats.pearsonr(out.numpy(), truth)[0], abs=1e-6)


def test_task_losses_match_torch_references():
    heads = HeadsParams(sts="cosine", cosine_target="-1_1", losses={"sts": "mse"})
    logits = torch.randn(4, 5)
    y = torch.tensor([0, 4, 2, 1])
    assert float(task_loss("sst", heads, logits, y)) == pytest.approx(float(F.cross_entropy(logits, y)))
    z = torch.randn(4)
    yb = torch.tensor([1, 0, 0, 1])
    assert float(task_loss("para", heads, z, yb)) == pytest.approx(
        float(-(yb * F.logsigmoid(z) + (1 - yb) * F.logsigmoid(-z)).mean()), rel=1e-5)
    s = torch.tensor([0.0, 2.5, 5.0])
    out = torch.tensor([-0.5, 0.0, 0.5])
    assert float(task_loss("sts", heads, out, s)) == pytest.approx(float(((out - (s / 2.5 - 1)) ** 2).mean()))


def test_predictions_from_outputs():
    p = predictions("sst", HeadsParams(), torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0]]))
    assert p["prediction"].tolist() == [1] and p["probs"].sum() == pytest.approx(1.0)
    p = predictions("para", HeadsParams(), torch.tensor([2.0, -2.0]))
    assert p["prediction"].tolist() == [1, 0] and p["probs"][0] == pytest.approx(1 / (1 + math.exp(-2)))
    p = predictions("sts", HeadsParams(), torch.tensor([0.5, 1.5, -0.23]))
    assert p["prediction"].tolist() == pytest.approx([2.5, 5.0, 0.0])  # the 0-1 target scaled to 0-5, clipped


def test_similarity_scores_are_clipped_to_the_label_range_everywhere_they_are_written():
    """A score outside 0-5 is clipped where the model makes it; an uncalibrated correlation-only head
    (a scale of its own) is not; the evaluation refuses a file whose score lies outside (issue 33, case 9)."""
    from minbert.model.outputs import regression_prediction

    raw = torch.tensor([-0.23, 0.4, 1.002])
    assert predictions("sts", HeadsParams(), raw)["prediction"].tolist() == pytest.approx([0.0, 2.0, 5.0])
    assert regression_prediction("sts", HeadsParams(), raw).tolist() == pytest.approx([-1.15, 2.0, 5.01])
    signed = HeadsParams(sts="cosine", cosine_target="-1_1")
    assert predictions("sts", signed, torch.tensor([-1.2, 1.3]))["prediction"].tolist() == [0.0, 5.0]
    corr = HeadsParams(losses={"sts": "pearson"})      # its head is on a scale of its own: [] until fitted
    assert predictions("sts", corr, raw, [])["prediction"].tolist() == pytest.approx([-1.15, 2.0, 5.01])
    assert predictions("sts", corr, raw, [2.0, 0.0])["prediction"].tolist() == pytest.approx([0.0, 4.0, 5.0])


# ---------------------------------------------------------------- the model on the tiny encoder

SST = pd.DataFrame({"id": ["s1", "s2", "s3"], "sentence": ["a good film .", "bad", "it is neither good nor bad ."],
                    "label": [4, 0, 2]})
STS = pd.DataFrame({"id": ["p1", "p2", "p3"], "sentence1": ["a cat sits .", "dogs run", "hello"],
                    "sentence2": ["a cat is sitting on the mat .", "dogs run fast", "goodbye there"],
                    "label": [4.2, 3.0, 0.4]})
PARA = STS.assign(label=[1, 1, 0])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir, Tokenizer(tiny_model_dir, 32)


def _model(tiny_model_dir, heads: HeadsParams, tasks=("sst", "para", "sts"), seed=0):
    encoder, _, _ = load_encoder(tiny_model_dir)
    torch.manual_seed(seed)
    return MultitaskModel(encoder, heads, list(tasks))


@pytest.mark.parametrize("kind", PAIR_KINDS)
@pytest.mark.parametrize("pooling,shared", [("cls", False), ("mean", True)])
def test_model_outputs_and_backward_for_every_head(tiny, kind, pooling, shared):
    folder, tok = tiny
    heads = HeadsParams(para=kind, sts=kind, pooling=pooling, dropout=0.0,
                        shared={"tasks": ["sst", "para", "sts"], "sizes": [H // 2]} if shared else None)
    model = _model(folder, heads)
    for task, frame, shape in (("sst", SST, (3, 5)), ("para", PARA, (3,)), ("sts", STS, (3,))):
        data = build_task_data(task, frame, tok, heads)
        batch = collate(data, [0, 1, 2], tok)
        labels = batch.pop("labels")
        out = model(task, batch)
        assert out.shape == shape
        model.zero_grad()
        task_loss(task, heads, out, labels).backward()
        assert model.encoder.embeddings.word.weight.grad.abs().sum() > 0
        assert all(p.grad is not None for p in model.heads[task].parameters())


def test_each_task_reads_its_view():
    heads = HeadsParams(para="cross", sts="cosine", hybrid=["sts"])
    assert view_of("sst", heads) is VIEWS["single"] and view_of("cfimdb", heads) is VIEWS["single"]
    assert view_of("para", heads) is VIEWS["cross"] and view_of("sts", heads) is VIEWS["hybrid"]
    assert view_of("sts", HeadsParams(sts="concat")) is VIEWS["bi"]
    assert VIEWS["hybrid"].encodings(symmetric=True) == ("a", "b", "ab", "ba")
    assert VIEWS["bi"].encodings(symmetric=True) == ("a", "b")      # a swap reorders a and b


def test_cfimdb_is_a_binary_one_sentence_task(tiny):
    folder, tok = tiny
    heads = HeadsParams(dropout=0.0)
    model = _model(folder, heads, tasks=("cfimdb", "sts"))
    frame = SST.assign(label=[1, 0, 1])
    data = build_task_data("cfimdb", frame, tok, heads)
    batch = collate(data, [0, 1, 2], tok)
    labels = batch.pop("labels")
    out = model("cfimdb", batch)
    assert out.shape == (3,) and labels.dtype == torch.int64
    torch.testing.assert_close(task_loss("cfimdb", heads, out, labels),
                               F.binary_cross_entropy_with_logits(out, labels.float()))
    p = predictions("cfimdb", heads, out)
    assert set(p) == {"prediction", "probs"} and p["probs"].shape == (3,)


def test_bi_encoder_batch_stacks_first_then_second_sentences(tiny):
    folder, tok = tiny
    heads = HeadsParams(sts="concat", para="cross")
    bi = build_task_data("sts", STS, tok, heads)
    batch = collate(bi, [2, 0], tok)
    assert batch["input_ids"].shape[0] == 4
    single = tok(["hello", "a cat sits .", "goodbye there", "a cat is sitting on the mat ."])
    T = single["input_ids"].shape[1]
    torch.testing.assert_close(batch["input_ids"][:, :T], single["input_ids"])
    assert batch["labels"].tolist() == pytest.approx([0.4, 4.2])
    cross = build_task_data("para", PARA, tok, heads)
    cb = collate(cross, [0], tok)
    assert cb["input_ids"].shape[0] == 1 and cb["token_type_ids"].max() == 1   # "[CLS] a [SEP] b [SEP]"


def test_predict_task_returns_input_order_and_matches_single_examples(tiny):
    folder, tok = tiny
    heads = HeadsParams(sts="cosine", dropout=0.0)
    model = _model(folder, heads).eval()
    data = build_task_data("sts", STS, tok, heads)
    res = predict_task(model, data, tok, 2, torch.device("cpu"), lambda: autocast(torch.device("cpu"), False))
    for i in range(len(STS)):
        with torch.no_grad():
            one = model("sts", {k: v for k, v in collate(data, [i], tok).items() if k != "labels"})
        assert res["prediction"][i] == pytest.approx(float(regression_prediction("sts", heads, one)[0]), abs=1e-5)
    assert res["output"].shape == (len(STS),)   # the head's outputs, in input order (the dev loss reads them)


def test_checkpoint_round_trip_gives_identical_predictions(tiny, tmp_path):
    folder, tok = tiny
    heads = HeadsParams(para="concat_cos", sts="cosine_linear", shared={}, hidden_layers=1)
    model = _model(folder, heads, seed=4).eval()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, tok, epoch=2, dev_metrics={"sst_acc": 0.5})
    loaded, tok2, ckpt = load_checkpoint(path)
    assert ckpt["epoch"] == 2 and ckpt["dev_metrics"] == {"sst_acc": 0.5} and loaded.tasks == model.tasks
    assert as_json(loaded.heads_cfg) == as_json(heads) and tok2.max_length == 32
    assert tok2.encode(["Tokenise me, please!"]) == tok.encode(["Tokenise me, please!"])
    cpu = torch.device("cpu")
    for task, frame in (("sst", SST), ("para", PARA), ("sts", STS)):
        a = predict_task(model, build_task_data(task, frame, tok, heads), tok, 8, cpu, lambda: autocast(cpu, False))
        b = predict_task(loaded, build_task_data(task, frame, tok2, heads), tok2, 8, cpu, lambda: autocast(cpu, False))
        np.testing.assert_array_equal(a["prediction"], b["prediction"])
        if "probs" in a:
            np.testing.assert_array_equal(a["probs"], b["probs"])


def test_reset_heads_reinitialises_heads_only(tiny):
    folder, _ = tiny
    model = _model(folder, HeadsParams(shared={}))
    enc_before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    with torch.no_grad():
        for p in list(model.heads.parameters()) + list(model.shared.parameters()):
            p.fill_(0.123)
    model.reset_heads()
    assert all(torch.equal(v, model.encoder.state_dict()[k]) for k, v in enc_before.items())
    w = model.heads["sst"].net[-1].weight.detach()
    assert not torch.all(w == 0.123) and 0.005 < float(w.std()) < 0.05   # std-0.02 initialisation
    assert not torch.all(model.shared.net[0].weight == 0.123)


def test_load_checkpoint_errors(tmp_path):
    with pytest.raises(MinBertError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a checkpoint at all")
    with pytest.raises(MinBertError, match="garbage.pt: not a readable checkpoint"):
        load_checkpoint(garbage)
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(MinBertError, match="not a minbert multi-task checkpoint"):
        load_checkpoint(other)


# ---------------------------------------------------------------- symmetric pairs

@pytest.mark.parametrize("kind", ["cross", "concat"])
def test_symmetric_pairs_read_both_orders(tiny, kind):
    folder, tok = tiny
    sym = HeadsParams(para=kind, sts=kind, symmetric_pairs=True, dropout=0.0)
    plain = sym.model_copy(update={"symmetric_pairs": False})
    data = build_task_data("sts", STS, tok, sym)
    flipped = STS.rename(columns={"sentence1": "sentence2", "sentence2": "sentence1"})
    reference = build_task_data("sts", flipped, tok, plain)     # (b, a) built from scratch
    forward = build_task_data("sts", STS, tok, plain)
    # a swapped pair is exactly the encoding of (b, a); an unswapped one that of (a, b)
    mixed = collate(data, [0, 1, 2], tok, [True, False, True])
    for k, ref in ((0, reference), (1, forward), (2, reference)):
        one = collate(ref, [k], tok)
        rows = [k, k + 3] if kind == "concat" else [k]      # bi-encoders stack the a's, then the b's
        for r, row in enumerate(rows):
            n = int(one["attention_mask"][r].sum())
            assert int(mixed["attention_mask"][row].sum()) == n
            for key in ("input_ids", "token_type_ids"):
                assert mixed[key][row, :n].tolist() == one[key][r, :n].tolist(), (k, key)
    # prediction: the mean of the outputs for (a, b) and (b, a)
    model = _model(folder, sym).eval()
    cpu = torch.device("cpu")
    both = predict_task(model, data, tok, 2, cpu, lambda: autocast(cpu, False))

    def raw(d):
        with torch.no_grad():
            return model("sts", {k: v for k, v in collate(d, [0, 1, 2], tok).items() if k != "labels"})

    ab, ba = raw(forward), raw(reference)
    assert not torch.allclose(ab, ba)                          # the order matters to these heads
    expected = regression_prediction("sts", plain, (ab + ba) / 2).clamp(0, 5)    # scores clipped to the range
    np.testing.assert_allclose(both["prediction"], expected.numpy(), atol=1e-5)
    # the dev loss (minbert.train.evaluation.dev_metrics) is the task loss of these averaged outputs
    torch.testing.assert_close(both["output"], ((ab + ba) / 2).float())
    assert float(task_loss("sts", plain, both["output"], torch.tensor(STS.label.values))) == pytest.approx(
        float(task_loss("sts", plain, (ab + ba) / 2, torch.tensor(STS.label.values))),
                                         rel=1e-5)
    # sentences are never swapped for single-sentence tasks
    assert not build_task_data("sst", SST, tok, sym).symmetric


# ---------------------------------------------------------------- hybrid pair heads

@pytest.mark.parametrize("kind", ["concat_mult", "cosine"])
def test_hybrid_head_is_bi_encoder_head_plus_cross_encoder_term(tiny, kind):
    folder, tok = tiny
    heads = HeadsParams(para=kind, sts=kind, hybrid=["para", "sts"], pooling="mean", dropout=0.0)
    model = _model(folder, heads, seed=3).eval()
    bi_only = HeadsParams(para=kind, sts=kind, pooling="mean", dropout=0.0)
    cross_only = HeadsParams(para="cross", sts="cross", pooling="mean", dropout=0.0)
    for task, frame in (("para", PARA), ("sts", STS)):
        data = build_task_data(task, frame, tok, heads)
        batch = collate(data, [2, 0, 1], tok)
        assert batch["input_ids"].shape[0] == 9                  # a's, b's, then the cross-encoded pairs
        with torch.no_grad():
            out = model(task, {k: v for k, v in batch.items() if k != "labels"})
            # the same pairs embedded independently: each sentence alone, and the pair read as one
            single = collate(build_task_data(task, frame, tok, bi_only), [2, 0, 1], tok)
            u, v = model.embed(single).chunk(2, 0)
            c = model.embed(collate(build_task_data(task, frame, tok, cross_only), [2, 0, 1], tok))
            expected = model.heads[task].bi(u, v) + model.heads[task].cross(c)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out, model.heads[task].bi(u, v))   # the cross term is there
        model.train()
        model.zero_grad()
        loss = task_loss(task, heads, model(task, {k: v for k, v in batch.items() if k != "labels"}), batch["labels"])
        loss.backward()
        assert all(p.grad is not None for p in model.heads[task].parameters())
        model.eval()


def test_hybrid_symmetric_pairs_swap_all_three_views(tiny):
    folder, tok = tiny
    heads = HeadsParams(para="concat", sts="concat", hybrid=["sts"], symmetric_pairs=True, dropout=0.0)
    data = build_task_data("sts", STS, tok, heads)
    flipped = STS.rename(columns={"sentence1": "sentence2", "sentence2": "sentence1"})
    reference = build_task_data("sts", flipped, tok, heads.model_copy(update={"symmetric_pairs": False}))
    mixed = collate(data, [0, 1], tok, [True, False])
    swapped, plain = collate(reference, [0], tok), collate(data, [1], tok)
    for rows, one in (([0, 2, 4], swapped), ([1, 3, 5], plain)):   # (a, b, cross) rows of each pair
        for r, row in enumerate(rows):
            n = int(one["attention_mask"][r].sum())
            assert int(mixed["attention_mask"][row].sum()) == n
            assert mixed["input_ids"][row, :n].tolist() == one["input_ids"][r, :n].tolist()
            assert mixed["token_type_ids"][row, :n].tolist() == one["token_type_ids"][r, :n].tolist()
    assert build_task_data("para", PARA, tok, heads).view is VIEWS["bi"]        # only the listed tasks
    assert "ab" not in build_task_data("para", PARA, tok, heads).enc


def test_hybrid_needs_a_bi_encoder_head():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="hybrid lists sts, whose head 'cross' is no bi-encoder head"):
        HeadsParams(sts="cross", hybrid=["sts"])
    with pytest.raises(ValidationError, match="twice"):
        HeadsParams(sts="cosine", hybrid=["sts", "sts"])


def test_shared_layer_widths_follow_the_encoder(tiny_model_dir):
    """A catalogue writes a shared layer's width as the encoder's (`encoder`) or a share of it
    (`encoder/2`: 000's 768 -> 384 on bert-base), so its heads fit MiniLM's 384 as well as bert-base's 768."""
    from minbert.core.errors import MinBertError
    from minbert.params import ExperimentParams
    from minbert.model.blocks import shared_widths

    assert shared_widths([], 384) == [384] and shared_widths(["encoder/2"], 768) == [384]
    assert shared_widths(["encoder", 5, "encoder/3"], 384) == [384, 5, 128]
    model = _model(tiny_model_dir, HeadsParams(shared={"sizes": ["encoder", "encoder/2"], "activation": "relu"}))
    width = model.encoder.config.hidden_size
    assert [layer.out_features for layer in model.shared.modules() if isinstance(layer, torch.nn.Linear)] == \
        [width, width // 2]
    with pytest.raises(MinBertError) as e:
        from minbert.params import validate_params
        validate_params({"experiments": {"a": {"finetune": {"heads": {"shared": {"sizes": ["encoder/0"]}}}}}})
    assert "finetune.heads.shared.sizes" in str(e.value) and "\n" not in str(e.value)
    assert ExperimentParams.model_validate({"finetune": {"heads": {"shared": {"sizes": ["encoder/2"]}}}})
