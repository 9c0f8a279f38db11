"""The user's code in an export: what makes a model with a head or loss of the user's load anywhere.

A model trained with the user's modules (params.yaml's `modules:`, docs/extending.md) needs their
code to be rebuilt. The export carries it in `code/`: each module and the helper files it imports
from the project (found by reading its import statements, never by running it), at their paths
in the project, and the manifest (minbert.json) records each file's SHA-256:

    "code": {"files":   {"my_ext/heads.py": "<sha256>", "my_ext/helpers.py": "<sha256>"},
             "modules": {"my_ext/heads.py": "my_ext/heads.py"},       # as params named it -> its copy
             "imports": {"my_ext.helpers": "my_ext/helpers.py"},      # import names -> their copies
             "installed": []}                                         # modules not in the project

Loading it (`load_carried`) checks every file's content against the manifest, then runs the code
only when the user says so (`trust_remote_code`, as transformers asks it): a model's code runs
with the user's rights. The copies are imported from the export folder, whatever the working
folder: a module named by its path is loaded from its copy's path (the checkpoint's module list
is rewritten to those paths, the seam with minbert.core.extensions), an import of a carried name
resolves to its copy and to nothing else of the folder. A module that is no file of the project (an
installed package's) is not carried: it is imported by name, from the environment.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import shutil
import sys
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.extensions import is_path, use_module

CODE_FOLDER = "code"
PIPELINE_PACKAGES = ("minbert", "stages", "workflow")   # the pipeline's own code: installed wherever it loads
MAX_CODE_FILES = 200                                    # the helper files a module may bring (a bound on the walk)
TRUST_HOW = "load_model(..., trust_remote_code=True) or minbert predict --trust-remote-code"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- finding a module's files

def _outside_project(path: Path, root: Path) -> bool:
    """Not the project's own: outside its folder, or an environment's (a virtual environment in it)."""
    try:
        rel = path.resolve().relative_to(root)
    except ValueError:
        return True
    return any(p in ("site-packages", "dist-packages") or p.startswith(".") for p in rel.parts)


def _imported_names(tree: ast.AST, package: str) -> set[str]:
    """The module names an import statement anywhere in the file names (`from a import b`: a and a.b)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not package:
                    continue          # a relative import of a module loaded by its path: Python refuses it too
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in found if n and n.split(".")[0] not in PIPELINE_PACKAGES}


def _resolve(name: str, roots: list[Path], project: Path) -> list[tuple[str, Path]]:
    """The project files importing `name` runs: its packages' __init__.py files and its own, with
    their import names; [] for a name the project has no file for (the standard library, a package)."""
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file() and not _outside_project(cand, project):
                inits = [(".".join(parts[:i]), root.joinpath(*parts[:i], "__init__.py")) for i in range(1, len(parts))]
                return [(n, p) for n, p in inits if p.is_file()] + [(name, cand)]
    return []


def module_files(module: str, project: Path) -> tuple[Path, dict[str, Path]] | None:
    """A user's module's file and its helpers' ({import name: file}), all in the project; None for a
    module that is not a file of the project (an installed package's: not carried)."""
    if is_path(module):
        main = Path(module) if Path(module).is_absolute() else project / module
        if not main.is_file():
            raise MinBertError(f"module {module}: no file {main}; export from the project's folder, where params.yaml "
                               f"names it")
    else:
        found = _resolve(module, [project], project)
        if not found:
            return None
        main = found[-1][1]
    roots = [project, main.parent.resolve()]
    helpers: dict[str, Path] = {}
    todo = [(None if is_path(module) else module, main)]
    while todo:
        name, path = todo.pop()
        package = "" if name is None else name if path.name == "__init__.py" else name.rpartition(".")[0]
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue               # it ran when the model was trained; its bytes are carried as they are
        for imported in sorted(_imported_names(tree, package)):
            for helper_name, helper in _resolve(imported, roots, project):
                if helper_name not in helpers and helper.resolve() != main.resolve():
                    helpers[helper_name] = helper
                    todo.append((helper_name, helper))
        if len(helpers) > MAX_CODE_FILES:
            raise MinBertError(f"module {module}: imports more than {MAX_CODE_FILES} files of the project; keep a "
                               f"module's code in a few files")
    return main, helpers


def _place(path: Path, project: Path) -> str:
    """Where a file goes under code/: its path in the project (a module outside it: its file name)."""
    try:
        return path.resolve().relative_to(project).as_posix()
    except ValueError:
        return path.name


def write_code(folder: Path, modules: list[str], project: str | Path = ".") -> dict:
    """Copy the modules' files into folder/code and return the manifest's `code` section ({} for none)."""
    project = Path(project).resolve()
    out = {"files": {}, "modules": {}, "imports": {}, "installed": []}
    for module in modules:
        found = module_files(module, project)
        if found is None:
            out["installed"].append(module)
            continue
        main, helpers = found
        out["modules"][module] = _place(main, project)
        out["imports"].update({name: _place(p, project) for name, p in helpers.items()})
        if not is_path(module):
            out["imports"][module] = out["modules"][module]
        for path, rel in [(main, out["modules"][module])] + [(p, _place(p, project)) for p in helpers.values()]:
            target = folder / CODE_FOLDER / rel
            if rel in out["files"] and sha256(target) != sha256(path):
                raise MinBertError(f"module {module}: two files would be carried as {CODE_FOLDER}/{rel}; give your "
                                   f"modules different names")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            out["files"][rel] = sha256(target)
    return {k: v for k, v in out.items() if v}


# ---------------------------------------------------------------- loading it

def _section(folder: Path, manifest: dict) -> dict:
    """The manifest's code section, checked: every name a string, every file a path inside code/."""
    where = folder / "minbert.json"
    code = manifest.get("code") or {}
    ok = isinstance(code, dict) and all(isinstance(code.get(k, {}), dict) for k in ("files", "modules", "imports")) \
        and isinstance(code.get("installed", []), list)
    files = code.get("files", {}) if ok else {}
    places = list(files) + list(code.get("modules", {}).values()) + list(code.get("imports", {}).values()) if ok else []
    base = (folder / CODE_FOLDER).resolve()
    for rel in places:
        if not isinstance(rel, str) or rel not in files or not (base / rel).resolve().is_relative_to(base):
            ok = False
    if not ok or not all(isinstance(h, str) for h in files.values()):
        raise MinBertError(f"{where}: its 'code' section is not one this version wrote; export the model again")
    return code


def load_carried(folder: str | Path, manifest: dict, trust_remote_code: bool = False) -> list[str]:
    """Check and import the user's code an export carries; returns the checkpoint's module list with
    each carried module named by its copy's path (what minbert.core.extensions imports it by)."""
    folder = Path(folder)
    modules = list((manifest.get("declared") or {}).get("modules") or [])
    code = _section(folder, manifest)
    missing = [m for m in modules
               if m not in code.get("modules", {}) and (is_path(m) or m not in code.get("installed", []))]
    if missing:
        raise MinBertError(f"{folder}: the model needs the modules {', '.join(missing)}, and the folder does not carry "
                           f"their code (exported by an earlier version); export it again: minbert export EXPERIMENT")
    for rel, recorded in code.get("files", {}).items():
        path = folder / CODE_FOLDER / rel
        got = sha256(path) if path.is_file() else "missing"
        if got != recorded:
            raise MinBertError(f"{path}: not the file the export recorded (sha256 {got[:12]}, recorded "
                               f"{recorded[:12]}); put back the exported file or export the model again")
    if code.get("files") and not trust_remote_code:
        carried = ", ".join(f"{CODE_FOLDER}/{m}" for m in code.get("modules", {}).values())
        raise MinBertError(f"{folder}: the model runs code that came with it ({carried}); read it, and load it only if "
                           f"you trust it: {TRUST_HOW}")
    copies = {m: str((folder / CODE_FOLDER / rel).resolve()) if is_path(m) else m
              for m, rel in code.get("modules", {}).items()}
    imports = {name: (folder / CODE_FOLDER / rel).resolve() for name, rel in code.get("imports", {}).items()}
    with _carried_imports(imports):
        for module in modules:
            use_module(copies.get(module, module), where=str(folder / "minbert.json"))
    return [copies.get(m, m) for m in modules]


class _Carried(importlib.abc.MetaPathFinder):
    """Import names -> the export's copies, ahead of every other finder; nothing else of the folder
    is importable (a package's own search path is empty: an unrecorded file there is never run)."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.namespaces = {".".join(n.split(".")[:i]) for n in files for i in range(1, n.count(".") + 1)} - set(files)

    def find_spec(self, name, path=None, target=None):
        if name in self.files:
            f = self.files[name]
            return importlib.util.spec_from_file_location(
                name, f, submodule_search_locations=[] if f.name == "__init__.py" else None)
        if name in self.namespaces:
            return importlib.machinery.ModuleSpec(name, None, is_package=True)
        return None


@contextlib.contextmanager
def _carried_imports(files: dict[str, Path]):
    """While importing the carried modules, their helpers' names resolve to the copies; after, a name
    that another module of that name held before (the project's own) is given back to it."""
    finder = _Carried(files)
    names = set(files) | finder.namespaces
    before = {n: sys.modules.pop(n) for n in list(sys.modules) if n in names}
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(before)
