"""Atomic file output: every artifact is written to a temporary file and renamed into place,
so an interrupted stage never leaves a half-written output behind; a full disk names the output.
An output path that is not a regular file is never replaced (`output_target`): a symlink is written
through (its target gets the content, the link stays), a FIFO or a character device (/dev/null, a
terminal, /dev/stdout) is opened and written, anything else is refused in one line.
`read_input` (and `open_input` for readers that take a file) reads an input file, checked to be a
regular file of bounded size, or says in one line why it cannot be read. A folder a stage shares
with others (the report's pages under --out) gets a manifest of what the stage wrote there
(`write_manifest`), and the stage deletes only that (`remove_owned`)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from minbert.core.errors import MinBertError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it.

    Works for files and for directories (the caller creates what it likes at the yielded path; a
    folder replaces a folder, a file never does). Where `path` is not a regular file, what happens is
    `output_target`'s: a symlink's target is written instead, a FIFO or a character device gets the
    content written into it once complete (the temporary then lies in the system's temporary folder).
    """
    how, path = output_target(path)
    try:
        if how == REPLACE:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX,
                                   dir=path.parent if how == REPLACE else None)
    except OSError as e:
        raise _named(e, path) from None
    os.close(fd)
    os.unlink(tmp)
    tmp = Path(tmp)
    try:
        yield tmp
        if how != REPLACE:
            _write_into(path, how, tmp)
        else:
            if path.is_dir() and not path.is_symlink():
                if not tmp.is_dir():       # a file never replaces a folder (a user's, named by mistake)
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
                shutil.rmtree(path)
            os.replace(tmp, path)
    except OSError as e:
        raise _named(e, path, tmp)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


# ---------------------------------------------------------------- outputs that are not regular files

REPLACE, STREAM, STDOUT, STDERR = "replace", "stream", "stdout", "stderr"
_WRITABLE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"))
_REFUSED_KINDS = ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def output_target(path: str | os.PathLike) -> tuple[str, Path]:
    """How an output named `path` is written, so that what the path names is never replaced:
    (REPLACE, P): a temporary renamed onto P, where P is `path` (new, a regular file or a folder) or
    the file a symlink points to (written through; the link stays; a dangling link gets its target
    created); (STREAM, path): a FIFO or a character device (/dev/null, a terminal) is opened and
    written, as a shell's `>` does; (STDOUT | STDERR, path): a link to this process's own stdout or
    stderr (/dev/stdout, /proc/self/fd/1) is written there. A block device, a socket or a symlink
    loop is a one-line MinBertError."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError:             # absent, or a path the write itself will refuse (under a file, no permission)
        return REPLACE, path
    link = stat.S_ISLNK(st.st_mode)
    if link:
        try:
            st = os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise MinBertError(f"{path}: symlink loop; point the link at a file or remove it") from None
            return REPLACE, Path(os.path.realpath(path))
        for fd, how in ((1, STDOUT), (2, STDERR)):
            with contextlib.suppress(OSError):
                if os.path.samestat(st, os.fstat(fd)):
                    return how, path
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return REPLACE, Path(os.path.realpath(path)) if link else path
    if any(test(st.st_mode) for test, _ in _WRITABLE_KINDS):
        return STREAM, path
    kind = next((k for test, k in _REFUSED_KINDS if test(st.st_mode)), "not a regular file")
    through = f" (through the symlink to {os.readlink(path)})" if link else ""
    raise MinBertError(f"{path}: is {kind}{through}; an output goes to a regular file, a FIFO or a character "
                       f"device such as /dev/null: give another path")


def _write_into(path: Path, how: str, tmp: Path) -> None:
    """Write the finished temporary `tmp` into a FIFO, a character device or a standard stream; a
    folder cannot go there."""
    if tmp.is_dir():
        raise MinBertError(f"{path}: is not a folder (a {'FIFO or character device' if how == STREAM else how}); "
                           f"give a folder")
    if how == STREAM:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    else:
        (sys.stdout if how == STDOUT else sys.stderr).flush()
        fd = 1 if how == STDOUT else 2
    try:
        if how == STREAM and not any(test(os.fstat(fd).st_mode) for test, _ in _WRITABLE_KINDS):
            raise MinBertError(f"{path}: changed into a regular file while the output was written; run again")
        with open(tmp, "rb") as f:
            while chunk := f.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    except BrokenPipeError:
        raise MinBertError(f"{path}: its reader closed it before the output was written whole; keep the reader "
                           f"open until the end (or write to a file)") from None
    finally:
        if how == STREAM:
            os.close(fd)


TEMP_SUFFIX = ".tmp"
# a write that fails for lack of room: a full disk or quota, or a file over the size limit (RLIMIT_FSIZE,
# a file system's largest file: 4 GiB on FAT32)
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _named(e: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """A full disk or a file too large while writing `path` names `path` (a write reports no file name,
    and a file inside the temporary folder gets its final name), so the stage can say where."""
    if e.errno in _NO_ROOM:
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


# ---------------------------------------------------------------- what a stage wrote into a shared folder

MANIFEST = ".written.json"


def read_manifest(folder: str | os.PathLike) -> list[str]:
    """The names a stage listed as written by it in `folder` (`write_manifest`); [] when none. Only
    plain names directly in the folder count (no paths, no `..`)."""
    path = Path(folder) / MANIFEST
    if not path.is_file() or path.is_symlink():
        return []
    try:
        names = json.loads(read_input(path, "manifest", limit=1 << 20).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return []
    return [n for n in names if isinstance(n, str) and n == Path(n).name and n not in ("", ".", "..")] \
        if isinstance(names, list) else []


def write_manifest(folder: str | os.PathLike, names) -> None:
    """Record which files of `folder` a stage wrote, so that it later deletes those and only those."""
    write_json(Path(folder) / MANIFEST, sorted(set(names)))


def remove_owned(folder: str | os.PathLike) -> list[Path]:
    """Delete the files a stage wrote into a folder it shares (its manifest lists them), the manifest,
    and the folder when nothing else is left; anything else in it stays. Returns what was removed."""
    folder = Path(folder)
    removed = []
    for name in read_manifest(folder) + [MANIFEST]:
        p = folder / name
        if p.is_file() or p.is_symlink():
            p.unlink()
            removed.append(p)
    with contextlib.suppress(OSError):
        folder.rmdir()                 # only when empty
    return removed


def refuse_links(path: str | os.PathLike, root: str | os.PathLike) -> None:
    """A one-line MinBertError when `path`, or a folder between `root` and it, is a symlink: what a
    stage writes, removes or resumes from under the results folder stays inside it. (`root`
    itself may be a link: a results folder on another disk.) Paths outside `root` pass."""
    path, root = Path(path), Path(root)
    try:
        rel = path.relative_to(root)
    except ValueError:
        return
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise MinBertError(f"{current}: is a symlink (to {os.readlink(current)}) inside the results folder "
                               f"{root}; the pipeline writes only real files and folders there: remove the link "
                               f"(rm {current}) and run again")
        if not current.exists():
            return


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


class _Watched:
    """A file torch.save writes to that keeps the OSError of a failed write: torch turns it into
    `RuntimeError: ... unexpected pos`, which says nothing of a full disk."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj, path) -> None:
    """torch.save, atomically; a full disk or a file too large is the OSError it is (ENOSPC, EFBIG,
    naming `path`), not torch's `unexpected pos`."""
    import torch

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            sink = _Watched(f)
            try:
                torch.save(obj, sink)
            except RuntimeError:
                if sink.error is not None:
                    raise sink.error from None
                raise


# what an input may weigh at most, by default: far above any real data file (the largest, an NLI
# corpus, is under 1 GB), below what would exhaust the memory of the machine reading it; small
# files get smaller bounds (a parameter file, a config.json)
MAX_INPUT_BYTES = 4 << 30


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _open_error(e: OSError, path: Path, what: str):
    if isinstance(e, FileNotFoundError):
        if path.is_symlink():
            return MinBertError(f"{path}: is a symlink to a missing file ({os.readlink(path)}); point it at the "
                                f"{what} or replace it")
        return MinBertError(f"{path}: {what} not found")
    if isinstance(e, IsADirectoryError):
        return MinBertError(f"{path}: is a folder; expected a {what}")
    if isinstance(e, PermissionError):
        return MinBertError(f"{path}: permission denied; make the {what} readable (chmod u+r)")
    if e.errno == errno.ELOOP:
        return MinBertError(f"{path}: symlink loop; point the link at a real {what}")
    return MinBertError(f"{path}: cannot read the {what} ({e.strerror or type(e).__name__})")


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


@contextlib.contextmanager
def open_input(path: str | os.PathLike, what: str = "file", limit: int = MAX_INPUT_BYTES):
    """An input file opened for reading, checked first: a regular file (never a FIFO, which would
    block, nor a device such as /dev/zero, which never ends) of at most `limit` bytes; else a
    one-line MinBertError saying what it is and what to do. Yields (binary file, size)."""
    path = Path(path)
    try:   # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _open_error(e, path, what) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise MinBertError(f"{path}: is a folder; expected a {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
            raise MinBertError(f"{path}: is {kind}, not a regular file; give a regular file as the {what}")
        if st.st_size > limit:
            raise MinBertError(f"{path}: {_human(st.st_size)}, more than a {what} may be ({_human(limit)}); "
                               f"check that the path names the right file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, st.st_size


def read_input(path: str | os.PathLike, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file, or a one-line MinBertError saying why it cannot be read (missing,
    a folder, not a regular file, larger than `limit`, permission denied, a symlink loop, an I/O
    error) and what to do. Read in chunks, so a signal (Ctrl-C, SIGTERM) stops it at once, and never
    past `limit` (a file that grows while read included)."""
    path = Path(path)
    with open_input(path, what, limit) as (f, size):
        chunks, total = [], 0
        try:
            while chunk := f.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    raise MinBertError(f"{path}: more than a {what} may be ({_human(limit)}); check that the "
                                       f"path names the right file")
                chunks.append(chunk)
        except OSError as e:
            raise _open_error(e, path, what) from None
    return b"".join(chunks)
