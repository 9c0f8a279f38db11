"""WordPiece tokenisation through the `tokenizers` library, over a checkpoint's files."""
from __future__ import annotations

import hashlib
import json
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from minbert.core.errors import MinBertError
from minbert.core.io import read_input
from minbert.model.weights import read_config


class Tokenizer:
    """Encodes single sentences or sentence pairs; pads per batch (dynamic padding).

    Uses the checkpoint's `tokenizer.json` when present, else builds a BERT WordPiece tokenizer
    from `vocab.txt`, lower-casing as `tokenizer_config.json` says (default: lower-case).
    """

    def __init__(self, folder: str | Path, max_length: int = 128):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        folder = Path(folder)
        self.folder = folder
        self.max_length = int(max_length)
        tj, vocab = folder / "tokenizer.json", folder / "vocab.txt"
        if tj.exists() or tj.is_symlink():
            text = self._text(tj)
            try:
                self._tok = HFTokenizer.from_str(text)
            except Exception as e:
                raise MinBertError(f"{tj}: cannot be read by the tokenizers library "
                                   f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})") from None
        elif vocab.exists() or vocab.is_symlink():
            if not self._text(vocab).strip():
                raise MinBertError(f"{vocab}: the vocabulary is empty")
            try:
                self._tok = BertWordPieceTokenizer(str(vocab), lowercase=self._lowercase(folder))._tokenizer
            except MinBertError:
                raise
            except Exception as e:
                raise MinBertError(f"{vocab}: cannot be read as a WordPiece vocabulary "
                                   f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})") from None
        else:
            raise MinBertError(f"{folder}: no tokenizer.json or vocab.txt; the model folder needs one of them")
        self._setup(str(folder))
        self._check_against_model(folder, max(self._tok.get_vocab().values()) + 1)

    @classmethod
    def from_json(cls, text: str, max_length: int, source: str = "checkpoint") -> "Tokenizer":
        """The tokenizer a checkpoint stores (`to_json`), without a folder."""
        from tokenizers import Tokenizer as HFTokenizer

        self = cls.__new__(cls)
        self.folder, self.max_length = None, int(max_length)
        try:
            self._tok = HFTokenizer.from_str(text)
        except Exception as e:
            raise MinBertError(f"{source}: its tokenizer cannot be read by the tokenizers library "
                               f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})") from None
        self._setup(source)
        return self

    def to_json(self) -> str:
        """The whole tokenizer (vocabulary, normalisation, special tokens) as tokenizers' JSON."""
        return self._tok.to_str()

    def vocabulary(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def _setup(self, where: str) -> None:
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=self.max_length, strategy="longest_first")
        vocab_map = self._tok.get_vocab()
        for tok in ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"):
            if tok not in vocab_map:
                raise MinBertError(f"{where}: the vocabulary has no {tok} token; not a BERT tokenizer")
        self.pad_id, self.cls_id, self.sep_id = vocab_map["[PAD]"], vocab_map["[CLS]"], vocab_map["[SEP]"]
        self.mask_id, self.unk_id = vocab_map["[MASK]"], vocab_map["[UNK]"]
        self.vocab_size = self._tok.get_vocab_size()
        self.special_ids = sorted({self.pad_id, self.cls_id, self.sep_id, self.mask_id, self.unk_id})
        self.type_vocab_size: int | None = None

    @staticmethod
    def _text(path: Path) -> str:
        data = read_input(path, "tokenizer file", limit=512 << 20)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); is this a tokenizer file?") from None

    def _check_against_model(self, folder: Path, id_limit: int) -> None:
        """When the folder also holds the model's config.json: every token id must have a row in the
        embedding matrix, and max_length must fit the position embeddings."""
        if not (folder / "config.json").is_file():
            return

        cfg = read_config(folder)
        if id_limit > cfg.vocab_size:
            raise MinBertError(
                f"{folder}: the tokenizer has token ids up to {id_limit - 1}, but config.json says vocab_size "
                f"{cfg.vocab_size}: ids from {cfg.vocab_size} on have no embedding; use the tokenizer files that came "
                f"with these weights")
        if self.max_length > cfg.max_position_embeddings:
            raise MinBertError(
                f"{folder}: max_length {self.max_length} is more than the model's max_position_embeddings "
                f"{cfg.max_position_embeddings} (config.json); set max_length to at most "
                f"{cfg.max_position_embeddings} in params.yaml")
        self.type_vocab_size = cfg.type_vocab_size

    @staticmethod
    def _lowercase(folder: Path) -> bool:
        cfg = folder / "tokenizer_config.json"
        if not (cfg.exists() or cfg.is_symlink()):
            return True
        try:
            raw = json.loads(Tokenizer._text(cfg))
        except (json.JSONDecodeError, RecursionError):
            raise MinBertError(f"{cfg}: not valid JSON") from None
        if not isinstance(raw, dict):
            raise MinBertError(f"{cfg}: expected a JSON object, found {type(raw).__name__}")
        lower = raw.get("do_lower_case", True)
        if not isinstance(lower, bool):
            raise MinBertError(f"{cfg}: do_lower_case is {lower!r}, expected true or false")
        return lower

    def fingerprint(self) -> str:
        """Stable hash of the tokenizer and max length: the key of tokenised caches."""
        h = hashlib.sha256(self.to_json().encode("utf-8"))
        h.update(str(self.max_length).encode())
        return h.hexdigest()[:16]

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> list[tuple[list[int], list[int]]]:
        """Return (input_ids, token_type_ids) per example, truncated, unpadded."""
        if pairs is not None and self.type_vocab_size is not None and self.type_vocab_size < 2:
            raise MinBertError(f"{self.folder / 'config.json'}: type_vocab_size is {self.type_vocab_size}, so the "
                               f"model cannot read sentence pairs (token type 1); use a pair-capable BERT for "
                               f"the pair tasks")
        inputs = list(texts) if pairs is None else list(zip(texts, pairs))
        try:
            encs = self._tok.encode_batch(inputs, add_special_tokens=True)
        except TypeError:  # e.g. a NaN from an empty cell: name the row instead of failing in Rust
            for i, item in enumerate(inputs):
                for part in (item if pairs is not None else (item,)):
                    if not isinstance(part, str):
                        raise MinBertError(f"text {i} of the batch is {part!r}, not a string; "
                                           "drop or fill empty sentences before tokenising") from None
            raise
        return [(e.ids, e.type_ids) for e in encs]

    def pad(self, encoded: list[tuple[list[int], list[int]]], multiple_of: int = 1,
            length: int | None = None) -> dict[str, torch.Tensor]:
        """Pad a batch to its longest member (rounded up to `multiple_of`, never past max_length),
        or to `length` when given (a fixed shape): input_ids, token_type_ids, attention_mask (B, T)."""
        lens = np.fromiter((len(ids) for ids, _ in encoded), dtype=np.int64, count=len(encoded))
        longest = int(lens.max())
        if length is None:
            length = min(-(-longest // multiple_of) * multiple_of, max(longest, self.max_length))
        elif length < longest:
            raise ValueError(f"cannot pad a batch whose longest row has {longest} tokens to {length}")
        real = np.arange(length) < lens[:, None]                    # (B, T): row-major, as the rows follow
        input_ids = np.full(real.shape, self.pad_id, dtype=np.int64)
        input_ids[real] = np.fromiter(chain.from_iterable(ids for ids, _ in encoded), np.int64, int(lens.sum()))
        type_ids = np.zeros(real.shape, dtype=np.int64)
        type_ids[real] = np.fromiter(chain.from_iterable(tt for _, tt in encoded), np.int64, int(lens.sum()))
        return {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(type_ids),
                "attention_mask": torch.from_numpy(real.astype(np.int64))}

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, torch.Tensor]:
        return self.pad(self.encode(texts, pairs))
