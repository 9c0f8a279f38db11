"""A trained multi-task model in the Hugging Face format, with a model card: what people share.

The folder (results/exports/<E>/, written by the export stage) holds

    config.json, model.safetensors       the encoder as `BertModel` (transformers.AutoModel loads it)
    tokenizer.json, vocab.txt,           the tokenizer (transformers.AutoTokenizer)
    tokenizer_config.json, special_tokens_map.json
    modules.json, sentence_bert_config.json, 1_Pooling/config.json [, 2_Dense/]
                                          the sentence-transformers pipeline: the encoder, then the
                                          experiment's pooling (`pooler`: the CLS vector through the
                                          pooler's dense layer and tanh, as 2_Dense)
    heads.safetensors, minbert.json      the task heads (and shared layers, branches) and what
                                          rebuilds the multi-task model (minbert.api.load_model)
    cross-encoder-<task>/                 a cross-encoder pair head that sentence_transformers.CrossEncoder
                                          loads (minbert.share.cross: `BertForSequenceClassification`,
                                          or sentence-transformers modules), when the head has such a
                                          form (`cross_encoder_form`)
    code/                                the user's modules a head or loss comes from, with their helper
                                          files (minbert.share.code: checked by content, run only when
                                          trusted)
    README.md                            the model card (minbert.share.card): Hub metadata, scores with
                                          95% intervals, training settings, each task's data, provenance

`read_export` turns the folder back into a checkpoint dict (minbert.model.checkpoint.model_from_checkpoint),
so the pipeline's own code predicts from it. Uploading (`upload`) runs only when asked.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path
from minbert.core.plain import as_json
from minbert.core.provenance import git_revision
from minbert.core.settings import in_own_registry
from minbert.core.tasks import TASKS
from minbert.model.checkpoint import declared, load_checkpoint
from minbert.model.weights import hf_to_minbert, read_config, read_state_dict, save_hf_folder
from minbert.share.card import model_card, scores
from minbert.share.code import carried_code, carried_modules, carry_code
from minbert.share.cross import cross_encoder_form, write_cross_encoder

EXPORT_FORMAT = "minbert-export-1"
MANIFEST = "minbert.json"
HEADS_FILE = "heads.safetensors"
TOKEN_NAMES = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
               "unk_token": "[UNK]"}


# ---------------------------------------------------------------- writing

def write_tokenizer(folder: Path, tokenizer) -> None:
    """tokenizer.json (no truncation or padding of its own: the caller sets them), vocab.txt and
    the configs transformers.AutoTokenizer reads."""
    spec = json.loads(tokenizer.to_json())
    spec["truncation"], spec["padding"] = None, None
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False) + "\n", encoding="utf-8")
    vocab = tokenizer.vocabulary()
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])),
                                      encoding="utf-8")
    lower = bool((spec.get("normalizer") or {}).get("lowercase", True))
    cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": lower, "model_max_length": tokenizer.max_length,
           "clean_up_tokenization_spaces": True, **TOKEN_NAMES}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(TOKEN_NAMES, indent=2) + "\n", encoding="utf-8")


def _json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def write_sentence_transformers(folder: Path, model, max_length: int) -> str:
    """modules.json and the modules' configs: encoder, pooling (and the pooler's dense layer).
    Returns the pooling as the card says it."""
    from safetensors.torch import save_file

    H = model.encoder.config.hidden_size
    pooling = model.heads_cfg.pooling
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    mode = "mean" if pooling == "mean" else "cls"
    _json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": H, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True})
    if pooling == "pooler":
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        _json(folder / "2_Dense" / "config.json", {"in_features": H, "out_features": H, "bias": True,
                                                    "activation_function": "torch.nn.modules.activation.Tanh"})
        dense = model.encoder.pooler.dense
        save_file({"linear.weight": dense.weight.detach().cpu().contiguous(),
                   "linear.bias": dense.bias.detach().cpu().contiguous()}, str(folder / "2_Dense" / "model.safetensors"))
    _json(folder / "modules.json", modules)
    _json(folder / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    _json(folder / "config_sentence_transformers.json", {"model_type": "SentenceTransformer",
                                                         "similarity_fn_name": "cosine", "prompts": {},
                                                         "default_prompt_name": None})
    return {"mean": "mean of the token vectors", "cls": "the [CLS] token's vector",
            "pooler": "the [CLS] vector through the pooler (dense layer and tanh)"}[pooling]


def export_model(model, tokenizer, folder: str | Path, card: str = "", extra: dict | None = None) -> dict:
    """Write the export folder (the caller makes it atomic). Returns what the card needs to say
    of the files: pooling, the cross-encoder forms and the user's modules carried in code/."""
    from safetensors.torch import save_file

    folder = Path(folder)
    model = model.cpu().eval()
    save_hf_folder(folder, model.encoder)
    write_tokenizer(folder, tokenizer)
    pooling = write_sentence_transformers(folder, model, tokenizer.max_length)
    heads = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.startswith("encoder.")}
    save_file(heads, str(folder / HEADS_FILE), metadata={"format": EXPORT_FORMAT})
    own = declared(model)       # the user's tasks and modules, which loading it again needs
    own = carry_code(folder, own) if own.get("code") else own      # with copies of the code they ran
    _json(folder / MANIFEST, {"format": EXPORT_FORMAT, "tasks": model.tasks, "heads": as_json(model.heads_cfg),
                              **({"declared": own} if own else {}), "calibration": model.calibration,
                              "max_length": tokenizer.max_length, **(extra or {})})
    cross, forms = {}, {}
    for task in model.tasks:
        if TASKS[task].pair:
            why = cross_encoder_form(model, task)
            if why is None:
                forms[task] = write_cross_encoder(folder / f"cross-encoder-{task}", model, task, tokenizer)
            cross[task] = why
    if card:
        (folder / "README.md").write_text(card, encoding="utf-8")
    umask = os.umask(0)
    os.umask(umask)
    for p in folder.rglob("*"):          # safetensors writes its files for the owner only: a shared model is readable
        if p.is_file():
            p.chmod(0o666 & ~umask)
    return {"pooling": pooling, "cross": cross, "cross_forms": forms, "code": carried_modules(own), "modules": own.get("modules", [])}


# ---------------------------------------------------------------- what it wrote, and what it may replace

def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_files(folder: Path) -> None:
    """Write into minbert.json the files the export wrote, each with its sha256 (`files`): what a later
    export may replace (`replaceable`), and nothing else."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"] = {rel: _digest(path) for rel, path in _entries(folder) if rel != MANIFEST}
    _json(folder / MANIFEST, manifest)


def _entries(folder: Path, folders: bool = False):
    """(relative path, path) of every file, link and other non-folder entry under `folder` (with
    `folders`, its folders too), sorted; a link to a folder is an entry, never walked into."""
    out = []
    for top, dirs, files in os.walk(folder):
        out += [Path(top, n) for n in files] + [Path(top, n) for n in dirs if folders or Path(top, n).is_symlink()]
    return sorted((p.relative_to(folder).as_posix(), p) for p in out)


def replaceable(out: str | Path, experiment: str, force: bool = False) -> None:
    """A one-line MinBertError unless the folder `out` is missing, empty, or an export of this format
    holding nothing but the files it records as written (each with its content then): the first
    other file is named, and never deleted. Another experiment's export is replaced only with `force`."""
    folder = Path(out).resolve()
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    redo = "give --out a new folder, or move your files out of it"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT or \
            not isinstance(manifest.get("files"), dict):
        raise MinBertError(f"{out}: a folder that is not an export of this version (no {MANIFEST} listing the files "
                           f"it wrote); the export replaces its folder whole: {redo}")
    written = manifest["files"]
    made = {parent.as_posix() for rel in written for parent in Path(rel).parents} - {"."}
    for rel, path in _entries(folder, folders=True):
        if path.is_dir() and not path.is_symlink():
            if rel not in made:
                raise MinBertError(f"{out}: {rel}/ is not a folder the export wrote, and the export replaces its folder "
                                   f"whole: {redo}")
        elif rel != MANIFEST and (path.is_symlink() or not path.is_file() or written.get(rel) != _digest(path)):
            what = "is not a file the export wrote" if rel not in written else "has changed since it was exported"
            raise MinBertError(f"{out}: {rel} {what}, and the export replaces its folder whole: {redo}")
    if manifest.get("experiment") != experiment and not force:
        raise MinBertError(f"{out}: holds the export of experiment '{manifest.get('experiment')}', not '{experiment}'; "
                           f"give --force to replace it, or --out another folder")


# ---------------------------------------------------------------- reading back

def read_export(folder: str | Path, trust_remote_code: bool = False) -> dict:
    """An export folder as a checkpoint dict (minbert.model.checkpoint.model_from_checkpoint builds it).
    The user's code it carries is checked (minbert.share.code.carried_code) and runs only when
    `trust_remote_code`, as any module its manifest names; the dict then says where it is imported
    from (`code_home`) and the folder kept off the import path (`folder`). A damaged folder (a file
    missing, a manifest entry of the wrong type) is one line naming the file."""
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = _manifest(folder)
    declared, home = carried_code(folder, manifest, trust_remote_code)      # before the weights: refused early
    config = read_config(folder)
    sd, weights_file = read_state_dict(folder)
    encoder_sd, _, unexpected = hf_to_minbert(sd, str(weights_file))
    if unexpected:
        raise MinBertError(f"{weights_file}: unexpected tensors ({unexpected[0]}); export the model again")
    try:
        heads = load_file(str(folder / HEADS_FILE))
    except Exception as e:  # a missing or damaged file: safetensors raises its own types
        raise MinBertError(f"{folder / HEADS_FILE}: cannot be read ({type(e).__name__}); export the model again") from None
    try:
        tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinBertError(f"{folder / 'tokenizer.json'}: cannot be read ({type(e).__name__}); export the model "
                           f"again") from None
    return {"format": "minbert-multitask-1", "encoder_config": config.to_dict(), "heads": manifest["heads"],
            "tasks": manifest["tasks"], "state_dict": {**{f"encoder.{k}": v for k, v in encoder_sd.items()}, **heads},
            "tokenizer_json": tokenizer_json, "max_length": manifest["max_length"],
            "calibration": manifest.get("calibration") or {}, **({"declared": declared} if declared else {}),
            **({"code_home": home} if home else {}), "folder": str(folder.resolve())}


MANIFEST_TYPES = {"tasks": (list, "a list of task names"), "heads": (dict, "an object of heads settings"),
                  "max_length": (int, "a whole number of word pieces"),
                  "calibration": ((dict, type(None)), "an object of each task's calibration")}


def _manifest(folder: Path) -> dict:
    """minbert.json, read and its entries' types checked: one line naming the file and the entry."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise MinBertError(f"{path}: cannot be read ({type(e).__name__}); export the model again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        raise MinBertError(f"{path}: not a {EXPORT_FORMAT} manifest; export the model again")
    for key, (kind, what) in MANIFEST_TYPES.items():
        value = manifest.get(key)
        if (key not in manifest and key != "calibration") or isinstance(value, bool) or not isinstance(value, kind):
            raise MinBertError(f"{path}: '{key}' is {_shown(value) if key in manifest else 'missing'}, not {what}; "
                               f"export the model again")
    if not manifest["tasks"] or not all(isinstance(t, str) for t in manifest["tasks"]):
        raise MinBertError(f"{path}: 'tasks' must name the model's tasks; export the model again")
    if not 1 <= manifest["max_length"] <= 1 << 16:
        raise MinBertError(f"{path}: 'max_length' is {manifest['max_length']}, not a length a model reads; export the "
                           f"model again")
    return manifest


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- the Hub

def upload(folder: str | Path, repo_id: str, private: bool = False, revision: str | None = None) -> str:
    """Upload an export folder to a Hub model repository (network; a token from `hf auth login`
    or HF_TOKEN). Never part of a pipeline run. Returns the repository's URL."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    if not (folder / MANIFEST).is_file() or not (folder / "README.md").is_file():
        raise MinBertError(f"{folder}: not an export folder (no {MANIFEST} or README.md); run the export stage "
                           f"(snakemake --cores all results/exports/<experiment>)")
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                          commit_message=f"Upload {folder.name} (minBERT export)")
    except Exception as e:  # huggingface_hub's errors: no token, no network, no permission
        raise MinBertError(f"{repo_id}: upload failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                           f"log in with `hf auth login` (or set HF_TOKEN) and check the network") from None
    return str(url)


# ---------------------------------------------------------------- the export stage

def _rows(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return max(sum(1 for _ in f) - 1, 0)


@in_own_registry
def export_experiment(s, name: str, model_path, training_record, predictions, train_splits: list[str], out_dir,
                      fingerprint: str = "") -> list[str]:
    """The export stage: the experiment's model, its card from its training record (settings,
    fingerprint, git revision), its predictions (scores with intervals) and its training data."""
    # the pipeline's own model, made from the params that name its modules: their code is the user's
    model, tokenizer, ckpt = load_checkpoint(model_path, expect={"experiment": name, "stage": s.model_stage,
                                                                 "record_path": training_record},
                                             trust_remote_code=True)
    try:
        record = json.loads(Path(training_record).read_text(encoding="utf-8"))
        training = record["description"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        raise MinBertError(f"{training_record}: the training run record cannot be read; re-run the "
                           f"{s.model_stage} stage of {name}") from None
    rows = {Path(path).stem.removesuffix("-train"): _rows(path) for path in train_splits}
    provenance = {"experiment": name, "model": f"{s.model_stage}/model.pt, epoch {ckpt.get('epoch', '-')}",
                  "training fingerprint": record.get("fingerprint", "-"),
                  "training git revision": record.get("git_revision", "-"),
                  "export fingerprint": fingerprint or "-", "export git revision": git_revision()}
    with atomic_path(out_dir) as tmp:
        files = export_model(model, tokenizer, tmp, extra={"experiment": name, "model_stage": s.model_stage})
        card = model_card(s, name, files, scores(predictions, s.registry.tasks), training, rows, provenance)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        record_files(tmp)
        written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    return written


__all__ = ["export_model", "export_experiment", "read_export", "model_card", "scores", "upload", "cross_encoder_form"]
