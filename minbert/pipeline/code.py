"""The code a job runs, and its hash: what makes a code edit re-run exactly the jobs it concerns.

A job's code is the import closure of its roots (its stage module, for a pretraining the module of
its kind, and the user's modules its settings name: a path in the project or an importable name)
within the project packages: `import` statements anywhere in a module
(functions included), package `__init__` files (Python runs them first), and the data files a
module declares as part of its code (`CODE_DATA = ("templates",)`).

Left out, each for a reason stated in `NOT_JOB_CODE`: the modules that decide what a job's
description holds (the planner, the params loader, catalogue expansion, the cross-section checks
and the settings resolution): what they decide for a job is in its description already, so an
edit to them re-runs the jobs whose settings it changes and no other; and the one-line messages,
which no job computes with.

Code is hashed as what it does, not how it is written: a Python file's syntax tree without its
docstrings, comments and layout, and without help texts (`Field(description=...)`,
`add_argument(help=...)`), which only the docs and error messages show. Templates and other code
data are hashed byte for byte (their text is what they output).
"""
from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from minbert.core.provenance import remembered

PROJECT_PACKAGES = ("minbert", "stages", "workflow")
NOT_JOB_CODE = {
    "minbert.pipeline.plan": "the planner: what it decides for a job is the job's description",
    "minbert.pipeline.code": "the planner's code closures",
    "minbert.pipeline.registry": "the stage registry: what a job reads and writes is its description and job file",
    "minbert.params.load": "the params loader: a job receives its settings resolved",
    "minbert.params.catalogue": "catalogue expansion (grids, seeds): its result is in the settings",
    "minbert.params.validate": "cross-section checks: they decide what is accepted, not what a job computes",
    "minbert.params.resolve": "the settings of each job, computed from the params: they are in its description",
    "minbert.params.messages": "one-line error messages: text only",
    "minbert.params.docs": "the generated key tables and editor schema",
}
# What a job that reads the params file itself runs (the report, which shows every section): the
# reading and the catalogue expansion shape what it shows, so they are roots of its code and count;
# the checks and their messages only decide what is accepted, and count for no job.
PARAMS_LOADER = ("minbert.params.load", "minbert.params.catalogue")
HELP_TEXT = {"Field": "description", "add_argument": "help"}   # call -> its keyword that only documents


# ---------------------------------------------------------------- the closure

def _package_roots() -> dict[str, Path]:
    roots = {}
    for pkg in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:   # a package, or a folder of modules
            roots[pkg] = Path(list(spec.submodule_search_locations)[0])
    return roots


def _module_file(module: str, roots: dict[str, Path]) -> Path | None:
    top, *rest = module.split(".")
    if top not in roots:
        return None
    base = roots[top].joinpath(*rest)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Modules named by the import statements anywhere in a module (functions included)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)   # `from pkg import submodule`
    return found


def _code_data_names(tree: ast.AST) -> list[str]:
    """What a module declares as part of its code: `CODE_DATA = ("templates",)` (folders or files,
    relative to the module)."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CODE_DATA" for t in node.targets):
            return [str(rel) for rel in ast.literal_eval(node.value)]
    return []


def _code_data(names: list[str], folder: Path) -> list[Path]:
    """The files of a module's declared code data (`_code_data_names`), folders walked."""
    out = []
    for rel in names:
        p = folder / rel
        out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    return out


_CLOSURES: dict[tuple, list[Path]] = {}
_SHOWN: dict[tuple, list[str]] = {}


def code_closure(*roots: str) -> list[str]:
    """The project files the modules `roots` run: their import closure within the project packages,
    package `__init__` files included, plus declared code data, less `NOT_JOB_CODE` (unless named as
    a root). Sorted paths, relative to the working directory when inside it. Kept for the process
    (a plan asks it once per job, of a few sets of roots)."""
    key = tuple(sorted(roots))
    if key not in _CLOSURES:
        _CLOSURES[key] = _closure(list(roots))
    shown = (key, os.getcwd())
    if shown not in _SHOWN:
        _SHOWN[shown] = sorted(_display(p) for p in _CLOSURES[key])
    return list(_SHOWN[shown])


def code_hashes(*roots: str) -> dict[str, str]:
    """Each file of the closure of `roots` with the hash of what it does (`code_hash`); once per
    closure within a plan (minbert.core.provenance.one_pass)."""
    key = ("code", tuple(sorted(roots)), os.getcwd())
    return dict(remembered(key, lambda: {p: code_hash(p) for p in code_closure(*roots)}))


def _closure(modules: list[str]) -> list[Path]:
    roots = _package_roots()
    files: set[Path] = set()
    todo, seen = list(modules), set()
    while todo:
        name = todo.pop()
        if name in seen or (name in NOT_JOB_CODE and name not in modules):
            continue
        seen.add(name)
        path = _module_file(name, roots)
        user = path is None and name in modules       # a module of the user's that a job's settings name
        if user:
            path = user_module_file(name)
        if path is None:
            continue
        if not user:
            parts = name.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]   # parent packages run first
        files.add(path)
        data, imports = _module_facts(path, name)
        files.update(data)
        todo += imports
    return sorted(p.resolve() for p in files)


_FACTS: dict[tuple, tuple[list[Path], list[str]]] = {}


def _module_facts(path: Path, name: str) -> tuple[list[Path], list[str]]:
    """A module's declared code data and the modules it imports, parsed once per process while the
    file is unchanged (the closures of a plan's stages share most modules), and kept between
    processes by the file's content (`_Parsed`)."""
    st = os.stat(path)
    key = (str(path), name, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _FACTS:
        data = path.read_bytes()
        package = path.name == "__init__.py"

        def facts() -> list:
            tree = ast.parse(data, filename=str(path))
            return [_code_data_names(tree), sorted(_imports(tree, name, package))]

        names, imports = _PARSED.get(data, f"facts {name} {package}", facts)
        _FACTS[key] = (_code_data(names, path.parent), imports)
    return _FACTS[key]


def user_module_file(module: str) -> Path | None:
    """The file of a user's module (params' `modules:`): a path in the project, or an importable
    name's source file."""
    if module.endswith(".py") or "/" in module:
        return Path(module) if Path(module).is_file() else None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


# ---------------------------------------------------------------- the hash

class _Documentation(ast.NodeTransformer):
    """Removes what only documents: docstrings and help texts (comments never reach the tree)."""

    def _strip_docstring(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_Module(self, node):
        return self._strip_docstring(self.generic_visit(node))

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = visit_Module

    def visit_Call(self, node):
        self.generic_visit(node)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in HELP_TEXT:
            node.keywords = [k for k in node.keywords
                             if not (k.arg == HELP_TEXT[name] and isinstance(k.value, ast.Constant)
                                     and isinstance(k.value.value, str))]
        return node


_CODE_HASHES: dict[tuple, str] = {}


def code_hash(path: str | Path) -> str:
    """The hash of what a code file does: a Python file's syntax tree without docstrings, comments,
    layout and help texts; any other file (a template) byte for byte. A Python file that does not
    parse is hashed byte for byte too (running it fails anyway). Kept for the process while the file
    is unchanged (its identity, size and times), so a plan of many jobs parses each file once."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _CODE_HASHES:
        data = Path(path).read_bytes()
        _CODE_HASHES[key] = _PARSED.get(data, "hash .py" if str(path).endswith(".py") else "hash",
                                        lambda: _code_hash(data, str(path)))
    return _CODE_HASHES[key]


def _code_hash(data: bytes, path: str) -> str:
    if str(path).endswith(".py"):
        try:
            tree = _Documentation().visit(ast.parse(data, filename=str(path)))
            data = ast.dump(tree, annotate_fields=False, include_attributes=False).encode()
        except (SyntaxError, ValueError):
            pass
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------- kept between processes

class _Parsed:
    """What parsing gives for a file's bytes (its code hash, its imports), kept on disk between
    processes: every plan (each `snakemake`, `dvc repro` and hand run) would otherwise parse the
    hundred modules of the closures again, most of its start-up. Keyed by the SHA-256 of the bytes,
    read afresh each time (never by a file's date), in a file named after this module's own content
    and the Python version (the syntax tree's form), so an edit to either starts a new one. At most
    `MOST` entries (the oldest go); a folder that cannot be written is no error: it only costs the
    parsing."""

    MOST = 20000

    def __init__(self):
        self.entries: dict[str, object] | None = None
        self.new = 0

    @functools.cached_property
    def path(self) -> Path:
        import sys

        salt = hashlib.sha256(Path(__file__).read_bytes() + sys.version.encode()).hexdigest()[:16]
        root = os.environ.get("MINBERT_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "minbert")
        return Path(root) / f"code-{salt}.json"

    def get(self, data: bytes, what: str, compute):
        if self.entries is None:
            self.entries = self._read()
        key = f"{hashlib.sha256(data).hexdigest()} {what}"
        if key not in self.entries:
            self.entries[key] = compute()
            self.new += 1
        return self.entries[key]

    def _read(self) -> dict:
        try:
            found = json.loads(self.path.read_text(encoding="utf-8"))
            return found if isinstance(found, dict) else {}
        except (OSError, ValueError):
            return {}

    def save(self) -> None:
        """Write what this process parsed, merged with what others wrote meanwhile (at exit)."""
        if not self.new:
            return
        merged = {**self._read(), **self.entries}
        keep = dict(list(merged.items())[-self.MOST:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(keep), encoding="utf-8")
            os.replace(tmp, self.path)
            self.new = 0
        except OSError:
            pass


_PARSED = _Parsed()
atexit.register(_PARSED.save)
