"""Tokenised splits cached on disk, and a length-bucketed batch sampler that cuts padding."""
from __future__ import annotations

import hashlib
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np
from torch.utils.data import Sampler
from tqdm.auto import tqdm

from .io import atomic_path

ENCODE_CHUNK = 4096          # sentences per tokenizer call (keeps the progress bar moving)


def _cache_key(tokenizer, texts: list[str], pairs: list[str] | None) -> str:
    h = hashlib.sha256(tokenizer.fingerprint().encode())
    h.update(b"pairs" if pairs is not None else b"single")
    for column in (texts, pairs or []):
        h.update(len(column).to_bytes(8, "little"))
        for t in column:
            h.update(t.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()[:24]


def _save(path: Path, encoded: list[tuple[list[int], list[int]]]) -> None:
    lengths = np.fromiter((len(ids) for ids, _ in encoded), dtype=np.int64, count=len(encoded))
    flat_ids = np.fromiter((i for ids, _ in encoded for i in ids), dtype=np.int32, count=int(lengths.sum()))
    flat_types = np.fromiter((t for _, tt in encoded for t in tt), dtype=np.int8, count=int(lengths.sum()))
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, lengths=lengths, ids=flat_ids, types=flat_types)


def _load(path: Path) -> list[tuple[list[int], list[int]]] | None:
    try:
        with np.load(path) as z:
            lengths, ids, types = z["lengths"], z["ids"], z["types"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError):
        return None    # unreadable or truncated cache: encode again
    if not all(a.ndim == 1 and a.dtype.kind in "iu" for a in (lengths, ids, types)):
        return None
    if (lengths < 0).any() or int(lengths.sum()) != len(ids) or len(ids) != len(types):
        return None
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    ids, types = ids.tolist(), types.tolist()
    return [(ids[a:b], types[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def encode_cached(tokenizer, texts, pairs=None, cache_dir=None) -> list[tuple[list[int], list[int]]]:
    """Tokenise sentences (or sentence pairs) with a `minbert.tokenizer.Tokenizer`, unpadded.

    With `cache_dir`, the result is stored as `<cache_dir>/<key>.npz`, keyed by the tokenizer's
    fingerprint (tokenizer + max length) and the texts, so a re-run (or another experiment with
    the same tokenizer) loads it instead of tokenising again.
    """
    texts = [str(t) for t in texts]
    pairs = None if pairs is None else [str(t) for t in pairs]
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"encode_cached: {len(texts)} texts but {len(pairs)} pairs")
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{_cache_key(tokenizer, texts, pairs)}.npz"
        if path.is_file():
            cached = _load(path)
            if cached is not None and len(cached) == len(texts):
                return cached
    encoded = []
    starts = range(0, len(texts), ENCODE_CHUNK)
    for a in tqdm(starts, desc="tokenise", unit="chunk", disable=len(starts) < 4, leave=False):
        b = a + ENCODE_CHUNK
        encoded.extend(tokenizer.encode(texts[a:b], None if pairs is None else pairs[a:b]))
    if path is not None:
        _save(path, encoded)
    return encoded


class BucketBatchSampler(Sampler):
    """Batches of indices whose examples have similar lengths, to cut padding.

    With `shuffle`, each epoch permutes the examples (seeded by seed + epoch), sorts them by
    length within pools of `pool_batches` batches, cuts the pools into batches and shuffles the
    batch order: similar lengths together, yet different batches every epoch. Without `shuffle`,
    batches follow the length order (deterministic; for prediction).

    With num_replicas > 1 (DDP) every rank yields a disjoint share of the same batch list; the
    list is padded by repeating its first batches (or cut, with drop_last) so all ranks yield the
    same number of batches.
    """

    def __init__(self, lengths, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, drop_last: bool = False, pool_batches: int = 50):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, int(seed)
        self.num_replicas, self.rank, self.drop_last = int(num_replicas), int(rank), drop_last
        self.pool_batches = max(1, int(pool_batches))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _all_batches(self) -> list[list[int]]:
        n, bs = len(self.lengths), self.batch_size
        if self.shuffle:
            rng = np.random.default_rng(self.seed + self.epoch)
            order = rng.permutation(n)
            pool = bs * self.pool_batches
            # within each pool, sort by length (stable: ties keep the random order)
            order = np.concatenate([chunk[np.argsort(self.lengths[chunk], kind="stable")]
                                    for chunk in np.array_split(order, range(pool, n, pool))]) if n else order
        else:
            order = np.argsort(self.lengths, kind="stable")
        batches = [order[i:i + bs].tolist() for i in range(0, n, bs)]
        if self.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        if self.shuffle:
            perm = np.random.default_rng(self.seed + self.epoch + 1_000_003).permutation(len(batches))
            batches = [batches[i] for i in perm]
        return batches

    def _per_rank(self, n_batches: int) -> int:
        if self.drop_last:
            return n_batches // self.num_replicas
        return math.ceil(n_batches / self.num_replicas)

    def __iter__(self):
        batches = self._all_batches()
        per_rank = self._per_rank(len(batches))
        total = per_rank * self.num_replicas
        if total > len(batches):   # pad by repeating, as torch's DistributedSampler does
            batches = (batches * math.ceil(total / max(1, len(batches))))[:total]
        else:
            batches = batches[:total]
        yield from batches[self.rank:total:self.num_replicas]

    def __len__(self) -> int:
        n = len(self.lengths)
        n_batches = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return self._per_rank(n_batches)
