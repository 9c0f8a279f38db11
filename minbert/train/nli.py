"""NLI pretraining of sentence embeddings: triplets from SNLI/MNLI and the three objectives (the
data, its columns and labels: minbert.core.nli_data).

- regression: cosine similarity of the two sentence embeddings against 1 / 0.5 / 0 for
  entailment / neutral / contradiction, mean squared error (like an STS cosine head);
- contrastive: supervised SimCSE (Gao et al., 2021) on triplets (premise, entailment,
  contradiction): each premise must pick its own entailment among every entailment and
  contradiction of the batch (in-batch negatives plus the hard negative), cosine / temperature;
- triplet: SBERT's triplet loss (Reimers and Gurevych, 2019),
  max(||a - p|| - ||a - n|| + margin, 0) with Euclidean distance, margin 1.

Sentences are embedded separately (a bi-encoder) and pooled by `pooling`: "mean" over the
non-padding tokens, as SBERT does (the default), or the [CLS] hidden state.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from minbert.core.errors import MinBertError
from minbert.core.nli_data import NLI_DATA
from minbert.data.batches import padding_layout, to_device
from minbert.data.encode import encode_cached
from minbert.model.bert import BertModel, mean_pool
from minbert.model.tokenizer import Tokenizer

LABEL_TARGET = dict(zip(NLI_DATA.labels, (1.0, 0.5, 0.0)))     # entailment, neutral, contradiction


# ---------------------------------------------------------------- data

def build_triplets(frame: pd.DataFrame, source: str = NLI_DATA.name) -> pd.DataFrame:
    """(anchor, positive, negative) rows from NLI pairs sharing a premise.

    Rows are grouped by `group` (SNLI captionID / MNLI promptID) and premise text; within a
    group the k-th entailment is paired with the k-th contradiction (file order), so no
    hypothesis is used twice and groups lacking either kind give no triplet.
    """
    for col in (c for c in NLI_DATA.columns if c != "id"):
        if col not in frame.columns:
            raise MinBertError(f"{source}: column '{col}' is missing; NLI data needs {', '.join(NLI_DATA.columns)} "
                               "(run the prepare stage)")
    rows = []
    for (group, premise), g in frame.groupby(["group", "sentence1"], sort=False):
        entail = g.loc[g["label"] == "entailment", "sentence2"].tolist()
        contra = g.loc[g["label"] == "contradiction", "sentence2"].tolist()
        rows += [(group, premise, p, n) for p, n in zip(entail, contra)]
    return pd.DataFrame(rows, columns=["group", "anchor", "positive", "negative"])


def regression_targets(labels, source: str = NLI_DATA.name) -> torch.Tensor:
    try:
        return torch.tensor([LABEL_TARGET[str(x)] for x in labels], dtype=torch.float)
    except KeyError as e:
        raise MinBertError(f"{source}: label {e.args[0]!r} is not {', '.join(NLI_DATA.labels[:-1])} or "
                           f"{NLI_DATA.labels[-1]}") from None


# ---------------------------------------------------------------- embeddings

def embed(encoder: BertModel, batch: dict[str, torch.Tensor], pooling: str = "mean") -> torch.Tensor:
    """Sentence embeddings (B, H) of a padded batch of single sentences."""
    hidden, _ = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                        padded=batch.get("padded"), token_index=batch.get("token_index"))
    if pooling == "mean":
        return mean_pool(hidden, batch["attention_mask"])
    if pooling == "cls":
        return hidden[:, 0]
    raise ValueError(f"unknown pooling {pooling!r}")


# ---------------------------------------------------------------- objectives

def regression_loss(u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE between cos(u, v) and the label's target similarity. u, v: (B, H); target: (B,)."""
    return F.mse_loss(F.cosine_similarity(u.float(), v.float(), dim=-1), target.float())


def contrastive_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                     temperature: float = 0.05) -> torch.Tensor:
    """Supervised SimCSE: -log softmax over [all positives; all negatives] at the own positive."""
    a = F.normalize(anchor.float(), dim=-1)
    candidates = F.normalize(torch.cat([positive, negative]).float(), dim=-1)   # (2B, H)
    logits = a @ candidates.T / temperature                                       # (B, 2B)
    return F.cross_entropy(logits, torch.arange(len(a), device=a.device))


def triplet_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                 margin: float = 1.0) -> torch.Tensor:
    """SBERT triplet loss with Euclidean distance, averaged over the batch."""
    d_pos = torch.linalg.vector_norm(anchor.float() - positive.float(), dim=-1)
    d_neg = torch.linalg.vector_norm(anchor.float() - negative.float(), dim=-1)
    return F.relu(d_pos - d_neg + margin).mean()


# ---------------------------------------------------------------- the objective

class NliObjective:
    """One of the three NLI objectives over sentences embedded separately.

    regression: examples are (premise, hypothesis, target); contrastive and triplet: examples
    are (anchor, positive, negative). All parts of a batch go through the encoder in one pass.
    """

    unit = "example"

    def __init__(self, encoder: BertModel, tok: Tokenizer, nli, train: dict, dev: dict):
        """`nli`: the pretraining's NLI settings (minbert.params.NliParams: objective, temperature,
        margin, pooling); `train`, `dev`: the examples of each split."""
        self.encoder, self.tok, self.objective = encoder, tok, nli.objective
        self.data = {"train": train, "dev": dev}
        self.temperature, self.margin, self.pooling = nli.temperature, nli.margin, nli.pooling

    def modules(self):
        return [self.encoder]

    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def lengths(self, split: str) -> list[int]:
        parts = self.data[split]["parts"]
        return [max(len(p[i][0]) for p in parts) for i in range(len(parts[0]))]

    def new_eval_generator(self):
        return None

    def loss_sum(self, split: str, indices: list[int], device, generator=None) -> tuple[torch.Tensor, int]:
        return self.loss_of(self.batch(split, indices, device, generator))

    def batch(self, split: str, indices: list[int], device, generator=None) -> dict:
        """The host's part of a step: every part of the examples padded as one batch, on its way to `device`."""
        parts = self.data[split]["parts"]
        batch = self.tok.pad([p[i] for p in parts for i in indices])
        batch.update(padding_layout(batch["attention_mask"]))
        if self.objective == "regression":
            batch["target"] = self.data[split]["target"][indices]
        return {**to_device(batch, device), "n": len(indices)}

    def loss_of(self, batch: dict) -> tuple[torch.Tensor, int]:
        """The device's part: (the loss times the batch's examples, their count)."""
        n = batch["n"]
        chunks = embed(self.encoder, batch, self.pooling).split(n)
        if self.objective == "regression":
            loss = regression_loss(chunks[0], chunks[1], batch["target"])
        elif self.objective == "contrastive":
            loss = contrastive_loss(*chunks, temperature=self.temperature)
        else:
            loss = triplet_loss(*chunks, margin=self.margin)
        return loss * n, n


def nli_examples(tok: Tokenizer, frame: pd.DataFrame, objective: str, source: str, cache_dir=None) -> dict:
    """Encode a prepared NLI split for `objective`: pairs with targets, or triplets."""
    if objective == "regression":
        frame = frame[frame["label"].notna()]
        return {"parts": [encode_cached(tok, frame["sentence1"].tolist(), cache_dir=cache_dir),
                          encode_cached(tok, frame["sentence2"].tolist(), cache_dir=cache_dir)],
                "target": regression_targets(frame["label"], source)}
    triplets = build_triplets(frame, source)
    if triplets.empty:
        raise MinBertError(f"{source}: no (premise, entailment, contradiction) triplet could be built; "
                           "the data needs premises with both an entailment and a contradiction")
    return {"parts": [encode_cached(tok, triplets[c].tolist(), cache_dir=cache_dir)
                      for c in ("anchor", "positive", "negative")]}


def subset_examples(examples: dict, size: int | None, seed: int) -> dict:
    """A seeded subset of at most `size` examples, in their original order."""
    n = len(examples["parts"][0])
    if size is None or n <= size:
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(n)[:size])
    out = {"parts": [[p[i] for i in keep] for p in examples["parts"]]}
    if "target" in examples:
        out["target"] = examples["target"][torch.from_numpy(keep)]
    return out
