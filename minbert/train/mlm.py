"""Masked-LM further pretraining: BERT's token masking and its prediction head.

Masking follows Devlin et al. (2018): each WordPiece token is chosen with probability
`mask_prob` (15%), never a special token ([CLS], [SEP], [PAD], [MASK], [UNK]) nor padding; of the
chosen ones 80% become [MASK], 10% a random token and 10% stay as they are. The loss is taken on
the chosen positions only (the others carry the label IGNORE).

The head is BERT's `cls.predictions`: dense + activation + LayerNorm, then a decoder whose
weight *is* the word-embedding matrix (tied, one tensor) plus its own output bias.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert.core.errors import MinBertError
from minbert.data.batches import padding_layout
from minbert.data.views import Encoded
from minbert.model.bert import _ACTIVATIONS, BertConfig, BertModel
from minbert.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

IGNORE = -100  # label of positions that are not predicted (F.cross_entropy's ignore_index)


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int],
                mask_id: int, vocab_size: int, mask_prob: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of a padded batch. Returns (masked input_ids, labels), both (B, T).

    `labels` holds the original token at chosen positions and IGNORE elsewhere. Random
    replacements are drawn from the non-special vocabulary so that masking never creates a
    [CLS]/[SEP]/[PAD] in the middle of a sentence.
    """
    ids = input_ids.clone()
    specials = torch.tensor(sorted(set(special_ids)), dtype=ids.dtype)
    can_choose = attention_mask.bool() & ~torch.isin(ids, specials)

    def coin(p: float) -> torch.Tensor:
        return torch.rand(ids.shape, generator=generator) < p

    chosen = coin(mask_prob) & can_choose
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))

    to_mask = chosen & coin(0.8)
    # half of the remaining 20%: a random token; the other half stays unchanged
    to_random = chosen & ~to_mask & coin(0.5)
    ids[to_mask] = mask_id

    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[specials[specials < vocab_size]] = False
    allowed_ids = allowed.nonzero().squeeze(1).to(ids.dtype)
    n_random = int(to_random.sum())
    if n_random:
        pick = torch.randint(len(allowed_ids), (n_random,), generator=generator)
        ids[to_random] = allowed_ids[pick]
    return ids, labels


class MlmHead(nn.Module):
    """BERT's masked-LM prediction head with a decoder tied to the word embeddings."""

    def __init__(self, cfg: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        # weight tying, as in BERT (and nanoGPT): one Parameter, two modules
        self.decoder.weight = word_embeddings.weight
        nn.init.normal_(self.dense.weight, mean=0.0, std=cfg.initializer_range)
        nn.init.zeros_(self.dense.bias)
        nn.init.zeros_(self.decoder.bias)

    @property
    def bias(self) -> nn.Parameter:
        return self.decoder.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (N, H) or (B, T, H) -> (..., V)
        return self.decoder(self.norm(self.act(self.dense(hidden))))

    # -------------------------------------------------------------- checkpoint tensors

    def load_checkpoint_tensors(self, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Load `cls.predictions.*` tensors (keys without that prefix, as `load_encoder` gives them)."""
        mapping = {"transform.dense.weight": self.dense.weight, "transform.dense.bias": self.dense.bias,
                   "transform.LayerNorm.weight": self.norm.weight, "transform.LayerNorm.bias": self.norm.bias,
                   "bias": self.bias}
        tensors = dict(tensors)
        # newer checkpoints also store decoder.bias (the same tensor as `bias`)
        if "bias" not in tensors and "decoder.bias" in tensors:
            tensors["bias"] = tensors["decoder.bias"]
        missing = [k for k in mapping if k not in tensors]
        if missing:
            raise MinBertError(f"{source}: the masked-LM head lacks cls.predictions.{missing[0]}; "
                               "remove the partial head from the checkpoint or supply a complete one")
        with torch.no_grad():
            for key, param in mapping.items():
                t = tensors[key]
                if tuple(t.shape) != tuple(param.shape):
                    raise MinBertError(f"{source}: cls.predictions.{key} has shape {tuple(t.shape)}, "
                                       f"the encoder implies {tuple(param.shape)}")
                param.copy_(t)
            dec = tensors.get("decoder.weight")
            if dec is not None and not torch.equal(dec.to(self.decoder.weight.dtype), self.decoder.weight):
                # an untied checkpoint: keep tying (BERT's design) but say so
                log.warning(
                    "%s: cls.predictions.decoder.weight differs from the word embeddings; "
                    "the head stays tied to the word embeddings", source)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The head as `cls.predictions.*` tensors (without prefix) for `save_hf_folder`."""
        return {"transform.dense.weight": self.dense.weight, "transform.dense.bias": self.dense.bias,
                "transform.LayerNorm.weight": self.norm.weight, "transform.LayerNorm.bias": self.norm.bias,
                "bias": self.bias}


def build_mlm_head(encoder: BertModel, tensors: dict[str, torch.Tensor] | None,
                   source: str = "checkpoint") -> tuple[MlmHead, bool]:
    """The checkpoint's head when it has one, else a fresh one. Returns (head, loaded)."""
    head = MlmHead(encoder.config, encoder.embeddings.word)
    if tensors:
        head.load_checkpoint_tensors(tensors, source)
        return head, True
    return head, False


def mlm_loss_sum(encoder: BertModel, head: MlmHead, input_ids, attention_mask, token_type_ids,
                 labels, host: dict | None = None) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the chosen positions and their count (so epochs average per token).

    Only chosen positions go through the vocabulary projection: (N, H) -> (N, V), not (B, T, V).
    `host`: what the host knows of the batch (`chosen`: the flat indices of the chosen positions;
    `padded`, `token_index`: minbert.data.batches.padding_layout), so nothing is read from the device.
    """
    host = host or {}
    hidden, _ = encoder(input_ids, attention_mask, token_type_ids, padded=host.get("padded"),
                        token_index=host.get("token_index"))
    if "chosen" in host:
        idx = host["chosen"]
        n = int(host["n_chosen"])
    else:
        idx = (labels != IGNORE).reshape(-1).nonzero().squeeze(1)
        n = len(idx)
    if n == 0:
        return hidden.sum() * 0.0, 0
    logits = head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx))
    return F.cross_entropy(logits.float(), labels.reshape(-1).index_select(0, idx), reduction="sum"), n


class MlmObjective:
    """Masked-LM loss over a list of encoded texts; losses are summed per chosen token."""

    unit = "token"

    def __init__(self, encoder: BertModel, head, tok: Tokenizer, train: Encoded, dev: Encoded,
                 mask_prob: float, seed: int):
        self.encoder, self.head, self.tok = encoder, head, tok
        self.data = {"train": train, "dev": dev}
        self.mask_prob, self.seed = mask_prob, seed
        self.train_gen = torch.Generator().manual_seed(seed)

    def modules(self):
        return [self.encoder, self.head]

    def generators(self) -> dict[str, torch.Generator]:
        """The RNGs it draws from besides torch's global one (saved with a resumable state)."""
        return {"mask": self.train_gen}

    def lengths(self, split: str) -> list[int]:
        return [len(ids) for ids, _ in self.data[split]]

    def new_eval_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + 1)

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        return self.loss_of(self.batch(split, indices, device, generator))

    def batch(self, split: str, indices: list[int], device, generator=None) -> dict:
        """The host's part of a step: pad, mask (drawing from `generator`, else the run's), find the
        chosen positions and the padding, and send the tensors on their way to `device`."""
        batch = self.tok.pad([self.data[split][i] for i in indices])
        ids, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.tok.special_ids,
                                  self.tok.mask_id, self.tok.vocab_size, self.mask_prob,
                                  generator=generator or self.train_gen)
        chosen = (labels != IGNORE).reshape(-1).nonzero().squeeze(1)    # on the host, where the labels were drawn
        layout = padding_layout(batch["attention_mask"])
        host = {"chosen": chosen.to(device, non_blocking=True), "n_chosen": len(chosen), "padded": layout["padded"]}
        if "token_index" in layout:
            host["token_index"] = layout["token_index"].to(device, non_blocking=True)
        tensors = {"input_ids": ids, "attention_mask": batch["attention_mask"], "token_type_ids": batch["token_type_ids"],
                   "labels": labels}
        return {**{k: v.to(device, non_blocking=True) for k, v in tensors.items()}, "host": host}

    def loss_of(self, batch: dict) -> tuple[torch.Tensor, int]:
        """The device's part: (summed loss over the chosen tokens, their count)."""
        return mlm_loss_sum(self.encoder, self.head, batch["input_ids"], batch["attention_mask"],
                            batch["token_type_ids"], batch["labels"], batch["host"])
