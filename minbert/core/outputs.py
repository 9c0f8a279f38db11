"""Paths a user names for a command's output (`minbert predict --out`, `minbert submission --out/--zip`,
the report's `--out`, `fetch_data --out`), checked before any work, each failure one line: a file
output can be written where it is named (`writable_output`), a folder output is a folder or can be
made one (`writable_folder`), nothing a stage deletes and writes anew is a link, a FIFO or a device
(`refuse_replacing`), and no output lands on a file the command reads or inside a folder it reads
(`refuse_over_inputs`). How the write itself treats a path that is not a regular file is
minbert.core.io.output_target's."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import REPLACE, STREAM, output_target

_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file"),
          (stat.S_ISDIR, "a folder"))


def kind(mode: int) -> str:
    """What a file mode says a path is, in words ("a FIFO (named pipe)", "a character device", ...)."""
    return next((k for test, k in _KINDS if test(mode)), "not a regular file")


def _writable_folder_above(path: Path) -> Path:
    """The nearest folder that exists at or above `path`, where a new file or folder would be made."""
    return next((p for p in [path, *path.parents] if os.path.lexists(p)), Path("."))


def writable_output(path: str | os.PathLike, what: str, flag: str, example: str) -> None:
    """A one-line MinBertError when the file output `path` (the `what`, named by the option `flag`;
    `example`: a file name to suggest) cannot be written: a folder, under a file, in a folder without
    write permission, a block device or a socket. A FIFO or a character device (/dev/null) is
    written through, so it needs write permission itself."""
    how, target = output_target(path)
    if how != REPLACE:
        if how == STREAM and not os.access(path, os.W_OK):
            raise MinBertError(f"{path}: cannot write the {what} (no permission to write to it); give {flag} a "
                               f"file you can write")
        return
    if target.is_dir():
        raise MinBertError(f"{path}: is a folder; give {flag} a file name (e.g. {Path(path) / example})")
    folder = _writable_folder_above(target.parent)
    if not folder.is_dir():
        raise MinBertError(f"{path}: cannot write the {what} ({folder} is a file, not a folder); give {flag} a "
                           f"file in a folder you can write")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MinBertError(f"{path}: cannot write the {what} (no permission to write in {folder}); give {flag} "
                           f"a file in a folder you can write")


def writable_folder(path: str | os.PathLike, flag: str) -> None:
    """A one-line MinBertError when the output folder `path` (named by `flag`) is something else (a
    file, a device such as /dev/null, a FIFO, a link to one of those) or cannot be made: a folder
    holds many files, so nothing but a folder (or a link to one) is written through."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
        if os.path.islink(path):
            raise MinBertError(f"{flag}: {path} is a symlink to a missing folder ({os.readlink(path)}); create "
                               f"that folder or remove the link") from None
    except OSError as e:
        raise MinBertError(f"{flag}: {path} cannot be used as a folder ({e.strerror}); choose another {flag}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise MinBertError(f"{flag}: {path} is {kind(st.st_mode)}; give a folder (it is created when missing)")
    folder = path if st is not None else _writable_folder_above(path.parent)
    if not folder.is_dir():
        raise MinBertError(f"{flag}: cannot create the folder {path} ({folder} is {kind(os.lstat(folder).st_mode)}); "
                           f"choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MinBertError(f"{flag}: {'the folder ' + str(path) if st is not None else str(folder)} is not writable; "
                           f"choose another {flag}")


def refuse_replacing(paths, flag: str) -> None:
    """A one-line MinBertError when an output that a stage deletes and writes anew (the report's pages)
    exists as something other than a regular file or a real folder: a symlink (whose target the
    user meant), a FIFO or a device would be replaced."""
    for path in map(Path, paths):
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            continue
        what = f"a symlink (to {os.readlink(path)})" if stat.S_ISLNK(mode) else kind(mode)
        raise MinBertError(f"{path}: is {what}, where the stage writes its own file; it would be replaced: remove "
                           f"it (rm {path}) or give {flag} another folder")


def refuse_over_inputs(out: str | os.PathLike, flag: str, files=(), folders=()) -> None:
    """A one-line MinBertError when the output `out` is one of the `files` the command reads (the
    same name through a link, or the same file by another name), or is or lies inside one of the
    `folders` it reads (a model's folder): the output would destroy what is read."""
    how, target = output_target(out)
    if how != REPLACE:
        return                            # a FIFO, a device or a standard stream: never a file that is read
    real = Path(os.path.realpath(target))
    for read in map(Path, files):
        if real == Path(os.path.realpath(read)) or (real.exists() and read.exists() and os.path.samefile(real, read)):
            raise MinBertError(f"{out}: is the file {read}, which the command reads; give {flag} another file")
    for folder in map(Path, folders):
        inside = Path(os.path.realpath(folder))
        if real == inside or inside in real.parents:
            where = f"is the folder {folder}" if real == inside else f"lies inside {folder}"
            raise MinBertError(f"{out}: {where}, which the command reads; give {flag} a path outside it")


def folders_read(paths, root: str | os.PathLike) -> list[Path]:
    """The folders under `root` (the results folder, which the pipeline owns) that hold what a job
    reads: each read that is a folder, and every folder between `root` and each read. An output
    named inside one of them would land among a stage's outputs, which the pipeline deletes whole."""
    root = Path(os.path.realpath(root))
    found = set()
    for path in map(Path, paths):
        real = Path(os.path.realpath(path))
        if root not in real.parents:
            continue
        chain = [real] if real.is_dir() else []
        chain += [p for p in real.parents if root in p.parents]
        found.update(chain)
    return sorted(found)

