"""A trained multi-task model as a file (model.pt): a plain dict of tensors and settings, loaded
with `weights_only=True` (no pickle runs), checked, and rebuilt into a model and its tokenizer.

A model trained with the user's code (a head or loss of a module the params name) records it under
`declared`: its tasks of the user's, the modules, and the files of the user's code they ran with the
hash of each (minbert.core.extensions.content_hash). Loading it imports the modules again and
refuses, in one line, a file that is gone or whose code has changed since: the model would answer
with code that did not train it. An export carries copies of those files and the same record, its
paths in its code/ folder (minbert.share.code), and is checked by the same `check_code`.

Whatever a model names as code (a module's path or its importable name, files it carries) is code to
trust: a model that names any module is refused in one line naming them, before anything is
imported, unless the caller trusts it (`trust_remote_code`, as transformers asks it; the pipeline's
own stages trust the models their params made). Trusted, a module is imported from where its record
says its files are (an export's code/, the folder a checkpoint was trained in), and a module of no
recorded file (an installed package's) from the environment only: neither the working folder nor the
export's own folder is on the import path then, so a file lying there is never run for it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from minbert.core.errors import MinBertError
from minbert.core.extensions import content_hash, is_path
from minbert.core.io import torch_save
from minbert.core.plain import SettingsProblem, as_json, read
from minbert.core.registry import Registry, RegistryProblem
from minbert.core.settings import Heads
from minbert.core.tasks import declarations
from minbert.model.bert import BertConfig, BertModel
from minbert.model.multitask import MultitaskModel
from minbert.model.tokenizer import Tokenizer

CHECKPOINT_FORMAT = "minbert-multitask-1"
TRUST_HOW = "load_model(..., trust_remote_code=True) or minbert predict --trust-remote-code"


def declared(model: MultitaskModel) -> dict:
    """What rebuilding the model needs beyond the built-ins: the declarations of its tasks of the
    user's, the user's modules its heads and losses come from, and the files of their code, each with
    its content hash (empty: none)."""
    cfg, registry = model.heads_cfg, model.registry
    tasks = registry.tasks
    modules = registry.user_modules([cfg.head_of(t, tasks) for t in model.tasks],
                                    [cfg.loss_of(t, tasks) for t in model.tasks])
    out = {"tasks": declarations(model.tasks, tasks), "modules": modules,
           "code": {m: dict(registry.code.get(m, ())) for m in modules}}
    return {k: v for k, v in out.items() if v}


def registry_of(found: dict, source: str, home: str | None = None, trust_remote_code: bool = False,
                keep_out: tuple[str, ...] = ()) -> Registry:
    """The registry of a model's declared tasks and modules, its user code checked against the files
    it was trained with and trusted (a one-line error naming `source`), before anything is imported;
    `home`: the folder the code is imported from and its record's paths start in (an export's code/
    folder; a checkpoint's paths are absolute); `keep_out`: folders off the import path of a module of
    no recorded file (beside the working folder)."""
    modules, code = found.get("modules") or [], found.get("code") or {}
    if not (isinstance(modules, list) and all(isinstance(m, str) for m in modules) and isinstance(code, dict)
            and all(isinstance(f, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in f.items())
                    for f in code.values())):
        raise MinBertError(f"{source}: its declared modules and code are not readable; re-run the stage that writes "
                           f"it")
    check_code(found, source, home)
    refuse_untrusted(found, source, trust_remote_code)
    try:
        registry = Registry.of(modules, found.get("tasks") or {}, _homes(found, home, (str(Path.cwd()), *keep_out)))
    except RegistryProblem as e:
        raise MinBertError(f"{source}: the model's {e.key.split('.')[0]}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise MinBertError(f"{source}: its declared tasks or modules are not readable ({type(e).__name__}); re-run "
                           f"the stage that writes it") from None
    return registry


def refuse_untrusted(found: dict, source: str, trust_remote_code: bool, carried_in: str | None = None) -> None:
    """A one-line refusal of a model that names modules (code it runs: a path, an importable name,
    files it carries) unless the caller trusts it; `carried_in`: the folder of an export's copies
    (code/), whose files the line names."""
    modules = found.get("modules") or []
    if not modules or trust_remote_code:
        return
    code = found.get("code") or {}
    carried, named = [], []
    for m in modules:
        files = [f"{carried_in}/{rel}" for rel in code.get(m) or () if not is_path(m) or rel == m] if carried_in else []
        carried += files
        named += [] if files else [f"module '{m}'"]
    what = " and ".join(f"{phrase} ({', '.join(dict.fromkeys(items))})" for phrase, items in
                        (("code that came with it", carried), ("code it names", named)) if items)
    raise MinBertError(f"{source}: the model runs {what}; read it, "
                       f"and load it only if you trust it: {TRUST_HOW}")


def _homes(found: dict, home: str | None, keep_out: tuple[str, ...]) -> dict[str, tuple]:
    """Where each module of a model is imported from, as {module: (home, folders kept off the import
    path)}: the export's code/ folder for what it carries; for a checkpoint, the folder its record
    says the module's own file lay in (None where that is the working folder: imported as the params
    import it); a module named by its name with no recorded file, from the environment alone."""
    code = found.get("code") or {}
    out: dict[str, tuple] = {}
    for module in found.get("modules") or []:
        files = code.get(module) or {}
        root = Path(home) if home is not None and (files or is_path(module)) else \
            _root(module, files) if home is None else None
        if root is not None and root.resolve() == Path.cwd().resolve() and home is None:
            out[module] = (None, ())                      # where it was trained: as the params import it
        elif root is not None:
            out[module] = (str(root), keep_out)
        else:
            out[module] = (None, () if is_path(module) else keep_out)
    return out


def _root(module: str, files) -> Path | None:
    """The folder a module's recorded file is at its name's place in (`ext/heads.py` recorded as
    /proj/ext/heads.py: /proj); None when the record holds no such file."""
    if is_path(module):
        if Path(module).is_absolute():
            return None
        tails = [Path(module.replace("\\", "/"))]
    else:
        tails = [Path(*module.split(".")).with_suffix(".py"), Path(*module.split("."), "__init__.py")]
    for path in files:
        parts = Path(path).parts
        for tail in tails:
            n = len(tail.parts)
            if len(parts) > n and parts[-n:] == tail.parts:
                return Path(*parts[:-n]).resolve()
    return None


def check_code(found: dict, source: str, home: str | Path | None = None) -> None:
    """The one check of a model's user code, for a checkpoint and an export alike: every file its
    record (`declared.code`: {module: {path: hash}}) names is there, with the hash recorded
    (minbert.core.extensions.content_hash); a path starts in `home` when one is given (an export's
    code/ folder, which holds copies of the files that trained it)."""
    redo = "put back the code that trained it, or train the model again" if home is None else \
        "put back the code it came with, or export the model again"
    for module, files in (found.get("code") or {}).items():
        for path, digest in files.items():
            where = Path(home, path) if home is not None else Path(path)
            problem = "is gone" if not where.is_file() else "has changed since" if content_hash(where) != digest else None
            if problem:
                raise MinBertError(f"{source}: the model was trained with the code of module '{module}', and its file "
                                   f"{where} {problem}; {redo}")


def checkpoint_dict(model: MultitaskModel, tokenizer: Tokenizer, **extra) -> dict:
    """The model as a plain dict of tensors and settings (what model.pt holds)."""
    own = declared(model)
    return {
        **({"declared": own} if own else {}),
        "format": CHECKPOINT_FORMAT,
        "encoder_config": model.encoder.config.to_dict(),
        "heads": as_json(model.heads_cfg),
        "tasks": model.tasks,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "tokenizer_json": tokenizer.to_json(),
        "max_length": tokenizer.max_length,
        "calibration": dict(model.calibration),
        **extra,
    }


def save_checkpoint(path, model: MultitaskModel, tokenizer: Tokenizer, **extra) -> None:
    torch_save(checkpoint_dict(model, tokenizer, **extra), path)


def read_checkpoint(path, map_location="cpu") -> dict:
    """A model.pt as its dict, checked: a one-line error for a missing, unreadable or foreign file."""
    path = Path(path)
    if path.is_dir():
        raise MinBertError(f"{path}: is a folder; expected a checkpoint file (re-run the stage that writes it)")
    if not path.is_file():
        raise MinBertError(f"{path}: checkpoint not found; run the stage that writes it first")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise MinBertError(f"{path}: not a readable checkpoint ({type(e).__name__}); re-run the stage "
                           f"that writes it") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise MinBertError(f"{path}: not a minbert multi-task checkpoint; re-run the stage that writes it")
    return ckpt


def stored_heads(heads: dict) -> dict:
    """A checkpoint's heads settings as this version reads them: an earlier version's `sts_loss` is
    `losses.sts` and its `task_heads` are `heads.<task>` now."""
    heads = dict(heads)
    sts_loss = heads.pop("sts_loss", "mse")
    if sts_loss != "mse":
        heads["losses"] = {"sts": sts_loss, **(heads.get("losses") or {})}
    return {**(heads.pop("task_heads", None) or {}), **heads}


def model_from_checkpoint(ckpt: dict, source: str = "checkpoint",
                          trust_remote_code: bool = False) -> tuple[MultitaskModel, Tokenizer]:
    """The model a checkpoint dict describes, in the registry of its own declarations (`declared`;
    an export's dict says where its code is, `code_home`, and its folder, `folder`:
    minbert.share.export.read_export); a model that names modules only with `trust_remote_code`."""
    declared_ = ckpt.get("declared") or {}
    if not isinstance(declared_, dict):
        raise MinBertError(f"{source}: its declared tasks and modules are not readable; re-run the stage that writes it")
    registry = registry_of(declared_, source, ckpt.get("code_home"), trust_remote_code,
                           tuple(f for f in [ckpt.get("folder")] if f))
    try:
        heads = read(Heads, stored_heads(ckpt["heads"]), "heads")
        named = (heads.head_of(t, registry.tasks) for t in ckpt["tasks"])
        unknown = next((h for h in named if h not in registry.heads), None)
        if unknown is not None:
            raise MinBertError(f"{source}: setting 'heads': its head '{unknown}' is neither built in nor of the "
                               f"modules it declares; re-run the stage that writes it")
        encoder = BertModel(BertConfig(**ckpt["encoder_config"]))
        model = MultitaskModel(encoder, heads, ckpt["tasks"], registry)
        model.load_state_dict(ckpt["state_dict"])
        model.calibration = {t: list(v) for t, v in (ckpt.get("calibration") or {}).items()}
    except SettingsProblem as e:
        raise MinBertError(f"{source}: setting '{e.key}': {e}; re-run the stage that writes it") from None
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise MinBertError(f"{source}: the checkpoint does not describe a model this version can build "
                           f"({type(e).__name__}); re-run the stage that writes it") from None
    length, most = ckpt.get("max_length"), model.encoder.config.max_position_embeddings
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= most:
        raise MinBertError(f"{source}: its max_length {repr(length)[:40]} is not a number of word pieces from 1 to "
                           f"{most} (the encoder's positions); re-run the stage that writes it")
    if not isinstance(ckpt.get("tokenizer_json"), str):
        raise MinBertError(f"{source}: it holds no tokenizer; re-run the stage that writes it")
    return model, Tokenizer.from_json(ckpt["tokenizer_json"], length, source)


def check_origin(ckpt: dict, path, experiment: str, stage: str, record_path=None) -> None:
    """The checkpoint is the one `experiment`'s `stage` wrote: its experiment and stage (model.pt says
    them), and the fingerprint of the training run whose record is at `record_path` (when both say
    one). A model.pt copied or moved from another experiment, or from another run (other settings,
    data or code), is refused before any stage reads it."""
    redo = f"re-run its {stage} stage (or put back the experiment's own model)"
    for key, want in (("experiment", experiment), ("stage", stage)):
        got = ckpt.get(key)
        if got is not None and got != want:
            raise MinBertError(f"{path}: the checkpoint was written by the {ckpt.get('stage', '?')} stage of "
                               f"experiment '{ckpt.get('experiment', '?')}', not {stage} of '{experiment}' (copied or "
                               f"moved?); {redo}")
    if record_path is None or not isinstance(ckpt.get("fingerprint"), str):
        return
    try:
        recorded = json.loads(Path(record_path).read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError, RecursionError):
        return                       # no record to compare with (a stage run elsewhere): nothing to say
    if isinstance(recorded, str) and recorded != ckpt["fingerprint"]:
        raise MinBertError(f"{path}: the checkpoint is not the one {stage} of '{experiment}' wrote last (its "
                           f"fingerprint {ckpt['fingerprint'][:12]}, the run record {record_path} says "
                           f"{recorded[:12]}: settings, data or code differ); {redo}")


def load_checkpoint(path, map_location="cpu", expect: dict | None = None,
                    trust_remote_code: bool = False) -> tuple[MultitaskModel, Tokenizer, dict]:
    """Load a model.pt written by `save_checkpoint`: (model, tokenizer, the checkpoint dict).
    `expect`: the experiment, stage and run record it must come from (`check_origin`);
    `trust_remote_code`: run the modules it names (a stage of the pipeline that made it: True)."""
    ckpt = read_checkpoint(path, map_location)
    if expect is not None:
        check_origin(ckpt, path, **expect)
    model, tokenizer = model_from_checkpoint(ckpt, str(path), trust_remote_code)
    return model, tokenizer, ckpt
