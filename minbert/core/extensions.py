"""The user's own modules (params.yaml's `modules:`, docs/extending.md) and what they register.

A module is named by a path in the project (`extensions/heads.py`) or an importable name
(`my_package.losses`). Importing it runs its registrations: `@register_loss` and `@register_head`
(minbert.core.register) note each class; what a module's import noted is that module's, and
the registry of a params file that names the module (minbert.core.registry) takes those classes as
its losses and heads, by their names. Nothing here is a registry: a module imported for one params
file adds nothing to another's.

A module is imported once per process and content (an edited file is imported anew); one that
cannot be imported (an exception, or `sys.exit` while it is imported) is one line naming it
(`ModuleProblem`). Importing is safe from any thread: one process-wide lock holds while a module is
imported (the import path and `sys.modules` are the process's), and each import takes the classes
registered while it ran (a collector of its own), never another thread's. A class is one class by
where it is defined (its file and content, its qualified name): a helper that registers a class and is
imported by two modules (anew for each: a module named by its path keeps no helper for another)
registers it once. Beside its classes, an import notes the files of the user's code it ran (the
module's own and the helper files it imports), with their content hashes: what a checkpoint made
with the code records (minbert.model.checkpoint), and what an export copies and records as well
(minbert.share.code), to be imported from its own folder (`use_module(..., home=)`).

A head of your own is an `nn.Module` class with a `name`, the `view` it reads (`single`: one
sentence's vector; `cross`: a cross-encoded pair's; `bi`: the two sentences' vectors u, v) and a
constructor `(in_dim, outputs, hidden_layers, dropout)`; `forward(emb)` (single, cross) or
`forward(u, v)` (bi) returns (B, outputs) logits, or (B,) for one output. The library's own heads
(minbert.model.heads) are registered the same way.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import sysconfig
import threading
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

LIBRARY = ("minbert", "stages", "workflow")    # the project's own packages: never the user's code
_REGISTERED: list[tuple[str, type, bool]] = []  # every class registered in this process: (kind, class, replace)
_COLLECTOR: ContextVar[list | None] = ContextVar("minbert_registrations", default=None)   # the running import's
_ORIGIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # class -> (its file, content hash, qualname)
_LOCK = threading.RLock()            # held while a user's module is imported: sys.path and sys.modules are shared


class ModuleProblem(ValueError):
    """A module of the user's that cannot be imported, or a class it registers that breaks the
    contract (one line; the caller says where the module is named)."""


def note_registration(kind: str, cls: type, replace: bool = False) -> type:
    """Note that `cls` is registered as a `kind` ("loss" or "head"); `replace`: it is meant to take
    the place of the built-in of its name (minbert.core.registry refuses any other taken name)."""
    if not isinstance(cls, type):
        raise TypeError(f"@register_{kind} decorates a class, not {cls!r}")
    entry = (kind, cls, bool(replace))
    _REGISTERED.append(entry)
    collector = _COLLECTOR.get()
    if collector is not None:
        collector.append(entry)
    path = _file_of(sys.modules.get(cls.__module__))
    if path is not None:
        _ORIGIN[cls] = (path, content_hash(path), cls.__qualname__)
    return cls


def defined_in(cls: type) -> str | None:
    """The user's file that defines a registered class (None: the library's, or a file no more)."""
    origin = _ORIGIN.get(cls)
    return origin[0] if origin else None


def same_class(a: type | None, b: type | None) -> bool:
    """One class: the same object, or the same definition (file, content, qualified name) imported
    twice (a helper that registers it, imported anew by two modules)."""
    return a is b or (a is not None and b is not None and _ORIGIN.get(a) is not None
                      and _ORIGIN.get(a) == _ORIGIN.get(b))


@dataclass(frozen=True)
class Imported:
    """What importing one of the user's modules gave: the classes it registered (kind, class,
    replace), the files of the user's code it ran (path, content hash) and its own file."""
    module: str
    classes: tuple[tuple[str, type, bool], ...]
    files: tuple[tuple[str, str], ...]
    file: str | None = None


_IMPORTED: dict[tuple, Imported] = {}


def is_path(module: str) -> bool:
    """A module named by its file (a path in the project) rather than by an importable name."""
    return module.endswith(".py") or "/" in module or "\\" in module


_HASHES: dict[tuple, str] = {}


def content_hash(path: str | Path) -> str:
    """The hash of a code file's content as Python reads it (its syntax tree: comments and layout
    do not count), or of its bytes when it does not parse; computed once while the file is unchanged."""
    st = Path(path).stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = _hash(Path(path).read_bytes())
    return _HASHES[key]


def _hash(data: bytes) -> str:
    try:
        data = ast.dump(ast.parse(data), include_attributes=False).encode()
    except (SyntaxError, ValueError):
        pass
    return hashlib.sha256(data).hexdigest()[:16]


def use_module(module: str, home: str | Path | None = None, keep_out: tuple[str, ...] = ()) -> Imported:
    """Import the user's module (once per process, content and home) and say what it registered and
    which files of the user's it ran; `ModuleProblem`, in one line, when it cannot be imported.
    `home`: the folder that stands for the project's (a module's path starts there, its helpers are
    imported from there first): the working folder by default; an export's code/ folder for the code
    it carries, kept apart from any module of the same names imported before (`_apart`). `keep_out`:
    folders that are not on the import path while it is imported (a model's: the working folder and
    the export's own, so that a module named by its name comes from the environment). Safe from any
    thread (one lock)."""
    with _LOCK:
        home = None if home is None else str(Path(home).resolve())
        key = _key(module, home, tuple(sorted({str(Path(f).resolve()) for f in keep_out} - {home})))
        if key not in _IMPORTED:
            _IMPORTED[key] = _import(module, key)
        return _IMPORTED[key]


def _key(module: str, home: str | None, keep_out: tuple[str, ...]) -> tuple:
    if not is_path(module):
        return ("name", module, home, keep_out)
    path = Path(home, module) if home is not None else Path(module)
    if not path.is_file():
        raise ModuleProblem(f"no file {module}; give a path from the project's folder or an importable module name")
    return ("path", str(path.resolve()), home, content_hash(path), keep_out)


def _import(module: str, key: tuple) -> Imported:
    home = key[2]
    with _apart(Path(home)) if home is not None else contextlib.nullcontext(), _path_without(key[-1]):
        return _run(module, key, home or os.getcwd())


def _run(module: str, key: tuple, home: str) -> Imported:
    before, collected = set(sys.modules), []
    where = hashlib.sha256(key[1].encode()).hexdigest()[:8] if key[0] == "path" else ""
    stem = "".join(c if c.isalnum() else "_" for c in Path(module).stem)
    name = f"minbert_user.{stem}_{where}_{key[3]}" if key[0] == "path" else module
    token = _COLLECTOR.set(collected)
    try:
        if key[0] == "path":
            spec = importlib.util.spec_from_file_location(name, key[1])
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded
            with _first_on_path(home):
                spec.loader.exec_module(loaded)
        else:
            loaded = importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:   # the user's code: any failure, an exit too, is that module's, in one line
        sys.modules.pop(name, None)
        raise ModuleProblem(f"module '{module}' cannot be imported ({_reason(e)}); fix it or remove it from "
                            f"modules") from None
    finally:
        _COLLECTOR.reset(token)
    ran = {m for m in set(sys.modules) - before} | {loaded.__name__}
    classes = [(k, c, r) for k, c, r in collected if not _library(c.__module__)]
    classes += [entry for entry in _registered_before(loaded) if entry not in classes]
    files = sorted({f for f in (_file_of(sys.modules.get(m)) for m in ran) if f is not None})
    if key[0] == "path":        # its helpers, imported from this project's folder, are not kept for another's
        for m in [m for m in ran - {name} if _helper(sys.modules.get(m), home)]:
            del sys.modules[m]
    return Imported(module, tuple(classes), tuple((f, content_hash(f)) for f in files), _file_of(loaded))


def _registered_before(loaded) -> list[tuple[str, type, bool]]:
    """The classes registered before this import by the module itself or by a module of the user's it
    imported that was imported already (so its registrations did not run again): the classes and
    modules its namespace holds."""
    names = {loaded.__name__} | {v.__name__ for v in vars(loaded).values()
                                 if isinstance(v, type(sys)) and not _library(v.__name__)}
    held = {id(v) for v in vars(loaded).values() if isinstance(v, type)}
    return [(k, c, r) for k, c, r in _REGISTERED if not _library(c.__module__)
            and (c.__module__ in names or id(c) in held)]


def _helper(module, home: str) -> bool:
    """A module of the user's that a module named by its path imported: a file of theirs, or a folder
    of the project's folder imported as a package of no `__init__`."""
    if module is None or _library(module.__name__):
        return False
    if _file_of(module) is not None:
        return True
    folders = getattr(module, "__path__", None) if getattr(module, "__file__", None) is None else None
    return bool(folders) and all(Path(f).resolve().is_relative_to(Path(home).resolve()) for f in folders)


@contextlib.contextmanager
def _first_on_path(home: str):
    """The project's folder (where a module's path starts) first on the import path while a module
    named by its path runs, so that it imports its helpers as `folder.helper` from there, as a
    script of the project's would."""
    sys.path.insert(0, home)
    try:
        yield
    finally:
        sys.path.remove(home)


@contextlib.contextmanager
def _path_without(folders: tuple[str, ...]):
    """The import path without `folders` (and without "", the working folder, when it is one of them)
    while a model's module is imported: a file that happens to lie there is not imported for it."""
    if not folders:
        yield
        return
    def out(entry) -> bool:
        try:
            return isinstance(entry, str) and str(Path(entry or ".").resolve()) in folders
        except (OSError, RuntimeError, ValueError):
            return False
    saved = list(sys.path)
    sys.path[:] = [e for e in saved if not out(e)]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved


@contextlib.contextmanager
def _apart(home: Path):
    """While a module is imported from `home` (not the working folder), the names of home's files
    and folders are home's alone: the modules of those names imported before (the project's own) are
    set aside, and given back after, while home's copies are not kept for anyone else."""
    tops = {p.stem if p.is_file() else p.name for p in home.iterdir() if p.suffix == ".py" or p.is_dir()}
    mine = {t for t in tops if t.isidentifier() and not _library(t)}
    before = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in mine}
    sys.path.insert(0, str(home))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(home))
        for n in [n for n in sys.modules if n.split(".")[0] in mine]:
            del sys.modules[n]
        sys.modules.update(before)


def _reason(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"it calls sys.exit({e.code!r}) while it is imported"
    reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {reason}" if reason else type(e).__name__


def _library(module_name: str) -> bool:
    return module_name.split(".")[0] in LIBRARY


_INSTALLED = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})


def _file_of(module) -> str | None:
    """The source file of a module the user's import ran, unless it is the library's or installed."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or _library(getattr(module, "__name__", "")):
        return None
    if not os.path.isabs(path) or not os.path.isfile(path):      # a module that only names a file
        return None
    resolved = str(Path(path).resolve())
    return None if resolved.startswith(_INSTALLED) else resolved


def __getattr__(name: str):
    """`register_head`, imported from here by modules written before minbert.core.register held it."""
    if name == "register_head":
        from minbert.core import register  # register imports this module: imported when first asked for

        return register.register_head
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
