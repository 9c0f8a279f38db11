"""Load Hugging Face BERT checkpoints into minBERT (and save them back): the config, the weights and
their names. Where a model name resolves to a folder is minbert.core.models's."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from minbert.core.errors import MinBertError
from minbert.core.io import read_input
from minbert.model.bert import BertConfig, BertModel
from minbert.core.models import (  # noqa: F401  (where a model name resolves: minbert.core.models)
    HUB_FILES,
    PACKAGED_NAMES,
    packaged_minilm_folder,
    model_folder,
)

log = logging.getLogger(__name__)

MLM_PREFIX = "cls.predictions."


def read_config(folder: Path) -> BertConfig:
    """config.json of a model folder as a BertConfig; a one-line error naming the file and the key
    for anything that cannot describe a BERT encoder (wrong types, sizes, head count, ...)."""
    cfg_path = Path(folder) / "config.json"
    if not cfg_path.exists() and not cfg_path.is_symlink():
        raise MinBertError(f"{cfg_path}: missing; a model folder needs config.json beside its weights")
    data = read_input(cfg_path, "config file", limit=4 << 20)
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise MinBertError(f"{cfg_path}: not UTF-8 text (byte {e.start}); is this a config.json?") from None
    except json.JSONDecodeError as e:
        raise MinBertError(f"{cfg_path}: not valid JSON ({e}); use the config.json that came with the "
                           f"weights") from None
    except RecursionError:
        raise MinBertError(f"{cfg_path}: not valid JSON (nested too deeply)") from None
    if not isinstance(raw, dict):
        raise MinBertError(f"{cfg_path}: expected a JSON object of settings, found {type(raw).__name__}")
    model_type = raw.get("model_type", "bert")
    if model_type != "bert":
        raise MinBertError(f"{cfg_path}: model_type '{model_type}' is not supported; only BERT checkpoints load")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in raw:
            raise MinBertError(f"{cfg_path}: missing key '{key}'")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise MinBertError(f"{cfg_path}: position_embedding_type '{raw['position_embedding_type']}' "
                           "is not supported; only absolute position embeddings load")
    if raw.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise MinBertError(f"{cfg_path}: hidden_act '{raw['hidden_act']}' is not supported")
    try:
        return BertConfig.from_dict(raw)
    except ValueError as e:
        raise MinBertError(f"{cfg_path}: {e}; fix config.json (or use the one that came with the "
                           f"weights)") from None


def _sharded(folder: Path) -> str | None:
    for pattern in ("model.safetensors.index.json", "pytorch_model.bin.index.json", "model-*-of-*.safetensors",
                    "pytorch_model-*-of-*.bin"):
        found = sorted(folder.glob(pattern))
        if found:
            return found[0].name
    return None


def read_state_dict(folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    st = folder / "model.safetensors"
    pt = folder / "pytorch_model.bin"
    if st.exists() or st.is_symlink():
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        _readable(st)
        try:
            sd = load_file(str(st))
        except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
            reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise MinBertError(f"{st}: cannot be read as safetensors ({reason}); the file is truncated or "
                               f"not a safetensors file: download it again") from None
        return _checked_tensors(sd, st), st
    if pt.exists() or pt.is_symlink():
        _readable(pt)
        try:
            sd = torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:
            raise MinBertError(f"{pt}: cannot be loaded safely with weights_only=True "
                               f"({type(e).__name__}); convert it to model.safetensors") from None
        if not isinstance(sd, dict):
            raise MinBertError(f"{pt}: expected a state dict, found {type(sd).__name__}")
        return _checked_tensors(sd, pt), pt
    shard = _sharded(folder)
    if shard:
        raise MinBertError(f"{folder}: holds a sharded checkpoint ({shard}), which is not supported; save the "
                           f"model as one model.safetensors")
    raise MinBertError(f"{folder}: no model.safetensors or pytorch_model.bin found")


def _readable(path: Path) -> None:
    """A one-line error when a weights file is a folder, unreadable or a dangling/looping link."""
    if path.is_file() and os.access(path, os.R_OK):
        return
    read_input(path, "weights file")   # raises, saying why


def _checked_tensors(sd: dict, path: Path) -> dict[str, torch.Tensor]:
    """Every entry a named floating-point tensor with finite values."""
    for key, t in sd.items():
        if not isinstance(key, str):
            raise MinBertError(f"{path}: key {key!r} is not a tensor name; is this a BERT checkpoint?")
        if not isinstance(t, torch.Tensor):
            raise MinBertError(f"{path}: '{key}' is a {type(t).__name__}, not a tensor; is this a BERT checkpoint?")
        if key.endswith("_ids"):   # position_ids / token_type_ids buffers: integer, not weights
            continue
        if not t.is_floating_point():
            raise MinBertError(f"{path}: tensor '{key}' has dtype {t.dtype}, expected floating point weights")
        if not bool(torch.isfinite(t).all()):
            raise MinBertError(f"{path}: tensor '{key}' holds NaN or infinite values; the checkpoint is broken "
                               f"(download it again, or use an earlier checkpoint)")
    return sd


_LAYER_MAP = {
    "attention.output.dense": "attn.out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "ff_in",
    "output.dense": "ff_out",
    "output.LayerNorm": "ff_norm",
}
_EMB_MAP = {
    "embeddings.word_embeddings": "embeddings.word",
    "embeddings.position_embeddings": "embeddings.position",
    "embeddings.token_type_embeddings": "embeddings.token_type",
    "embeddings.LayerNorm": "embeddings.norm",
    "pooler.dense": "pooler.dense",
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_IGNORED = re.compile(r"^(embeddings\.position_ids|cls\.seq_relationship\..*)$")


def _normalise_hf_key(key: str) -> str:
    for prefix in ("bert.", "model."):
        if key.startswith(prefix) and not key.startswith("cls."):
            key = key[len(prefix):]
    # TF-era checkpoints call LayerNorm parameters gamma/beta
    key = re.sub(r"\.gamma$", ".weight", key)
    key = re.sub(r"\.beta$", ".bias", key)
    return key


def hf_to_minbert(sd: dict[str, torch.Tensor], source: str = "checkpoint"):
    """Map Hugging Face BERT names onto ours. Returns (encoder_sd, mlm_head_sd, unexpected)."""
    encoder: dict[str, torch.Tensor] = {}
    mlm: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    unexpected = []
    for raw_key, tensor in sd.items():
        key = _normalise_hf_key(raw_key)
        if key.startswith(MLM_PREFIX):
            mlm[key[len(MLM_PREFIX):]] = tensor
            continue
        if _IGNORED.match(key):
            continue
        m = _LAYER_RE.match(key)
        if m:
            i, inner, kind = int(m.group(1)), m.group(2), m.group(3)
            if inner in ("attention.self.query", "attention.self.key", "attention.self.value"):
                qkv.setdefault((i, kind), {})[inner.rsplit(".", 1)[1]] = tensor
            elif inner in _LAYER_MAP:
                encoder[f"layers.{i}.{_LAYER_MAP[inner]}.{kind}"] = tensor
            else:
                unexpected.append(raw_key)
            continue
        stem, _, kind = key.rpartition(".")
        if stem in _EMB_MAP:
            encoder[f"{_EMB_MAP[stem]}.{kind}"] = tensor
        else:
            unexpected.append(raw_key)
    for (i, kind), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            missing = sorted({"query", "key", "value"} - set(parts))
            raise MinBertError(f"{source}: layer {i} attention is missing {', '.join(missing)}.{kind}")
        encoder[f"layers.{i}.attn.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]], 0)
    return encoder, mlm, unexpected


def minbert_to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of hf_to_minbert for the encoder, so our checkpoints load anywhere BERT loads."""
    inv_layer = {v: k for k, v in _LAYER_MAP.items()}
    inv_emb = {v: k for k, v in _EMB_MAP.items()}
    out = {}
    for key, t in sd.items():
        t = t.detach().contiguous()
        m = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", key)
        if m:
            i, inner, kind = m.groups()
            if inner == "attn.qkv":
                for name, part in zip(("query", "key", "value"), t.chunk(3, 0)):
                    out[f"encoder.layer.{i}.attention.self.{name}.{kind}"] = part.clone()
            else:
                out[f"encoder.layer.{i}.{inv_layer[inner]}.{kind}"] = t
            continue
        stem, _, kind = key.rpartition(".")
        out[f"{inv_emb[stem]}.{kind}"] = t
    return out


def load_encoder(name: str | os.PathLike) -> tuple[BertModel, dict[str, torch.Tensor], Path]:
    """Load a BERT checkpoint by name. Returns (encoder, mlm_head_tensors, folder).

    `mlm_head_tensors` holds the checkpoint's `cls.predictions.*` tensors (empty if it has none),
    keyed without that prefix, for the masked-LM stage.
    """
    folder = model_folder(name)
    cfg = read_config(folder)
    sd, weights_file = read_state_dict(folder)
    encoder_sd, mlm, unexpected = hf_to_minbert(sd, str(weights_file))
    if unexpected:
        raise MinBertError(f"{weights_file}: unexpected tensors {', '.join(sorted(unexpected)[:5])}"
                           f"{' ...' if len(unexpected) > 5 else ''}; is this a BERT checkpoint?")
    # the model config.json describes (its initialisation draws from torch's RNG, as it always did;
    # built on the meta device instead, its initialisation would load the compiler stack)
    model = BertModel(cfg)
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in encoder_sd)
    pooler_missing = [k for k in missing if k.startswith("pooler.")]
    if pooler_missing:
        log.info("%s has no pooler weights; the pooler keeps its fresh initialisation", weights_file)
    missing = [k for k in missing if not k.startswith("pooler.")]
    if missing:
        raise MinBertError(f"{weights_file}: missing tensors for {len(missing)} parameters "
                           f"(first: {missing[0]}); the checkpoint does not match {folder / 'config.json'}")
    for k, t in encoder_sd.items():
        if k not in expected:
            raise MinBertError(f"{weights_file}: tensor for '{k}' has no place in the model "
                               f"described by {folder / 'config.json'}")
        if tuple(t.shape) != tuple(expected[k].shape):
            raise MinBertError(f"{weights_file}: tensor '{k}' has shape {tuple(t.shape)}, "
                               f"config.json implies {tuple(expected[k].shape)}")
    model.load_state_dict(encoder_sd, strict=False)
    return model, mlm, folder


def save_hf_folder(folder: Path, model: BertModel, tokenizer_folder: Path | None = None,
                   mlm_head: dict[str, torch.Tensor] | None = None) -> None:
    """Write `model` as a Hugging Face-style folder (config.json + model.safetensors [+ tokenizer]).

    The caller makes this atomic (see `minbert.core.io.atomic_path`).
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "bert", "architectures": ["BertModel"], **model.config.to_dict()}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    sd = minbert_to_hf(model.state_dict())
    for k, t in (mlm_head or {}).items():
        sd[MLM_PREFIX + k] = t.detach().contiguous()
    # the decoder weight is tied to the word embeddings: store one copy only
    sd.pop(MLM_PREFIX + "decoder.weight", None)
    save_file({k: v.cpu() for k, v in sd.items()}, str(folder / "model.safetensors"))
    if tokenizer_folder is not None:
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tokenizer_folder / name).is_file():
                shutil.copy(tokenizer_folder / name, folder / name)
