"""The code hashes of a plan kept between processes (minbert.pipeline.code): every `snakemake`,
`dvc repro` and hand run would otherwise parse the hundred modules of the jobs' closures again. A
second process parses nothing the first one parsed, and what is kept is keyed by content: an edit
that leaves a file's size and dates as they were still changes its hash, and an edit to the code
that computes the entries starts a new store; a damaged store or entry, an unwritable store or home
folder, and processes writing at once only cost the parsing."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import child_env

from minbert.pipeline import code
from minbert.pipeline.kept import KeptByContent

# a process that hashes a file and says how many times it parsed Python
HASH = """
import ast, sys
from minbert.pipeline import code
parsed, parse = [], ast.parse
ast.parse = lambda *a, **k: parsed.append(1) or parse(*a, **k)
print(code.code_hash(sys.argv[1]), code._module_facts(code.Path(sys.argv[1]), "m")[1], len(parsed))
"""


def hashed(path, store, **env: str) -> tuple[str, str, int]:
    env = {"MINBERT_CACHE": str(store), **env} if store else env
    out = subprocess.run([sys.executable, "-c", HASH, str(path)], env=child_env(**env), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    digest, *imports, parsed = out.stdout.split()
    return digest, " ".join(imports), int(parsed)


def test_a_second_process_parses_nothing_and_an_edit_counts_by_content(tmp_path):
    module, store = tmp_path / "m.py", tmp_path / "store"
    module.write_text('"""A module."""\nimport json\nX = 1\n')
    first = hashed(module, store)
    assert first[1] == "['json']" and first[2] == 2                      # its hash and its imports, parsed
    assert hashed(module, store) == first[:2] + (0,)                     # kept: parsed by no later process
    dates = os.stat(module)
    module.write_text('"""A module."""\nimport json\nX = 2\n')            # the same size, the same dates
    os.utime(module, ns=(dates.st_atime_ns, dates.st_mtime_ns))
    edited = hashed(module, store)
    assert edited[0] != first[0] and edited[2] == 2
    module.write_text('"""Another docstring."""\nimport json\nX = 1\n')   # what it does, as first
    assert hashed(module, store)[0] == first[0]
    for kept in store.iterdir():
        kept.write_text("{not json")
    assert hashed(module, store) == first[:2] + (2,)                     # a damaged store: parsed again
    store_file = tmp_path / "a-file"
    store_file.write_text("")
    assert hashed(module, store_file / "below") == first[:2] + (2,)      # a store that cannot be written
    assert hashed(module, None, HOME=str(store_file), XDG_CACHE_HOME="", MINBERT_CACHE="") == first[:2] + (2,)
    assert not list(tmp_path.rglob("*.tmp"))                            # a home folder that cannot be either


def test_a_damaged_entry_is_computed_again(tmp_path, monkeypatch):
    """A store that reads as JSON but holds entries of the wrong form (a damaged disk, a hand edit)
    gives what parsing gives, never what it holds."""
    monkeypatch.setenv("MINBERT_CACHE", str(tmp_path / "store"))
    module = tmp_path / "m.py"
    module.write_text("import json\nimport minbert.core\n")
    expected = code._code_hash(module.read_bytes(), str(module))
    store = KeptByContent("code", (Path(code.__file__),)).path      # where minbert.pipeline.code keeps them
    store.parent.mkdir()
    key = hashlib.sha256(module.read_bytes()).hexdigest()
    for bad in (5, None, "not a hash", [["templates"]], [["templates"], [1, 2]], {"a": 1}):
        store.write_text(json.dumps({f"{key} hash .py": bad, f"{key} facts m False": bad}))
        monkeypatch.setattr(code, "_PARSED", KeptByContent("code", (Path(code.__file__),)))
        code._CODE_HASHES.clear()
        code._FACTS.clear()
        assert code.code_hash(module) == expected
        assert code._module_facts(module, "m") == ([], ["json", "minbert.core"])


def test_a_store_another_may_write_is_not_read(tmp_path, monkeypatch):
    """An entry forged in the store hides an edit from the planner: the store is read only where only
    the user can write it (a shared or group-writable folder is left unread)."""
    monkeypatch.setenv("MINBERT_CACHE", str(tmp_path / "store"))
    hashing = tmp_path / "hashing.py"
    hashing.write_text("X = 1\n")
    kept = KeptByContent("code", (hashing,))
    assert kept.get(b"bytes", "hash .py", lambda: "0" * 16, lambda v: isinstance(v, str)) == "0" * 16
    kept.save()
    assert oct(kept.path.parent.stat().st_mode & 0o777) == oct(0o700)          # made for its owner alone
    forged = json.loads(kept.path.read_text())
    forged[next(iter(forged))] = "f" * 16
    kept.path.write_text(json.dumps(forged))
    for mode in (0o777, 0o770):
        kept.path.parent.chmod(mode)
        assert KeptByContent("code", (hashing,)).get(b"bytes", "hash .py", lambda: "0" * 16,
                                                     lambda v: isinstance(v, str)) == "0" * 16     # not read
    kept.path.parent.chmod(0o700)
    kept.path.chmod(0o666)
    assert KeptByContent("code", (hashing,)).get(b"bytes", "hash .py", lambda: "0" * 16,
                                                 lambda v: isinstance(v, str)) == "0" * 16
    kept.path.chmod(0o600)                    # the user's own: trusted as their files are (docs/workflow.md)
    assert KeptByContent("code", (hashing,)).get(b"bytes", "hash .py", lambda: "0" * 16,
                                                 lambda v: isinstance(v, str)) == "f" * 16


def test_a_new_version_of_the_hashing_code_starts_a_new_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MINBERT_CACHE", str(tmp_path / "store"))
    hashing = tmp_path / "hashing.py"
    hashing.write_text("X = 1\n")
    first = KeptByContent("code", (hashing,))
    assert first.get(b"bytes", "hash .py", lambda: "0" * 16, lambda v: isinstance(v, str)) == "0" * 16
    first.save()
    assert KeptByContent("code", (hashing,)).get(b"bytes", "hash .py", lambda: "1" * 16,
                                                 lambda v: isinstance(v, str)) == "0" * 16      # kept
    hashing.write_text("X = 2\n")
    second = KeptByContent("code", (hashing,))
    assert second.path != first.path
    assert second.get(b"bytes", "hash .py", lambda: "1" * 16, lambda v: isinstance(v, str)) == "1" * 16


# processes that each hash their own modules and save at once
MANY = """
import sys
from minbert.pipeline import code
for p in sys.argv[1:]:
    code.code_hash(p)
"""


def test_processes_writing_at_once_leave_a_whole_store(tmp_path):
    """Eight processes that save at the same moment: the store is one whole JSON file (each write a
    whole file renamed over the last), with no temporary files left, and a later process reads from it
    the hashes parsing gives."""
    store = tmp_path / "store"
    modules = []
    for i in range(32):
        modules.append(tmp_path / f"m{i}.py")
        modules[-1].write_text(f"X = {i}\n")
    env = child_env(MINBERT_CACHE=str(store))
    procs = [subprocess.Popen([sys.executable, "-c", MANY, *map(str, modules[i::8])], env=env) for i in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    (kept,) = store.iterdir()
    entries = json.loads(kept.read_text())
    assert isinstance(entries, dict) and 4 <= len(entries) <= 32
    assert [hashed(m, store)[0] for m in modules[:2]] == [code._code_hash(m.read_bytes(), str(m)) for m in modules[:2]]
