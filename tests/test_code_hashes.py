"""The code hashes of a plan kept between processes (minbert.pipeline.code): every `snakemake`,
`dvc repro` and hand run would otherwise parse the hundred modules of the jobs' closures again. A
second process parses nothing the first one parsed, and what is kept is keyed by content: an edit
that leaves a file's size and dates as they were still changes its hash; a damaged or unwritable
store only costs the parsing."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import child_env

# a process that hashes a file and says how many times it parsed Python
HASH = """
import ast, sys
from minbert.pipeline import code
parsed, parse = [], ast.parse
ast.parse = lambda *a, **k: parsed.append(1) or parse(*a, **k)
print(code.code_hash(sys.argv[1]), code._module_facts(code.Path(sys.argv[1]), "m")[1], len(parsed))
"""


def hashed(path, store) -> tuple[str, str, int]:
    out = subprocess.run([sys.executable, "-c", HASH, str(path)], env=child_env(MINBERT_CACHE=str(store)),
                         capture_output=True, text=True, timeout=120)
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
