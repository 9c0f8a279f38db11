"""The registries of the pluggable things (tasks, losses, heads) as one value: a `Registry`.

A registry holds the built-in tasks, losses and heads, and what a params file adds: the tasks it
declares and the losses and heads of the user's modules it names. It is built when a params file, a
job's settings or a checkpoint is read (`Registry.of`), from those alone, and carried by them
(minbert.params.tasks.Declarations.registry, LoadedParams.registry, MultitaskModel.registry): two
params files read in one process each have their own, and nothing that reads one changes another.
The code that works from one set of settings makes their registry the one in use (`active()`, a
context variable: a stage's run, the planner, a loaded model's predictions), which is what
`minbert.core.tasks.TASKS` and the lookups below read where no registry is passed.

A loss or head is its declaration, apart from its code:
- `LossDeclaration`: name, the task kinds it trains, `batch_statistic`, `calibrate`, what it `reads`;
- `HeadDeclaration`: name, the `view` it reads, its `outputs` ("any": one per class, or one;
  "one": a single number whatever the task), the task `kinds` it serves, the heads `settings` it
  reads, whether it trains over a `frozen_encoder` only.
The params checks, the guards and the planner read declarations only. A built-in loss or head is
one file (minbert/model/losses/, minbert/model/heads/) with one class registered by
`@register_loss` / `@register_head`, as a user's is; its declaration is the literal attributes of
that class, read from the file's source without importing it, so no check imports torch or a
loss's code, and only the jobs that run a loss or head have its file in their code (its module is a
code root of theirs: minbert.pipeline.stage_specs). A user's declaration is read from the class its
module registers (reading the params imports the module). A name taken twice is refused in one
line naming both modules, unless the user's class says it replaces the built-in one
(`@register_loss(replace=True)`).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from minbert.core.errors import close
from minbert.core.extensions import ModuleProblem, defined_in, same_class, use_module
from minbert.core.plain import FrozenMap
from minbert.core.tasks import ACTIVE, BUILTIN_TASKS, KINDS, Task

LOSS_READS = ("outputs", "pairs")
HEAD_VIEWS = ("single", "cross", "bi")
HEAD_OUTPUTS = ("any", "one")
BUILTIN_FOLDERS = {"loss": "losses", "head": "heads"}     # minbert/model/<folder>/<name>.py, one class each
DECORATORS = {"register_loss": "loss", "register_head": "head"}
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")


class RegistryProblem(ValueError):
    """A registry that cannot be built: `key` is the params key at fault (`modules`, `tasks.mine.head`)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, kw_only=True)
class Declaration:
    name: str
    module: str = ""            # a built-in's module name, or the user's module as the params name it
    qualname: str = ""          # its class in that module
    builtin: bool = True
    replace: bool = False       # a user's class meant to take the place of the built-in of its name
    cls: type | None = field(default=None, compare=False, repr=False)   # a user's class (imported)
    source: str = field(default="", compare=False)   # the file that defines it, when not the module's own

    @property
    def where(self) -> str:
        """Its module and class, for messages: `ext/losses.py (class Huber)`, or `ext/losses.py (class
        Huber of ext/helpers.py)` for a class a helper of the module defines."""
        module = self.module.replace(".", "/") + ".py" if self.builtin else self.module
        return f"{module} (class {self.qualname}{f' of {self.source}' if self.source else ''})"


@dataclass(frozen=True, kw_only=True)
class LossDeclaration(Declaration):
    kinds: tuple[str, ...]
    batch_statistic: bool = False
    calibrate: bool = False
    reads: str = "outputs"


@dataclass(frozen=True, kw_only=True)
class HeadDeclaration(Declaration):
    view: str
    outputs: str = "any"
    kinds: tuple[str, ...] = KINDS
    settings: tuple[str, ...] = ()
    frozen_encoder: bool = False


DECLARATIONS = {"loss": LossDeclaration, "head": HeadDeclaration}
# what a class states of itself: its declaration's fields beyond where it is
STATED = {kind: tuple(f.name for f in fields(cls) if f.name not in {f.name for f in fields(Declaration)} | {"name"})
          for kind, cls in DECLARATIONS.items()}
REQUIRED = {"loss": ("name", "kinds"), "head": ("name", "view")}


def declare(kind: str, attrs: Mapping, **where) -> Declaration:
    """The declaration of a `kind` ("loss" or "head") class from what it states (`attrs`), checked:
    `ModuleProblem` naming the module and class when it breaks the contract."""
    values = {k: attrs[k] for k in ("name", *STATED[kind]) if k in attrs}
    missing = [k for k in REQUIRED[kind] if k not in values]
    if missing:
        raise ModuleProblem(f"{_where(where)}: a {kind} class states its `{missing[0]}` as a class attribute "
                            f"(docs/extending.md)")
    for key in ("kinds", "settings"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    decl = DECLARATIONS[kind](**values, **where)
    problem = _problem(decl) or _signature_problem(kind, decl)
    if problem:
        raise ModuleProblem(f"{decl.where}: {problem} (docs/extending.md)")
    return decl


def _where(where: Mapping) -> str:
    return f"{where.get('module', '?')} (class {where.get('qualname', '?')})"


def _problem(d: Declaration) -> str | None:
    if not (isinstance(d.name, str) and d.name and d.name[0].isalnum() and set(d.name) <= NAME_CHARS
            and len(d.name) <= 100):
        return f"`name` {d.name!r} must be letters, digits and _ . + - (what params call it)"
    if not (isinstance(d.kinds, tuple) and d.kinds and all(k in KINDS for k in d.kinds if isinstance(k, str))
            and all(isinstance(k, str) for k in d.kinds)):
        return f"`kinds` {d.kinds!r} must name some of {', '.join(KINDS)}"
    flags = ("batch_statistic", "calibrate") if isinstance(d, LossDeclaration) else ("frozen_encoder",)
    bad = next((f for f in flags if not isinstance(getattr(d, f), bool)), None)
    if bad:
        return f"`{bad}` must be true or false (got {getattr(d, bad)!r})"
    if isinstance(d, LossDeclaration):
        return None if d.reads in LOSS_READS else f"`reads` must be one of {', '.join(LOSS_READS)} (got {d.reads!r})"
    if d.view not in HEAD_VIEWS:
        return f"`view` must be one of {', '.join(HEAD_VIEWS)} (got {d.view!r})"
    if d.outputs not in HEAD_OUTPUTS:
        return f"`outputs` must be one of {', '.join(HEAD_OUTPUTS)} (got {d.outputs!r})"
    if not (isinstance(d.settings, tuple) and all(isinstance(s, str) for s in d.settings)):
        return f"`settings` must be names of heads settings (got {d.settings!r})"
    return None


CALLS = {"loss": ("__call__", "(output, target, pair=None)"), "init": ("__init__", "(in_dim, outputs, hidden_layers, dropout)"),
         "single": ("forward", "(emb)"), "cross": ("forward", "(emb)"), "bi": ("forward", "(u, v)")}


def _signature_problem(kind: str, decl: Declaration) -> str | None:
    """A class whose methods cannot be called as the contract calls them (a loss's `__call__`, a
    head's constructor unless it has a `build`, its `forward` for its view)."""
    if decl.cls is None:
        return None
    calls = ["loss"] if kind == "loss" else (["init"] if not hasattr(decl.cls, "build") else []) + [decl.view]
    for call in calls:
        method, shape = CALLS[call]
        args = shape.strip("()").split(", ")
        try:
            inspect.signature(getattr(decl.cls, method)).bind(None, *(0 for a in args if "=" not in a))
        except (TypeError, ValueError):
            return f"`{method}` cannot be called as {method}{shape}, as every {kind} is"
    return None


def stated(kind: str, cls: type) -> dict:
    """What a registered class states of itself (its attributes, inherited ones included)."""
    return {k: getattr(cls, k) for k in ("name", *STATED[kind]) if hasattr(cls, k)}


# ---------------------------------------------------------------- the built-in ones, from their source

def _literal_attributes(node: ast.ClassDef) -> dict:
    """The class attributes a class body assigns literal values to (`name, kinds = "mse", ("regression",)`)."""
    out = {}
    for stmt in node.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else []
        for target in targets:
            names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
            values = [stmt.value] if isinstance(target, ast.Name) else list(getattr(stmt.value, "elts", []))
            for n, v in zip(names, values):
                try:
                    out[n.id] = ast.literal_eval(v)
                except ValueError:
                    continue      # not a declaration (a computed attribute)
    return out


def _decorated_kind(node: ast.ClassDef) -> str | None:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in DECORATORS:
            return DECORATORS[name]
    return None


def builtin_declarations(kind: str, folder: Path | None = None) -> dict[str, Declaration]:
    """The built-in losses or heads, each from its file's source (not imported)."""
    folder = folder or Path(__file__).resolve().parents[1] / "model" / BUILTIN_FOLDERS[kind]
    out: dict[str, Declaration] = {}
    for path in sorted(folder.glob("[!_]*.py")):
        module = f"minbert.model.{BUILTIN_FOLDERS[kind]}.{path.stem}"
        for node in ast.parse(path.read_bytes(), filename=str(path)).body:
            if isinstance(node, ast.ClassDef) and _decorated_kind(node) == kind:
                decl = declare(kind, _literal_attributes(node), module=module, qualname=node.name)
                if decl.name in out:
                    raise RuntimeError(f"built-in {kind} '{decl.name}' is declared twice ({out[decl.name].where}, "
                                       f"{decl.where})")
                out[decl.name] = decl
    return out


@lru_cache(maxsize=None)
def builtin() -> Registry:
    """The built-in tasks, losses and heads alone."""
    return Registry(FrozenMap(dict(BUILTIN_TASKS)), FrozenMap(builtin_declarations("loss")),
                    FrozenMap(builtin_declarations("head")))


def active() -> Registry:
    """The registry in use (`Registry.active`), or the built-in one where none is."""
    return ACTIVE.get() or builtin()


# ---------------------------------------------------------------- a registry

@dataclass(frozen=True, eq=False)
class Registry:
    tasks: Mapping[str, Task]
    losses: Mapping[str, LossDeclaration]
    heads: Mapping[str, HeadDeclaration]
    modules: tuple[str, ...] = ()           # the user's modules whose losses and heads it holds
    code: Mapping[str, tuple] = field(default_factory=dict)   # module -> the user's files it ran (path, hash)

    @classmethod
    def of(cls, modules: Sequence[str] = (), tasks: Mapping[str, Mapping] | None = None,
           home: str | Path | Mapping[str, tuple] | None = None) -> Registry:
        """The built-in things with the losses and heads of the user's `modules` and the declared
        `tasks` ({name: declaration}); `RegistryProblem` naming the key at fault. `home`: where the
        modules are imported from (minbert.core.extensions.use_module: an export's code/ folder), or
        per module (its home, the folders kept off the import path: a model's modules,
        minbert.model.checkpoint.registry_of)."""
        declared = json.dumps(tasks or {}, sort_keys=True, default=str)
        where = home if isinstance(home, Mapping) else {m: (home, ()) for m in modules}
        try:
            keys = tuple((m, use_module(m, *where.get(m, (None, ())))) for m in modules)
        except ModuleProblem as e:
            raise RegistryProblem("modules", str(e)) from None
        return _registry(keys, declared)

    def __deepcopy__(self, memo) -> Registry:
        return self            # a value nothing changes: a copied model shares its registry

    def __copy__(self) -> Registry:
        return self

    @contextmanager
    def active(self):
        """This registry in use for what runs inside (`active()`, `TASKS`)."""
        token = ACTIVE.set(self)
        try:
            yield self
        finally:
            ACTIVE.reset(token)

    def table(self, kind: str) -> Mapping[str, Declaration]:
        return self.losses if kind == "loss" else self.heads

    def module_of(self, kind: str, name: str) -> str | None:
        """The user's module that registers the `kind` named `name`, or None for a built-in one."""
        decl = self.table(kind).get(name)
        return None if decl is None or decl.builtin else decl.module

    def code_modules(self, heads=(), losses=()) -> list[str]:
        """The modules whose code runs the heads and losses named: the built-in ones' modules and the
        user's modules (code roots of the jobs that run them: minbert.pipeline.code)."""
        named = [("head", n) for n in heads] + [("loss", n) for n in losses]
        return list(dict.fromkeys(self.table(k)[n].module for k, n in named if n in self.table(k)))

    def user_modules(self, heads=(), losses=()) -> list[str]:
        """The user's modules among `code_modules`."""
        named = [("head", n) for n in heads] + [("loss", n) for n in losses]
        return list(dict.fromkeys(m for k, n in named if (m := self.module_of(k, n))))

    def implementation(self, kind: str, name: str) -> type:
        """The class of the `kind` named `name`: a user's as its module registered it; a built-in
        one imported now (its file's source and its class state the same declaration)."""
        decl = self.table(kind)[name]
        return decl.cls if decl.cls is not None else _builtin_class(kind, decl)

    def loss(self, name: str):
        """A loss object of the loss named `name`."""
        return self.implementation("loss", name)()


@lru_cache(maxsize=None)
def _builtin_class(kind: str, decl: Declaration) -> type:
    cls = getattr(importlib.import_module(decl.module), decl.qualname)
    if replace(declare(kind, stated(kind, cls), module=decl.module, qualname=decl.qualname), cls=None) != decl:
        raise RuntimeError(f"{decl.where}: the class states another declaration than its source's literal "
                           f"attributes; state each in the class body")
    return cls


@lru_cache(maxsize=256)
def _registry(modules: tuple, declared: str) -> Registry:
    losses, heads = dict(builtin().losses), dict(builtin().heads)
    for module, imported in modules:
        for kind, cls, replaces in imported.classes:
            source = defined_in(cls)
            shown = _shown(source) if source and source != imported.file else ""
            try:
                decl = declare(kind, stated(kind, cls), module=module, qualname=cls.__qualname__, builtin=False,
                               replace=replaces, cls=cls, source=shown)
            except ModuleProblem as e:
                raise RegistryProblem("modules", str(e)) from None
            _add(losses if kind == "loss" else heads, kind, decl)
    tasks = dict(BUILTIN_TASKS)
    for name, decl in json.loads(declared).items():
        if name in BUILTIN_TASKS:
            raise RegistryProblem(f"tasks.{name}", f"'{name}' is a built-in task; declare yours under another name")
        tasks[name] = Task.declared(name, decl)
        for kind, table in (("head", heads), ("loss", losses)):
            chosen = getattr(tasks[name], kind)
            if chosen not in table:
                raise RegistryProblem(f"tasks.{name}.{kind}", _unknown(kind, chosen, table, [m for m, _ in modules]))
    code = {m: imported.files for m, imported in modules}
    return Registry(FrozenMap(tasks), FrozenMap(losses), FrozenMap(heads),
                    tuple(m for m, _ in modules), FrozenMap(code))


def _add(table: dict, kind: str, decl: Declaration) -> None:
    """`decl` into `table`, where its name may be new, the same class again, or (said so) a built-in's."""
    taken = table.get(decl.name)
    if taken is not None and (same_class(taken.cls, decl.cls) if decl.cls is not None else
                              (taken.module, taken.qualname) == (decl.module, decl.qualname)):
        return            # the same class again (a module named twice, or a helper two modules import)
    if taken is not None and not taken.builtin:
        raise RegistryProblem("modules", f"the {kind} name '{decl.name}' is registered twice: by {taken.where} and "
                                         f"by {decl.where}; rename one of them")
    if taken is not None and not decl.replace:
        raise RegistryProblem("modules", f"{decl.where} registers the {kind} name '{decl.name}', which is built in "
                                         f"({taken.where}); name yours otherwise, or register it with "
                                         f"`@register_{kind}(replace=True)` to use it in place of the built-in one")
    if taken is None and decl.replace:
        raise RegistryProblem("modules", f"{decl.where} says replace=True, and no built-in {kind} is named "
                                         f"'{decl.name}'{close(decl.name, table)}; name the built-in it replaces, or "
                                         f"drop replace=True")
    table[decl.name] = decl


def _shown(path: str) -> str:
    """A file for messages: from the working folder when it lies there."""
    try:
        return Path(path).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path


def _unknown(kind: str, name: str, table: Mapping, modules: list[str]) -> str:
    named = f"the modules named ({', '.join(modules)})" if modules else "a module named in `modules:` (none is)"
    return (f"'{name}' is no {kind}{close(name, table)}: neither built in nor registered by {named} "
            f"({kind}s: {', '.join(table)})")
