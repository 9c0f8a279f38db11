"""Atomic file output: every artifact is written to a temporary file and renamed into place,
so an interrupted stage never leaves a half-written output behind; a full disk names the output.
`read_input` reads an input file, or says in one line why it cannot be read."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it.

    Works for files and for directories (the caller creates what it likes at the yielded path).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as e:
        raise _named(e, path) from None
    os.close(fd)
    os.unlink(tmp)
    tmp = Path(tmp)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError as e:
        raise _named(e, path, tmp)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


TEMP_SUFFIX = ".tmp"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _named(e: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """A full disk while writing `path` names `path` (a write reports no file name, and a file inside
    the temporary folder gets its final name), so the stage can say where the space ran out."""
    if e.errno in _DISK_FULL:
        name = "" if e.filename is None else str(e.filename)
        if not name:
            e.filename = str(path)
        elif tmp is not None and (name == str(tmp) or name.startswith(str(tmp) + os.sep)):
            e.filename = str(path) + name[len(str(tmp)):]
    return e


def clean_stale_temporaries(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete what `atomic_path` left in `folder` when a run was killed mid-write (`.NAME.*.tmp`
    files or folders; only those of `name` when given). Returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.glob(f".{name if name else ''}*{TEMP_SUFFIX}"):
        if name is not None and not p.name.startswith(f".{name}."):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def torch_save(obj, path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def read_input(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of an input file, or a one-line MinBertError saying why it cannot be read (missing,
    a folder, permission denied, a symlink loop, an I/O error) and what to do."""
    from .errors import MinBertError

    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        if path.is_symlink():
            raise MinBertError(f"{path}: is a symlink to a missing file ({os.readlink(path)}); point it at the "
                               f"{what} or replace it") from None
        raise MinBertError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise MinBertError(f"{path}: is a folder; expected a {what}") from None
    except PermissionError:
        raise MinBertError(f"{path}: permission denied; make the {what} readable (chmod u+r)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MinBertError(f"{path}: symlink loop; point the link at a real {what}") from None
        raise MinBertError(f"{path}: cannot read the {what} ({e.strerror or type(e).__name__})") from None
