"""The code a job runs, and its hash: what makes a code edit re-run exactly the jobs it concerns.

A job's code is the import closure of its roots (its stage module, for a pretraining the module of
its kind, and the user's modules its settings name: a path in the project or an importable name)
within the project packages: `import` statements anywhere in a module
(functions included), package `__init__` files (Python runs them first), and the data files a
module declares as part of its code (`CODE_DATA = ("templates",)`); a user's module with its own
helpers, the files of the user's it imports (`module_files`).

Each file is named relative to the project's folder (`code_name`), never to the working folder: a
stage run by hand from another folder, or a run resumed there, is the same job.

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
import hashlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

from minbert.core.extensions import is_path
from minbert.core.provenance import remembered
from minbert.pipeline.kept import KeptByContent, is_code_hash, is_list_of_names

PROJECT_PACKAGES = ("minbert", "stages", "workflow")
NOT_JOB_CODE = {
    "minbert.pipeline.plan": "the planner: what it decides for a job is the job's description",
    "minbert.pipeline.code": "the planner's code closures",
    "minbert.pipeline.kept": "what the planner parsed, kept between processes by content",
    "minbert.pipeline.stage_specs": "the stage specs: what a job reads and writes is its description and job file",
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


def code_closure(*roots: str) -> list[str]:
    """The project files the modules `roots` run: their import closure within the project packages,
    package `__init__` files included, plus declared code data, less `NOT_JOB_CODE` (unless named as
    a root), and each user module's own files (`module_files`). Sorted, each named as a job's
    description names it (`code_name`: never relative to the working folder). Kept for the process
    (a plan asks it once per job, of a few sets of roots)."""
    name = _namer()
    return sorted(name(p) for p in _closure_of(roots))


def code_hashes(*roots: str) -> dict[str, str]:
    """Each file of the closure of `roots`, by its name (`code_name`), with the hash of what it does
    (`code_hash`); once per closure within a plan (minbert.core.provenance.one_pass)."""
    key = ("code", tuple(sorted(roots)), os.getcwd())

    def compute():
        name = _namer()
        return {name(p): code_hash(p) for p in _closure_of(roots)}
    return dict(remembered(key, compute))


def _closure_of(roots) -> list[Path]:
    # the working folder is part of the key only because a user's module may be named by a path
    # relative to it: which files the closure holds, never how they are named
    key = (tuple(sorted(roots)), os.getcwd())
    if key not in _CLOSURES:
        _CLOSURES[key] = _closure(list(roots))
    return _CLOSURES[key]


def project_root() -> Path:
    """The folder holding the project's packages (the checkout, where the engines run)."""
    roots = _package_roots()
    return (roots.get("minbert") or next(iter(roots.values()))).resolve().parent


def code_name(path: str | Path) -> str:
    """How a job's description names a code file: relative to the project's folder when inside it
    (a project package elsewhere: relative to the folder holding it), else its resolved absolute
    path (a user's module outside the project). Never relative to the working folder, so a job
    started from any folder, with any spelling of its paths, is the same job."""
    return _namer()(path)


def _namer():
    """`code_name`, the project's folders looked up once for the many files of a closure."""
    bases = list(dict.fromkeys([project_root(), *(r.resolve().parent for r in _package_roots().values())]))

    def name(path: str | Path) -> str:
        path = Path(path).resolve()
        for base in bases:
            if path.is_relative_to(base):
                return path.relative_to(base).as_posix()
        return path.as_posix()
    return name


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
        if path is None:
            if name in modules:     # a module of the user's that a job's settings name: its files
                own, imports = _user_closure(name)
                files.update(own)
                todo += imports
            continue
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
    processes by the file's content (minbert.pipeline.kept)."""
    st = os.stat(path)
    key = (str(path), name, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _FACTS:
        data = path.read_bytes()
        package = path.name == "__init__.py"

        def facts() -> list:
            tree = ast.parse(data, filename=str(path))
            return [_code_data_names(tree), sorted(_imports(tree, name, package))]

        names, imports = _PARSED.get(data, f"facts {name} {package}", facts,
                                     lambda v: isinstance(v, list) and len(v) == 2 and all(map(is_list_of_names, v)))
        _FACTS[key] = (_code_data(names, path.parent), imports)
    return _FACTS[key]


def user_module_file(module: str) -> Path | None:
    """The file of a user's module (params' `modules:`): a path in the project, or an importable
    name's source file."""
    if is_path(module):
        return Path(module) if Path(module).is_file() else None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


# ---------------------------------------------------------------- a user's module and its own files

def user_roots(roots) -> list[str]:
    """The user's modules among a job's code roots (those outside the project's packages)."""
    return [m for m in roots if m.split(".")[0] not in PROJECT_PACKAGES]


def module_files(module: str) -> list[str]:
    """The files a user's module (params' `modules:`) holds, named as a job's description names them:
    its own file and its helpers, the files of the user's it imports (`_user_closure`)."""
    name = _namer()
    return sorted(name(p) for p in _user_closure(module)[0])


_USER_CLOSURES: dict[tuple, tuple[list[Path], list[str]]] = {}


def _user_closure(module: str) -> tuple[list[Path], list[str]]:
    # kept for the process, as the closures are (a plan asks it for every job that uses the module)
    key = (module, os.getcwd())
    if key not in _USER_CLOSURES:
        _USER_CLOSURES[key] = _walk_user_module(module)
    return _USER_CLOSURES[key]


def _walk_user_module(module: str) -> tuple[list[Path], list[str]]:
    """(the files of the user's `module`, the project modules they import). Its helpers are what its
    import statements (and theirs, in turn) resolve to as Python finds them (its path, then the
    project's folder), found without running anything and kept when they are the user's code:
    inside the project's folder or the module's own, outside the interpreter's libraries and
    installed packages (a loss split into two files is two files of every job that uses it)."""
    first = user_module_file(module)
    if first is None:
        return [], []
    homes = (project_root(), first.resolve().parent)
    libraries = _libraries()
    files: set[Path] = set()
    project: set[str] = set()
    todo = [first.resolve()]
    if not is_path(module):        # an importable name: its packages' `__init__` run first
        todo += [f.resolve() for f in _located(module.split("."), _search_path()) if _users(f.resolve(), homes,
                                                                                             libraries)]
    while todo:
        path = todo.pop()
        if path in files:
            continue
        files.add(path)
        for level, name, names in _user_imports(path):
            if level == 0 and name.split(".")[0] in _package_roots():   # the library: the closure follows it
                project.update([name, *(f"{name}.{n}" for n in names)])
                continue
            found = _import_files(path, level, name, names)
            todo += [f.resolve() for f in found if _users(f.resolve(), homes, libraries)]
    return sorted(files), sorted(project)


_USER_IMPORTS: dict[tuple, list[tuple[int, str, tuple[str, ...]]]] = {}


def _user_imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """Each import statement of a user's file as (level, module, names), parsed once while the file is
    unchanged; a file that does not parse has none (importing it fails anyway)."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _USER_IMPORTS:
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(0, a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.level, node.module or "", tuple(a.name for a in node.names if a.name != "*")))
        _USER_IMPORTS[key] = found
    return _USER_IMPORTS[key]


def _import_files(path: Path, level: int, name: str, names: tuple[str, ...]) -> list[Path]:
    """The source files an import statement in `path` runs, as Python's path finder would find them
    now: each package's `__init__` on the way, the module, and each name that is a submodule."""
    parts = name.split(".") if name else []
    if level:
        folder = path.parent
        for _ in range(level - 1):
            folder = folder.parent
        folders = [folder]
    else:
        folders = _search_path()
    out = _located(parts, folders)
    for n in names:
        out += _located([*parts, n], folders)[len(parts):]
    return out


def _search_path() -> list[Path]:
    """Where an absolute import is looked for: the interpreter's path (a stage started with `python -m`
    has the folder it runs in first), then the project's folder."""
    return [Path(p or os.curdir) for p in sys.path if isinstance(p, str)] + [project_root()]


def _located(parts: list[str], folders: list[Path]) -> list[Path]:
    """The files of the module `parts` found in `folders` in the order Python looks (a package with
    an `__init__`, then a module, in each folder in turn; folders without either are portions of a
    namespace package): the packages' `__init__` files on the way and the module's file."""
    out: list[Path] = []
    for part in parts:
        portions = []
        for folder in folders:
            if (folder / part / "__init__.py").is_file():
                out.append(folder / part / "__init__.py")
                folders = [folder / part]
                break
            if (folder / f"{part}.py").is_file():
                return out + [folder / f"{part}.py"]          # what follows is a name inside it
            if (folder / part).is_dir():
                portions.append(folder / part)
        else:
            if not portions:
                return out
            folders = portions
    return out


def _libraries() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]


def _users(path: Path, homes: tuple[Path, ...], libraries: list[Path]) -> bool:
    """A file of the user's own: inside one of `homes`, not an installed package's or the Python
    library's (a virtual environment inside the project holds those)."""
    if path.suffix != ".py" or any(part in ("site-packages", "dist-packages") for part in path.parts):
        return False
    if any(path.is_relative_to(lib) for lib in libraries):
        return False
    return any(path.is_relative_to(home) for home in homes)


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
        if str(path).endswith(".py"):           # parsed: kept between processes
            _CODE_HASHES[key] = _PARSED.get(data, "hash .py", lambda: _code_hash(data, str(path)), is_code_hash)
        else:
            _CODE_HASHES[key] = _code_hash(data, str(path))
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

_PARSED = KeptByContent("code", (Path(__file__),))
atexit.register(_PARSED.save)
