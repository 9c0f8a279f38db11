"""Our tokenizer against transformers' BERT tokenizers on real sentences and pairs."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch

from minbert.core.errors import MinBertError
from minbert.model.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def real_texts(shared_data):
    """1,200 SST sentences and 1,200 sentence pairs (600 STS, 600 Quora)."""
    d = shared_data / "cs224n"
    sst = pd.read_csv(d / "ids-sst-train.csv", sep="\t", index_col=0)["sentence"].head(1200).tolist()
    sts = pd.read_csv(d / "sts-train.csv", sep="\t", index_col=0).head(600)
    quora = pd.read_csv(d / "quora-train.csv", sep="\t", index_col=0).head(600)
    pairs = [(str(a), str(b)) for df in (sts, quora) for a, b in zip(df["sentence1"], df["sentence2"])]
    return sst, pairs


def _check_batches(ours: Tokenizer, ref, singles, pairs, max_length, batch=64):
    for texts, second in [(singles, None), ([a for a, _ in pairs], [b for _, b in pairs])]:
        for i in range(0, len(texts), batch):
            a = texts[i:i + batch]
            b = None if second is None else second[i:i + batch]
            got = ours(a, b)
            want = ref(a, b, padding=True, truncation=True, max_length=max_length,
                       return_tensors="pt", return_token_type_ids=True, return_attention_mask=True)
            for key in ("input_ids", "token_type_ids", "attention_mask"):
                assert torch.equal(got[key], want[key]), (key, i)


@pytest.mark.parametrize("max_length", [128, 24])  # 24 truncates many sentences and pairs
def test_matches_bert_tokenizer_fast(minilm_dir, real_texts, max_length):
    singles, pairs = real_texts
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    _check_batches(Tokenizer(minilm_dir, max_length), ref, singles, pairs, max_length)


@pytest.fixture(scope="module")
def vocab_only_dir(tmp_path_factory, minilm_dir):
    folder = tmp_path_factory.mktemp("vocab-only")
    shutil.copy(minilm_dir / "vocab.txt", folder / "vocab.txt")
    return folder


def test_vocab_txt_only_matches_tokenizer_json(vocab_only_dir, minilm_dir, real_texts):
    singles, pairs = real_texts
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    _check_batches(Tokenizer(vocab_only_dir, 64), ref, singles, pairs, 64)


def test_vocab_txt_only_matches_python_wordpiece(vocab_only_dir, real_texts):
    # an independent implementation: transformers' pure-Python BasicTokenizer + WordPiece
    singles, pairs = real_texts
    ref = transformers.models.bert.BertTokenizerLegacy(vocab_file=str(vocab_only_dir / "vocab.txt"))
    ours = Tokenizer(vocab_only_dir, 512)
    texts = singles[:300] + ["Héllo Wörld, naïve café — 東京 ok?"]
    for (ids, tt), text in zip(ours.encode(texts), texts):
        assert ids == ref(text)["input_ids"]


def test_cased_checkpoint_keeps_case(tmp_path, vocab_only_dir):
    shutil.copy(vocab_only_dir / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased, uncased = Tokenizer(tmp_path), Tokenizer(vocab_only_dir)
    ref = transformers.models.bert.BertTokenizerLegacy(vocab_file=str(tmp_path / "vocab.txt"),
                                                       do_lower_case=False)
    text = "Paris Is Lovely"
    (cased_ids, _), = cased.encode([text])
    (uncased_ids, _), = uncased.encode([text])
    assert cased_ids != uncased_ids == ref.convert_tokens_to_ids(["[CLS]", "paris", "is", "lovely", "[SEP]"])
    assert cased_ids == ref(text)["input_ids"]


def test_pair_token_type_ids(minilm_dir):
    tok = Tokenizer(minilm_dir)
    (ids, tt), = tok.encode(["a cat sat"], ["on the mat"])
    sep = [i for i, t in enumerate(ids) if t == tok.sep_id]
    assert ids[0] == tok.cls_id and len(sep) == 2 and sep[1] == len(ids) - 1
    assert tt == [0] * (sep[0] + 1) + [1] * (len(ids) - sep[0] - 1)
    (ids1, tt1), = tok.encode(["a cat sat"])
    assert tt1 == [0] * len(ids1)


def test_truncation_to_max_length(minilm_dir):
    tok = Tokenizer(minilm_dir, max_length=16)
    long = " ".join(["word"] * 100)
    (ids, _), (pids, ptt) = tok.encode([long])[0], tok.encode([long], ["short"])[0]
    assert len(ids) == 16 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    # longest_first: the long side gives up tokens, the short second sentence survives whole
    assert len(pids) == 16 and pids[-2] == tok._tok.token_to_id("short") and sum(ptt) == 2


def test_dynamic_padding(minilm_dir):
    tok = Tokenizer(minilm_dir)
    batch = tok(["short", "a somewhat longer sentence here"])
    T = batch["input_ids"].shape[1]
    assert T == len(tok.encode(["a somewhat longer sentence here"])[0][0])
    assert batch["attention_mask"].tolist()[0] == [1, 1, 1] + [0] * (T - 3)
    assert (batch["input_ids"][0, 3:] == tok.pad_id).all()
    assert all(v.dtype == torch.long for v in batch.values())


def test_fingerprint(minilm_dir, vocab_only_dir):
    a, b = Tokenizer(minilm_dir, 128), Tokenizer(minilm_dir, 128)
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != Tokenizer(minilm_dir, 64).fingerprint()


def test_special_ids(minilm_dir):
    tok = Tokenizer(minilm_dir)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == 30522


def test_folder_without_tokenizer_is_an_error(tmp_path):
    with pytest.raises(MinBertError, match="no tokenizer.json or vocab.txt"):
        Tokenizer(tmp_path)


def test_vocab_without_specials_is_an_error(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(MinBertError, match=r"no \[MASK\] token"):
        Tokenizer(tmp_path)


def test_corrupt_tokenizer_json_is_an_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(MinBertError, match="tokenizer.json: cannot be read"):
        Tokenizer(tmp_path)


def test_invalid_tokenizer_config_is_an_error(tmp_path, vocab_only_dir):
    shutil.copy(vocab_only_dir / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(MinBertError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer(tmp_path)


def test_non_string_text_is_an_error(minilm_dir):
    tok = Tokenizer(minilm_dir)
    with pytest.raises(MinBertError, match="text 1 of the batch is nan"):
        tok.encode(["fine", float("nan")])
    with pytest.raises(MinBertError, match="text 0 of the batch is None"):
        tok.encode(["fine"], [None])
