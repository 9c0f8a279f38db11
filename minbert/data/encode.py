"""Text to token ids, cached on disk per tokenizer and text content."""
from __future__ import annotations

import hashlib
import pickle
import zipfile
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minbert.core.io import atomic_path

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
    """Tokenise sentences (or sentence pairs) with a `minbert.model.tokenizer.Tokenizer`, unpadded.

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
