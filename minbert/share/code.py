"""The user's code in an export: what makes a model with a head or loss of the user's load anywhere.

A model trained with the user's modules (params.yaml's `modules:`, docs/extending.md) records in its
checkpoint the files of the user's code their import ran, each with its hash (`declared.code`:
minbert.core.extensions, minbert.model.checkpoint). The export copies those files into `code/`,
each at its path in the project (a file of no folder on the import path: under its own name), and
writes the same record with the copies' paths, a module named by its path renamed to its copy's:

    "declared": {"modules": ["my_ext/heads.py"],
                 "code": {"my_ext/heads.py": {"my_ext/heads.py": "<hash>", "my_ext/helpers.py": "<hash>"}}}

Loading it checks the copies against that record with the checkpoint's own check
(minbert.model.checkpoint.check_code), then runs them only when the user says so
(`trust_remote_code`, as transformers asks it): a model's code runs with the user's rights. The
modules are imported from code/, which stands for the project's folder (`use_module`'s `home`),
whatever the working folder. A module that is no file of the user's (an installed package's)
records none: it is imported by name, from the environment alone (neither the working folder nor the
export's folder on the import path), and only with the same trust: a manifest that names any module
names code to run.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.extensions import is_path
from minbert.model.checkpoint import check_code, refuse_untrusted

CODE_FOLDER = "code"


# ---------------------------------------------------------------- writing

def _bases(project: Path) -> list[Path]:
    """Where a file's place under code/ is counted from: the project's folder (a module named by its
    path imports its helpers from there first), then the other folders of the import path, the
    deepest first."""
    others = {Path(p or ".").resolve() for p in sys.path if isinstance(p, str)} - {project}
    return [project, *sorted((p for p in others if p.is_dir()), key=lambda p: -len(p.parts))]


def _place(path: Path, bases: list[Path]) -> str:
    return next((path.relative_to(b).as_posix() for b in bases if path.is_relative_to(b)), path.name)


def carry_code(folder: Path, own: dict, project: str | Path = ".") -> dict:
    """Copy the files of the model's user code (`own`: its declarations as the checkpoint records
    them) into folder/code; the export's declarations: the same record, its paths the copies', checked."""
    project = Path(project).resolve()
    bases = _bases(project)
    renamed = {m: _place(Path(m).resolve(), bases) if is_path(m) else m for m in own.get("modules", [])}
    placed: dict[str, str] = {}
    record: dict[str, dict[str, str]] = {}
    for module, files in (own.get("code") or {}).items():
        record[renamed.get(module, module)] = {}
        for path, digest in sorted(files.items()):
            rel = _place(Path(path), bases)
            if placed.setdefault(rel, path) != path:
                raise MinBertError(f"module {module}: two files would be carried as {CODE_FOLDER}/{rel} ({placed[rel]} "
                                   f"and {path}); give your modules' files different names")
            target = folder / CODE_FOLDER / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            record[renamed.get(module, module)][rel] = digest
    out = {**own, "modules": [renamed[m] for m in own.get("modules", [])], "code": record}
    check_code(out, str(folder), folder / CODE_FOLDER)        # the copies are the files that trained it
    return {k: v for k, v in out.items() if v}


def carried_modules(own: dict) -> list[str]:
    """The modules whose code an export's declarations carry (what the card names)."""
    return [m for m in own.get("modules", []) if (own.get("code") or {}).get(m)]


# ---------------------------------------------------------------- loading it

def _readable(declared, base: Path) -> bool:
    """An export's declarations as this version writes them: names as strings, every module named by
    its path and every recorded file a path inside code/."""
    def inside(rel) -> bool:
        return isinstance(rel, str) and bool(rel) and not Path(rel).is_absolute() and \
            (base / rel).resolve().is_relative_to(base.resolve())

    if not isinstance(declared, dict):
        return False
    modules, code = declared.get("modules") or [], declared.get("code") or {}
    if not (isinstance(modules, list) and all(isinstance(m, str) for m in modules) and isinstance(code, dict)):
        return False
    return all(inside(m) for m in modules if is_path(m)) and all(
        isinstance(files, dict) and all(inside(rel) and isinstance(h, str) for rel, h in files.items())
        for files in code.values())


def carried_code(folder: Path, manifest: dict, trust_remote_code: bool = False) -> tuple[dict, str | None]:
    """An export's declarations, its code checked (check_code) and trusted: (declared, the folder the
    code is imported from, None when it carries none); a one-line error otherwise."""
    declared = {} if manifest.get("declared") is None else manifest["declared"]
    base = folder / CODE_FOLDER
    if not _readable(declared, base):
        raise MinBertError(f"{folder / 'minbert.json'}: its declared modules and code are not what this version "
                           f"writes; export the model again (minbert export EXPERIMENT)")
    code = declared.get("code") or {}
    missing = [m for m in declared.get("modules") or [] if is_path(m) and m not in code.get(m, {})]
    if missing:
        raise MinBertError(f"{folder}: the model needs the modules {', '.join(missing)}, and the folder does not carry "
                           f"their code (exported by an earlier version); export it again: minbert export EXPERIMENT")
    check_code(declared, str(folder), base)
    refuse_untrusted(declared, str(folder), trust_remote_code, carried_in=CODE_FOLDER)
    return declared, str(base) if any(code.values()) else None
