"""What a result was made from: content hashes of files and folders, the canonical form and
fingerprint of a job's description, how two descriptions differ, and the git revision."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path


def fingerprint_of(description: dict) -> str:
    return hashlib.sha256(canonical(description).encode()).hexdigest()[:16]


def with_runtime(description: dict, device: str, precision: str, world: int) -> dict:
    """A job's description with where and how it runs (device type, resolved precision, processes):
    what its fingerprint covers, so a state saved on a CPU in fp32 never resumes on a GPU in bf16 and
    a run in another precision is another run. A description that says it already is left as it is."""
    if "runtime" in description:
        return description
    return {**description, "runtime": {"device": device, "precision": precision, "world": world}}


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


_HASHES: dict[tuple, str] = {}
_PASS: dict | None = None


@contextlib.contextmanager
def one_pass():
    """Within the block, `remembered` values are computed once: the planner describes thousands of
    jobs that share a few code closures and models, whose files do not change while it writes them."""
    global _PASS
    outer, _PASS = _PASS, ({} if _PASS is None else _PASS)
    try:
        yield
    finally:
        _PASS = outer


def remembered(key: tuple, compute):
    """`compute()`, once per `key` inside `one_pass()`; every time outside it."""
    if _PASS is None:
        return compute()
    if key not in _PASS:
        _PASS[key] = compute()
    return _PASS[key]


def file_hash(path: str | os.PathLike) -> str:
    """The content hash of a file (SHA-256, 16 hex digits). Kept for the process by the file's
    identity and change time (device, inode, size, modification and status-change times: an edit in
    place changes the last even where the first is put back), so a file read by many jobs of one
    plan is hashed once."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()[:16]
    return _HASHES[key]


def path_hash(path: str | os.PathLike) -> str | None:
    """Content hash of a file, or of a folder's files (names and contents); None when absent.
    Hidden entries (temporaries) and Python caches are left out."""
    p = Path(path)
    if p.is_file():
        return file_hash(p)
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        rel = f.relative_to(p)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        h.update(rel.as_posix().encode() + b"\0" + file_hash(f).encode())
    return h.hexdigest()[:16]



def git_revision(cwd: str | os.PathLike | None = None) -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("-dirty" if dirty else "")) if rev else "unknown"


def _flat(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def describe_change(old: dict, new: dict, limit: int = 4, marks: dict[str, str] | None = None) -> str:
    """One line saying how two descriptions differ, e.g. `settings.finetune.lr: 0.0001 -> 0.0003`;
    `marks`: the placeholders of a job's description (`<results>`) and the folders they stand for."""
    a, b = _flat(old), _flat(new)
    changes = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        if key.startswith(("code.", "read_hashes.")):
            what, _, path = key.partition(".")
            changes.append(f"{'code' if what == 'code' else 'input'} {path} "
                           f"{'changed' if key in a and key in b else 'added' if key in b else 'removed'}")
        else:
            changes.append(f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}")
    if not changes:
        return "no recorded difference"
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    line = "; ".join(changes[:limit]) + more
    for mark, folder in (marks or {}).items():
        line = line.replace(mark, folder)
    return line
