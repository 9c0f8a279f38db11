"""scripts/install.sh on a Python its distribution manages (PEP 668: Debian's own /usr/bin/python3),
with no virtual environment active: it creates and uses the project's .venv/ (saying so) instead
of stopping at pip's `externally-managed-environment`, and `. scripts/activate` then puts the venv
first on PATH; with a virtual environment active it installs there and makes none.

The pip steps are pointed at an empty package index here, so each run stops at its first pip
install: what is tested is which interpreter it reached (seconds, no packages installed); the full
installation is the same script CI runs (.ci/run)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PY = Path("/usr/bin/python3")


def externally_managed(py: Path) -> bool:
    code = ("import os, sys, sysconfig; sys.exit(0 if os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), "
            "'EXTERNALLY-MANAGED')) and sys.prefix == sys.base_prefix else 1)")
    return py.is_file() and subprocess.run([str(py), "-c", code]).returncode == 0 and \
        subprocess.run([str(py), "-c", "import venv, ensurepip"], capture_output=True).returncode == 0


needs_managed_python = pytest.mark.skipif(
    not externally_managed(SYSTEM_PY),
    reason="no externally managed /usr/bin/python3 with venv (Debian: apt-get install python3 python3-venv)")


def copy_scripts(dest: Path) -> Path:
    (dest / "scripts").mkdir(parents=True)
    for name in ("install.sh", "activate"):
        shutil.copy2(REPO / "scripts" / name, dest / "scripts" / name)
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def install(folder: Path, tmp_path: Path, **env):
    """install.sh with pip offline and an empty index: it gets as far as its first `pip install`."""
    empty = tmp_path / "no-packages"
    empty.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PIP_BREAK_SYSTEM_PACKAGES")}
    base.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty), "PIP_CONFIG_FILE": os.devnull,
                 "PYTHON": str(SYSTEM_PY), **env})
    return subprocess.run(["bash", "scripts/install.sh"], cwd=folder, env=base, capture_output=True, text=True,
                          timeout=300)


@needs_managed_python
def test_a_system_managed_python_installs_into_the_project_venv(tmp_path):
    folder = copy_scripts(tmp_path / "repo")
    # the situation: pip refuses to install into Debian's own Python
    r = subprocess.run([str(SYSTEM_PY), "-m", "pip", "install", "--dry-run", "tqdm"], capture_output=True, text=True)
    assert r.returncode != 0 and "externally-managed-environment" in r.stderr + r.stdout

    r = install(folder, tmp_path)
    assert "is managed by the system (PEP 668); installing into a virtual environment of the project, .venv/" in r.stderr
    assert "externally-managed-environment" not in r.stderr
    assert "torch==2.13.0" in r.stderr and r.returncode != 0          # the venv's pip, reaching for torch
    venv_py = folder / ".venv" / "bin" / "python"
    assert venv_py.is_file()
    prefix = subprocess.run([str(venv_py), "-c", "import sys; print(sys.base_prefix, sys.prefix != sys.base_prefix)"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert prefix == ["/usr", "True"]

    # a second run reuses it; `. scripts/activate` puts it first on PATH (as the quick start does)
    r = install(folder, tmp_path)
    assert "installing into .venv/" in r.stderr and "virtual environment of the project" not in r.stderr
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    shell = subprocess.run(["bash", "-c", ". scripts/activate && command -v python && echo $VIRTUAL_ENV"], cwd=folder,
                           env=env, capture_output=True, text=True, check=True).stdout.split()
    assert shell == [str(folder / ".venv" / "bin" / "python"), str(folder / ".venv")]


@needs_managed_python
def test_an_active_virtual_environment_is_used_as_it_is(tmp_path):
    folder = copy_scripts(tmp_path / "repo")
    venv = tmp_path / "own-venv"
    subprocess.run([str(SYSTEM_PY), "-m", "venv", "--without-pip", str(venv)], check=True)
    r = install(folder, tmp_path, VIRTUAL_ENV=str(venv), PYTHON=str(venv / "bin" / "python"))
    assert "PEP 668" not in r.stderr and not (folder / ".venv").exists()
    assert "No module named pip" in r.stderr                           # it went on with that venv's Python


def test_a_missing_python_is_one_line(tmp_path):
    folder = copy_scripts(tmp_path / "repo")
    r = install(folder, tmp_path, PYTHON="no-such-python3")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "install.sh: no-such-python3 not found; install Python 3.10 or later (or set PYTHON=/path/to/python3)"]
