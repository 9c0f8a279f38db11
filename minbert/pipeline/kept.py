"""What parsing gives for a file's bytes, kept on disk between processes (minbert.pipeline.code's code
hashes and imports): every plan (each `snakemake`, `dvc repro` and hand run) would otherwise parse the
hundred modules of the jobs' closures again, most of its start-up.

Trusted only as far as it is safe to: an entry is keyed by the SHA-256 of the bytes it was computed
from (read afresh each time, never a file's date) and what was computed; the store's file is named
after the code that computes the entries and the Python version (the syntax tree's form), so an edit
to either starts a new one; an entry of the wrong form (a damaged file) is computed again. It lives
under `$MINBERT_CACHE`, else `$XDG_CACHE_HOME/minbert` or `~/.cache/minbert`; a folder that cannot be
read or written, or a write that another process overtook, costs only the parsing. Several processes
write at once: each writes a whole file beside it and renames it over the last (readers see one
whole file or the other), merged with what it finds there then.

Trusted as the user's own files are, and only where only the user can write: the store is read only
when its file and folder belong to the user running it and no one else may write them (the folder
is made for its owner alone); a store anyone else could write (a shared `$MINBERT_CACHE`, a folder
open to a group) is left unread, and everything is parsed again. Whoever can write the store can
make an edited file look unchanged to the planner (its jobs are then not re-run); that needs the
user's own access, with which the code itself could be edited as well. A model's code is never
checked through the store: loading hashes the files themselves (minbert.core.extensions).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


def cache_folder() -> Path:
    root = os.environ.get("MINBERT_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minbert"


class KeptByContent:
    """Values computed from a file's bytes, kept between processes in one JSON file per version of
    the code that computes them (`computed_by`: that code's files). At most `MOST` entries, the
    oldest dropped first. `save` writes what this process added (registered to run at exit)."""

    MOST = 20000

    def __init__(self, name: str, computed_by: tuple[Path, ...]):
        self.name, self.computed_by = name, computed_by
        self.entries: dict[str, object] | None = None
        self.new = 0
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            version = hashlib.sha256(sys.version.encode())
            for code in (*self.computed_by, Path(__file__)):
                version.update(code.read_bytes())
            self._path = cache_folder() / f"{self.name}-{version.hexdigest()[:16]}.json"
        return self._path

    def get(self, data: bytes, what: str, compute: Callable[[], object], fits: Callable[[object], bool]):
        """`compute()`'s value for `data`, taken from the store when a process computed it before and it
        has the form `fits` accepts."""
        if self.entries is None:
            self.entries = self._read()
        key = f"{hashlib.sha256(data).hexdigest()} {what}"
        if not fits(self.entries.get(key)):
            self.entries[key] = compute()
            self.new += 1
        return self.entries[key]

    def _read(self) -> dict:
        try:
            if not all(_only_mine(p) for p in (self.path.parent, self.path)):
                return {}                      # another may write it: not trusted, computed again
            found = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):          # none yet, unreadable or damaged: computed again
            return {}
        return found if isinstance(found, dict) else {}

    def save(self) -> None:
        """Write what this process computed, merged with what others wrote meanwhile."""
        if not self.new:
            return
        merged = {**self._read(), **self.entries}
        keep = dict(list(merged.items())[-self.MOST:])
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp.write_text(json.dumps(keep), encoding="utf-8")
            os.replace(tmp, self.path)
            self.new = 0
        except OSError:                        # a read-only or full disk: nothing kept, nothing left
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass


def _only_mine(path: Path) -> bool:
    """Whether only the user running this can write `path`: theirs, and writable by no group or other."""
    st = path.stat()
    return (not hasattr(os, "getuid") or st.st_uid == os.getuid()) and not st.st_mode & 0o022


def is_code_hash(value) -> bool:
    return isinstance(value, str) and len(value) == 16 and all(c in "0123456789abcdef" for c in value)


def is_list_of_names(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
