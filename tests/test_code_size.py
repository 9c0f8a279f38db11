"""The code is cut along its concerns: no module over 500 lines, no function over 60 lines (its whole
definition) or with more than 8 parameters (self and cls not counted), in minbert/, stages/ and
workflow/."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 60, 8
FOLDERS = ("minbert", "stages", "workflow")


def functions(tree):
    """Each function of a module (methods and nested ones included) with its parameters' names."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
            yield node, [n for n in names if n not in ("self", "cls")]


def too_big(path: Path, root: Path = REPO) -> list[str]:
    """What in one module is over the limits, one line each."""
    text, name = path.read_text(), path.relative_to(root).as_posix()
    out = [f"{name}: {len(text.splitlines())} lines"] if len(text.splitlines()) > MAX_MODULE_LINES else []
    for node, params in functions(ast.parse(text)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES or len(params) > MAX_PARAMETERS:
            out.append(f"{name}:{node.lineno} {node.name}: {lines} lines, {len(params)} parameters")
    return out


def test_modules_and_functions_are_small():
    paths = sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))
    assert len(paths) > 100
    found = [line for path in paths for line in too_big(path)]
    assert not found, "\n".join(found)


def test_the_measure_finds_a_long_function_and_many_parameters():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def f(a, b, c, d, e, f, g, h, i):\n{long_body}\n\nclass C:\n    def m(self, a):\n        pass\n")
    measured = {node.name: (node.end_lineno - node.lineno + 1, len(params)) for node, params in functions(tree)}
    assert measured == {"f": (MAX_FUNCTION_LINES + 1, 9), "m": (2, 1)}


def test_a_long_module_is_found(tmp_path):
    path = tmp_path / "minbert" / "long.py"
    path.parent.mkdir()
    path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert too_big(path, tmp_path) == [f"minbert/long.py: {MAX_MODULE_LINES + 1} lines"]
