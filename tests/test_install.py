"""A non-editable install: `pip install .` into a fresh virtual environment, then the pipeline run
from a copy of the repository without its minbert/ and stages/ folders (so every stage imports the
installed package) renders the reports: the templates are package data."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from test_workflow import SNAKEMAKE, make_copy


@pytest.mark.slow
@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_a_non_editable_install_renders_the_reports(repo_root, tmp_path, tiny_model_dir):
    folder = make_copy(repo_root, tmp_path / "repo", tiny_model_dir)
    venv = tmp_path / "venv"
    # the venv sees the machine's packages (torch, snakemake, ...), but gets this project installed anew
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the installed package, not a checkout that PYTHONPATH names (as when the tests run from a worktree)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(folder)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import minbert.report.render as r; print(r.TEMPLATES)"],
                           capture_output=True, text=True, cwd=tmp_path, check=True, env=env).stdout.strip()
    assert str(venv) in where and (os.path.isfile(os.path.join(where, "final.html.j2")))

    shutil.rmtree(folder / "minbert")
    shutil.rmtree(folder / "stages")
    r = subprocess.run([str(py), "-m", "snakemake", "--cores", "2"], cwd=folder, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    html = (folder / "reports" / "final.html").read_text()
    assert "Tiny study" in html and (folder / "reports" / "experiments" / "a.html").is_file()
