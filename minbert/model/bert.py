"""The minBERT encoder: a compact BERT in plain PyTorch.

Reads like nanoGPT's model.py: a config dataclass, one small module per concept. Loading
Hugging Face checkpoints lives in `minbert.model.weights`; this file knows nothing about files.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Sane bounds, far above every published BERT (bert-large: 24 layers, 1024 wide, 30522 tokens, 512
# positions): a config beyond them is a typo or a hostile file, refused before any module is built.
SIZE_LIMITS = {"vocab_size": 1 << 20, "hidden_size": 1 << 14, "num_hidden_layers": 256, "num_attention_heads": 256,
               "intermediate_size": 1 << 16, "max_position_embeddings": 1 << 16, "type_vocab_size": 1 << 10}
MAX_PARAMETERS = 20_000_000_000


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    initializer_range: float = 0.02

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """What makes this configuration unbuildable, naming the keys (None when it is fine)."""
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{key} is {value!r}, expected a positive integer"
            if value < 1:
                return f"{key} is {value}, expected a positive integer"
            if value > SIZE_LIMITS[key]:     # refused before anything is built or allocated
                return f"{key} is {value}, more than any BERT has (at most {SIZE_LIMITS[key]})"
        if self.num_parameters() > MAX_PARAMETERS:
            return (f"the sizes describe a model of {self.num_parameters() / 1e9:.1f} billion parameters, more "
                    f"than a BERT encoder has (at most {MAX_PARAMETERS / 1e9:g} billion)")
        if self.hidden_size % self.num_attention_heads:
            return (f"num_attention_heads {self.num_attention_heads} does not divide hidden_size "
                    f"{self.hidden_size}")
        for key, lo, hi in (("hidden_dropout_prob", 0.0, 1.0), ("attention_probs_dropout_prob", 0.0, 1.0),
                            ("layer_norm_eps", 0.0, 1.0), ("initializer_range", 0.0, None)):
            value = getattr(self, key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < lo or (hi is not None and value >= hi) or (key == "layer_norm_eps" and value <= 0):
                rng = f"in [{lo:g}, {hi:g})" if key != "layer_norm_eps" else "in (0, 1)"
                return f"{key} is {value!r}, expected a number {rng if hi is not None else '>= 0'}"
        if not isinstance(self.hidden_act, str) or self.hidden_act not in _ACTIVATIONS:
            return f"hidden_act {self.hidden_act!r} is not supported (one of {', '.join(_ACTIVATIONS)})"
        pad = self.pad_token_id
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < self.vocab_size):
            return f"pad_token_id is {pad!r}, expected an integer from 0 to vocab_size - 1 ({self.vocab_size - 1})"
        return None

    def num_parameters(self) -> int:
        """The encoder's parameter count these sizes imply (embeddings, layers, pooler)."""
        h, i = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
        return embeddings + self.num_hidden_layers * layer + h * h + h

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        """Build from a Hugging Face config.json dict, ignoring keys we do not use."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class Embeddings(nn.Module):
    """word + position + token type, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None, inputs_embeds=None):
        # input_ids: (B, T) -> (B, T, H)
        if inputs_embeds is None:
            inputs_embeds = self.word(input_ids)
        T = inputs_embeds.shape[1]
        positions = torch.arange(T, device=inputs_embeds.device)
        x = inputs_embeds + self.position(positions)[None]
        if token_type_ids is None:
            x = x + self.token_type.weight[0]
        else:
            x = x + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection and SDPA."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        assert cfg.hidden_size % cfg.num_attention_heads == 0
        self.n_head = cfg.num_attention_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attn_dropout = cfg.attention_probs_dropout_prob

    def forward(self, x, attn_bias, tokens: "Unpadded | None" = None):
        qkv = self.qkv(x)
        if tokens is not None:  # (N, 3H) real tokens -> (B, T, 3H), zeros at padding
            qkv = tokens.pad(qkv)
        B, T, H3 = qkv.shape
        H = H3 // 3
        # (B, T, 3H) -> 3 x (B, n_head, T, head_dim)
        q, k, v = qkv.view(B, T, 3, self.n_head, H // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_bias, dropout_p=self.attn_dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).reshape(B, T, H)
        if tokens is not None:
            y = tokens.unpad(y)
        return self.out(y)


class Unpadded:
    """Where a padded batch's real tokens are: everything but attention works on the (N, H)
    real tokens only, so padding costs no matrix products outside attention."""

    def __init__(self, attention_mask, index=None):
        self.B, self.T = attention_mask.shape
        # (N,) flat positions of the real tokens; computing them from a device mask waits for the
        # device (nonzero's size is data-dependent), so the batch brings them from the host
        self.index = attention_mask.reshape(-1).nonzero().squeeze(1) if index is None else index

    def unpad(self, x):  # (B, T, D) -> (N, D)
        return x.reshape(self.B * self.T, -1).index_select(0, self.index)

    def pad(self, x):  # (N, D) -> (B, T, D), zeros at padding
        out = x.new_zeros(self.B * self.T, x.shape[-1]).index_copy(0, self.index, x)
        return out.view(self.B, self.T, -1)


class Layer(nn.Module):
    """Post-LayerNorm transformer block, as in the original BERT."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ff_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ff_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ff_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x, attn_bias, tokens: "Unpadded | None" = None):
        # x: (B, T, H), or (N, H) real tokens only when `tokens` says where they sit
        x = self.attn_norm(x + self.dropout(self.attn(x, attn_bias, tokens)))
        x = self.ff_norm(x + self.dropout(self.ff_out(self.act(self.ff_in(x)))))
        return x


class Pooler(nn.Module):
    """tanh(dense(h_[CLS])), BERT's next-sentence pooled output."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden):
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """Returns (last_hidden_state (B, T, H), pooled_output (B, H)); the hidden states at padding
    positions are zeros (padding never reaches a matrix product outside attention)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.pooler = Pooler(cfg)
        self.gradient_checkpointing = False
        self.apply(self._init_weights)

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def freeze(self, frozen: bool = True) -> None:
        """Freeze (or unfreeze) every encoder parameter; heads live outside this module."""
        for p in self.parameters():
            p.requires_grad_(not frozen)

    @staticmethod
    def attention_bias(attention_mask, padded: bool | None = None):
        # (B, T) of 1/0 -> boolean (B, 1, 1, T), True where a key may be attended to.
        # A batch without padding needs no mask, and SDPA without one may pick a faster kernel.
        # `padded`: whether the mask has padding, when the caller knows (else it is read from the
        # mask, which waits for the device when the mask lives there)
        if attention_mask is None:
            return None
        if padded is None:
            padded = not bool(attention_mask.all())
        return attention_mask[:, None, None, :].bool() if padded else None

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None,
                return_embeddings=False, padded: bool | None = None, token_index=None, unpad: bool = True):
        """`inputs_embeds` replaces the word-embedding lookup (SMART perturbs it).

        With `return_embeddings`, the word embeddings used are returned as a third value, so a
        caller can perturb them and call again. `padded` and `token_index` (the flat positions of
        the real tokens) say what the host knows of the mask (minbert.data.batches.padding_layout), so
        the forward pass never waits for the device to read the mask. `unpad=False` keeps the
        padding in every product (a fixed shape, as a captured CUDA graph needs; the mask still
        keeps padding out of attention), where unpadding would make the token count data-dependent.
        """
        if inputs_embeds is None:
            inputs_embeds = self.embeddings.word(input_ids)
        x = self.embeddings(None, token_type_ids, inputs_embeds=inputs_embeds)
        attn_bias = self.attention_bias(attention_mask, padded)
        tokens = Unpadded(attention_mask, token_index) if attn_bias is not None and unpad else None
        if tokens is not None:
            x = tokens.unpad(x)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, attn_bias, tokens, use_reentrant=False)
            else:
                x = layer(x, attn_bias, tokens)
        if tokens is not None:
            x = tokens.pad(x)  # padding positions of the last hidden state are zeros
        pooled = self.pooler(x)
        if return_embeddings:
            return x, pooled, inputs_embeds
        return x, pooled


def mean_pool(hidden, attention_mask):
    """Mean over non-padding positions: (B, T, H), (B, T) -> (B, H)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def init_std_linear(linear: nn.Linear, std: float = 0.02) -> nn.Linear:
    nn.init.normal_(linear.weight, mean=0.0, std=std)
    nn.init.zeros_(linear.bias)
    return linear

