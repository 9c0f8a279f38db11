"""Token cache and the length-bucketed batch sampler."""
from __future__ import annotations

import numpy as np
import pytest

from minbert.data.encode import encode_cached
from minbert.data.raw import raw_path, read_cs224n
from minbert.data.sampler import BucketBatchSampler
from minbert.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return Tokenizer(minilm_dir, max_length=64)


def test_encode_cached_matches_tokenizer_and_reuses_cache(tmp_path, tokenizer, minilm_dir):
    texts, pairs = ["A man plays guitar.", "NA", "Ünïcödé text"], ["Someone plays.", "x", "y"]
    direct = tokenizer.encode(texts, pairs)
    assert encode_cached(tokenizer, texts, pairs, cache_dir=tmp_path) == direct
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    assert encode_cached(tokenizer, texts, pairs, cache_dir=tmp_path) == direct   # from the cache
    assert list(tmp_path.glob("*.npz")) == files
    # the key covers the texts, single vs pair, and the tokenizer's max length
    encode_cached(tokenizer, texts, cache_dir=tmp_path)
    encode_cached(tokenizer, texts[:2], pairs[:2], cache_dir=tmp_path)
    short = Tokenizer(minilm_dir, max_length=8)
    assert all(len(ids) <= 8 for ids, _ in encode_cached(short, texts, pairs, cache_dir=tmp_path))
    assert len(list(tmp_path.glob("*.npz"))) == 4
    # a corrupt cache file is re-encoded, not trusted
    files[0].write_bytes(b"garbage")
    assert encode_cached(tokenizer, texts, pairs, cache_dir=tmp_path) == direct
    assert encode_cached(tokenizer, texts) == tokenizer.encode(texts)    # no cache_dir: no files


def _covers(batches, n):
    flat = [i for b in batches for i in b]
    return sorted(flat) == list(range(n))


def test_sampler_covers_every_index_once_and_reshuffles_per_epoch():
    lengths = np.random.default_rng(0).integers(5, 60, size=1003)
    s = BucketBatchSampler(lengths, batch_size=32, seed=7)
    e0 = list(s)
    assert len(s) == len(e0) == 32 and _covers(e0, 1003)
    assert e0 == list(BucketBatchSampler(lengths, batch_size=32, seed=7))   # seeded
    s.set_epoch(1)
    e1 = list(s)
    assert _covers(e1, 1003) and e1 != e0
    s.set_epoch(0)
    assert list(s) == e0
    ordered = list(BucketBatchSampler(lengths, batch_size=32, shuffle=False))
    assert _covers(ordered, 1003)
    assert [lengths[b].max() for b in ordered] == sorted(lengths[b].max() for b in ordered)


def test_bucketing_cuts_padding_on_real_sst(shared_data, tokenizer, tmp_path):
    frame, _ = read_cs224n(raw_path(shared_data / "cs224n", "sst", "train"), "sst")
    lengths = np.array([len(ids) for ids, _ in encode_cached(tokenizer, frame["sentence"].tolist())])
    bs = 32

    def padding(batches):
        return sum(len(b) * lengths[b].max() - lengths[b].sum() for b in batches)

    perm = np.random.default_rng(0).permutation(len(lengths))
    random_pad = padding([perm[i:i + bs] for i in range(0, len(perm), bs)])
    bucket_pad = padding(list(BucketBatchSampler(lengths, bs, seed=0)))
    cut = 1 - bucket_pad / random_pad
    print(f"\nSST train ({len(lengths)} sentences, batch {bs}, max_length 64): padded tokens "
          f"{random_pad} with random batches, {bucket_pad} with bucketing: {cut:.1%} fewer")
    assert cut >= 0.30
