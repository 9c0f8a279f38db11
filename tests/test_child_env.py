"""Child processes of the tests import this checkout first and keep what PYTHONPATH already
provides (cluster modules and site setups provide packages through it)."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, child_env


def test_a_child_sees_the_checkout_first_and_the_inherited_path(monkeypatch, tmp_path):
    extra = tmp_path / "site"
    extra.mkdir()
    (extra / "provided_by_the_environment.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    code = "import minbert, provided_by_the_environment as p; print(minbert.__file__); print(p.VALUE)"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].startswith(str(REPO)) and out[1] == "42"


def test_no_test_replaces_the_inherited_path():
    """Every child environment comes from `child_env`, none sets PYTHONPATH to one folder."""
    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name == "conftest.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"""["']PYTHONPATH["']\s*:""", line):
                offenders.append(f"{path.name}:{number}")
    assert not offenders, f"use conftest.child_env instead: {offenders}"
