"""BERT masking proportions on real text, the tied MLM head, and its parity with transformers."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from minbert.model.bert import BertConfig, BertModel
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder, save_hf_folder
from minbert.train.mlm import IGNORE, build_mlm_head, mask_tokens


def _real_sentences(shared_data) -> list[str]:
    cs = shared_data / "cs224n"
    sst = pd.read_csv(cs / "ids-sst-train.csv", sep="\t", index_col=0)["sentence"]
    quora = pd.read_csv(cs / "quora-train.csv", sep="\t", index_col=0)["sentence1"].head(4000)
    return sst.astype(str).tolist() + quora.astype(str).tolist()


def _mask_corpus(tok: Tokenizer, sentences: list[str], seed: int, batch_size: int = 256):
    """Mask the corpus batch by batch; returns flat (original, masked, labels, attention) tensors."""
    g = torch.Generator().manual_seed(seed)
    out = {"orig": [], "ids": [], "labels": [], "attn": []}
    for i in range(0, len(sentences), batch_size):
        batch = tok(sentences[i:i + batch_size])
        ids, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], tok.special_ids,
                                  tok.mask_id, tok.vocab_size, 0.15, generator=g)
        out["orig"].append(batch["input_ids"].flatten())
        out["ids"].append(ids.flatten())
        out["labels"].append(labels.flatten())
        out["attn"].append(batch["attention_mask"].flatten())
    return {k: torch.cat(v) for k, v in out.items()}


def test_masking_proportions_on_real_text(shared_data, minilm_dir):
    tok = Tokenizer(minilm_dir, max_length=128)
    m = _mask_corpus(tok, _real_sentences(shared_data), seed=0)
    special = torch.isin(m["orig"], torch.tensor(tok.special_ids))
    padding = m["attn"] == 0
    eligible = ~special & ~padding
    chosen = m["labels"] != IGNORE
    assert int(eligible.sum()) >= 100_000
    assert padding.any() and special[~padding].any()

    # special tokens and padding are never chosen, never altered
    assert not chosen[special | padding].any()
    assert torch.equal(m["ids"][special | padding], m["orig"][special | padding])
    # labels are the original tokens
    assert torch.equal(m["labels"][chosen], m["orig"][chosen])

    rate = chosen.sum().item() / eligible.sum().item()
    assert abs(rate - 0.15) < 0.01, rate
    n = chosen.sum().item()
    to_mask = (m["ids"][chosen] == tok.mask_id).sum().item() / n
    unchanged = (m["ids"][chosen] == m["orig"][chosen]).sum().item() / n
    random_tok = 1.0 - to_mask - unchanged
    assert abs(to_mask - 0.80) < 0.01, to_mask
    assert abs(unchanged - 0.10) < 0.01, unchanged
    assert abs(random_tok - 0.10) < 0.01, random_tok
    # random replacements are real word pieces, never special tokens
    replaced = m["ids"][chosen][(m["ids"][chosen] != tok.mask_id) & (m["ids"][chosen] != m["orig"][chosen])]
    assert not torch.isin(replaced, torch.tensor(tok.special_ids)).any()
    assert replaced.unique().numel() > 0.5 * replaced.numel()  # spread over the vocabulary


def test_masking_is_seeded_and_never_chooses_specials_alone():
    ids = torch.tensor([[101, 5, 6, 7, 102, 0, 0], [101, 8, 102, 9, 10, 102, 0]])
    attn = (ids != 0).long()
    a = mask_tokens(ids, attn, [0, 100, 101, 102, 103], 103, 30, 0.5, torch.Generator().manual_seed(3))
    b = mask_tokens(ids, attn, [0, 100, 101, 102, 103], 103, 30, 0.5, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    everything = mask_tokens(ids, attn, [0, 100, 101, 102, 103], 103, 30, 0.999999,
                             torch.Generator().manual_seed(0))[1]
    assert torch.equal(everything != IGNORE, torch.isin(ids, torch.tensor([5, 6, 7, 8, 9, 10])))


def test_decoder_is_tied_to_word_embeddings():
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    enc = BertModel(cfg)
    head, loaded = build_mlm_head(enc, None)
    assert not loaded
    word = enc.embeddings.word.weight
    assert head.decoder.weight is word
    assert head.decoder.weight.data_ptr() == word.data_ptr()
    # a gradient through the decoder reaches the embedding matrix, and an update moves both
    hidden, _ = enc(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long))
    head(hidden).sum().backward()
    assert word.grad is not None and word.grad.abs().sum() > 0
    with torch.no_grad():
        word[7].fill_(1.5)
    assert torch.all(head.decoder.weight[7] == 1.5)


def test_head_matches_transformers_masked_lm(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    ref = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # make the head non-trivial (fresh HF heads have zero bias, unit LayerNorm)
        for p in ref.cls.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(tmp_path)
    enc, tensors, _ = load_encoder(tmp_path)
    assert {"transform.dense.weight", "transform.LayerNorm.weight", "bias"} <= set(tensors)
    head, loaded = build_mlm_head(enc, tensors)
    assert loaded
    ids = torch.randint(5, 120, (3, 9))
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0
    with torch.no_grad():
        hidden, _ = enc.eval()(ids, attn, torch.zeros_like(ids))
        ours = head.eval()(hidden)
        theirs = ref(input_ids=ids, attention_mask=attn).logits
    keep = attn.bool()
    torch.testing.assert_close(ours[keep], theirs[keep], atol=1e-4, rtol=0)


def test_head_round_trips_through_save_hf_folder(tmp_path):
    cfg = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    enc = BertModel(cfg)
    head, _ = build_mlm_head(enc, None)
    with torch.no_grad():
        head.bias.normal_()
        head.dense.weight.normal_()
    save_hf_folder(tmp_path, enc, mlm_head=head.checkpoint_tensors())
    enc2, tensors, _ = load_encoder(tmp_path)
    head2, loaded = build_mlm_head(enc2, tensors)
    assert loaded and head2.decoder.weight is enc2.embeddings.word.weight
    for (k, a), (_, b) in zip(head.state_dict().items(), head2.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)


def test_partial_head_is_a_user_error():
    from minbert.core.errors import MinBertError

    enc = BertModel(BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=16))
    with pytest.raises(MinBertError, match="transform.dense.bias"):
        build_mlm_head(enc, {"transform.dense.weight": torch.zeros(8, 8)}, "x/model.safetensors")
    with pytest.raises(MinBertError, match="shape"):
        build_mlm_head(enc, {"transform.dense.weight": torch.zeros(8, 8), "transform.dense.bias": torch.zeros(8),
                             "transform.LayerNorm.weight": torch.ones(8), "transform.LayerNorm.bias": torch.zeros(8),
                             "bias": torch.zeros(41)}, "x/model.safetensors")
