"""The minBERT encoder against transformers.BertModel on the same weights, plus its own features:
bf16 autocast, gradient checkpointing, freezing, inputs_embeds, mean pooling."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from minbert.model.bert import BertConfig, BertModel, mean_pool
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder, save_hf_folder

transformers = pytest.importorskip("transformers")


def _real_batch(shared_data, tok, n=16):
    """A padded batch of real SST sentences and STS pairs (lengths vary, so padding matters)."""
    sst = pd.read_csv(shared_data / "cs224n" / "ids-sst-dev.csv", sep="\t", index_col=0)
    sts = pd.read_csv(shared_data / "cs224n" / "sts-dev.csv", sep="\t", index_col=0)
    singles = tok.encode(sst["sentence"].head(n // 2).tolist())
    pairs = tok.encode(sts["sentence1"].head(n // 2).tolist(), sts["sentence2"].head(n // 2).tolist())
    return tok.pad(singles + pairs)


@pytest.fixture(scope="module")
def minilm_pair(minilm_dir):
    """Our encoder and transformers' BertModel on the packaged MiniLM weights, both in eval mode."""
    ours, _, _ = load_encoder(minilm_dir)
    ref = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager")
    return ours.eval(), ref.eval()


@pytest.fixture(scope="module")
def batch(shared_data, minilm_dir):
    return _real_batch(shared_data, Tokenizer(minilm_dir, max_length=64))


def test_matches_transformers_on_padded_real_batch(minilm_pair, batch):
    ours, ref = minilm_pair
    assert batch["attention_mask"].float().mean() < 0.9, "the batch should contain padding"
    assert batch["token_type_ids"].any(), "the batch should contain sentence pairs"
    with torch.no_grad():
        hidden, pooled = ours(**batch)
        out = ref(**batch)
    mask = batch["attention_mask"].bool()
    # padded positions carry no meaning (and HF's eager mask leaks a tiny bit into them)
    torch.testing.assert_close(hidden[mask], out.last_hidden_state[mask], atol=1e-4, rtol=0)
    torch.testing.assert_close(pooled, out.pooler_output, atol=1e-4, rtol=0)


def test_padding_does_not_change_real_positions(minilm_pair, minilm_dir):
    ours, _ = minilm_pair
    tok = Tokenizer(minilm_dir, max_length=64)
    short, long = "a short one", "a much longer sentence that forces the short one to be padded a lot"
    alone = tok([short])
    together = tok([short, long])
    n = alone["input_ids"].shape[1]
    with torch.no_grad():
        h1, p1 = ours(**alone)
        h2, p2 = ours(**together)
    torch.testing.assert_close(h1[0], h2[0, :n], atol=1e-5, rtol=0)
    torch.testing.assert_close(p1[0], p2[0], atol=1e-5, rtol=0)


def test_no_mask_equals_all_ones_mask(minilm_pair, batch):
    ours, _ = minilm_pair
    ids = batch["input_ids"][:3, :8]  # first 8 tokens of rows long enough: no padding there
    with torch.no_grad():
        a = ours(input_ids=ids)
        b = ours(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])


def test_inputs_embeds_and_return_embeddings(minilm_pair, batch):
    ours, _ = minilm_pair
    with torch.no_grad():
        hidden, pooled, emb = ours(**batch, return_embeddings=True)
        again = ours(inputs_embeds=emb, attention_mask=batch["attention_mask"],
                     token_type_ids=batch["token_type_ids"])
    torch.testing.assert_close(emb, ours.embeddings.word(batch["input_ids"]))
    torch.testing.assert_close(again[0], hidden)
    torch.testing.assert_close(again[1], pooled)


def test_bf16_autocast_close_to_fp32(minilm_pair, batch):
    ours, _ = minilm_pair
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        h32, p32 = ours(**batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h16, p16 = ours(**batch)
    assert h16.dtype in (torch.bfloat16, torch.float32)
    cos = torch.nn.functional.cosine_similarity(h16.float()[mask], h32[mask], dim=-1)
    assert cos.min() > 0.99, cos.min()
    assert (p16.float() - p32).abs().max() < 0.1


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]))


def _tiny(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64,
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertModel(cfg)


def _grads(model, ids, mask, seed):
    model.zero_grad()
    torch.manual_seed(seed)
    hidden, pooled = model(input_ids=ids, attention_mask=mask)
    (hidden.pow(2).mean() + pooled.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_gives_same_gradients():
    model = _tiny().train()  # dropout on: checkpointing must replay the same dropout masks
    ids = torch.randint(1, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    plain = _grads(model, ids, mask, seed=1)
    model.gradient_checkpointing = True
    ckpt = _grads(model, ids, mask, seed=1)
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_freeze_leaves_no_trainable_parameter():
    model = _tiny()
    model.freeze()
    assert not any(p.requires_grad for p in model.parameters())
    head = torch.nn.Linear(32, 2)
    ids = torch.randint(1, 100, (2, 5))
    head(model(input_ids=ids)[1]).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    assert head.weight.grad is not None
    model.freeze(False)
    assert all(p.requires_grad for p in model.parameters())


def test_save_hf_folder_round_trip_in_transformers(tmp_path, minilm_dir):
    model = _tiny(dropout=0.0).eval()
    model.config.vocab_size = 100
    save_hf_folder(tmp_path, model, tokenizer_folder=minilm_dir)
    assert (tmp_path / "vocab.txt").is_file() and (tmp_path / "tokenizer.json").is_file()
    ref = transformers.BertModel.from_pretrained(str(tmp_path)).eval()
    again, mlm, folder = load_encoder(tmp_path)
    ids = torch.randint(1, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    tt = torch.zeros_like(ids)
    tt[2, 4:] = 1
    with torch.no_grad():
        h, p = model(input_ids=ids, attention_mask=mask, token_type_ids=tt)
        out = ref(input_ids=ids, attention_mask=mask, token_type_ids=tt)
        h2, p2 = again.eval()(input_ids=ids, attention_mask=mask, token_type_ids=tt)
    m = mask.bool()
    torch.testing.assert_close(h[m], out.last_hidden_state[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(p, out.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(h2, h)
    torch.testing.assert_close(p2, p)
    assert mlm == {} and folder == tmp_path
