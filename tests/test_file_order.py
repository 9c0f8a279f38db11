"""The test run's own order (tests/conftest.py): the files that took longest in the recorded run go
first under pytest-xdist's --dist loadfile, and a run with MINBERT_RECORD_DURATIONS writes each file's
seconds for the next."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import conftest
from conftest import REPO


def test_the_recorded_longest_files_come_first_and_the_rest_keep_their_order(tmp_path, monkeypatch):
    (tmp_path / "durations.json").write_text(json.dumps({"test_b.py": 300, "test_d.py": 40}))
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "durations.json")
    items = [SimpleNamespace(fspath=f"/x/tests/{name}", name=f"{name}::{k}")
             for name in ("test_a.py", "test_b.py", "test_c.py", "test_d.py") for k in range(2)]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [i.name for i in items] == ["test_b.py::0", "test_b.py::1", "test_d.py::0", "test_d.py::1",
                                       "test_a.py::0", "test_a.py::1", "test_c.py::0", "test_c.py::1"]
    (tmp_path / "durations.json").write_text("{not json")              # unreadable: the order as collected
    conftest.pytest_collection_modifyitems(None, None, items)
    assert items[0].name == "test_b.py::0"


def test_a_run_records_each_files_seconds(tmp_path):
    out = tmp_path / "durations.json"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                        "tests/test_code_size.py", "tests/test_file_order.py::"
                        "test_the_recorded_longest_files_come_first_and_the_rest_keep_their_order"],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "MINBERT_RECORD_DURATIONS": str(out)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    seconds = json.loads(out.read_text())
    assert set(seconds) == {"test_code_size.py", "test_file_order.py"} and all(v >= 0 for v in seconds.values())
    assert (REPO / "tests" / "durations.json").is_file()                 # the committed record CI orders by
