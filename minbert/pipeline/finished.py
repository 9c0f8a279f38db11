"""A job's finished work, kept: the outputs of its last finished run as hard links (no copy), with
the fingerprint they were made under, in results/finished/<stage>[/<name>]/.

Both engines delete a job's outputs before they run it, and Snakemake deletes them again when
the job fails. So outputs that another process finished (a stage run by hand, the orphan of a
killed engine that went on and finished) can vanish though they are exactly what the job would
make. A run that finds the finished outputs of its own fingerprint (same settings, inputs and code)
restores them, each as it was (same file, same date), and has nothing to run; the next run with
another fingerprint replaces them when it finishes. An output is never modified in place (every
stage writes a new file and renames it), so a hard link keeps exactly what the run wrote.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

from minbert.core.io import write_json
from minbert.core.layout import Layout
from minbert.pipeline.job import inside

log = logging.getLogger(__name__)
MANIFEST = "finished.json"
CANNOT_LINK = (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EACCES)


def keep(job, fingerprint: str) -> bool:
    """Keep the job's outputs (just written) as its finished work; False where the file system
    cannot hard-link them, or for outputs outside the results folder (the report's pages, which a
    folder of the user's may hold): nothing is kept then."""
    folder = Path(Layout(job.results).finished(job.stage, job.name))
    if not all(inside(Path(out), Path(job.results)) for out in job.outputs):
        return False
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for i, out in enumerate(job.outputs):
            _link_tree(Path(out), tmp / str(i))
        write_json(tmp / MANIFEST, {"fingerprint": fingerprint, "outputs": job.outputs})
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in CANNOT_LINK:
            log.debug("finished outputs not kept (%s)", e)
            return False
        raise
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return True


def keep_dates(job) -> int:
    """Give each output that came out byte for byte as the job's last finished run wrote it the date
    it had then (a folder: each such file, and the folder itself when all of it is the same);
    returns how many outputs were wholly the same. An engine that judges by date (Snakemake without
    its own record of the run, e.g. after DVC made the outputs) then runs nothing downstream of a
    job whose outputs did not change, as one that judges by content does."""
    folder = Path(Layout(job.results).finished(job.stage, job.name))
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), list):
        return 0
    earlier = dict(zip(manifest["outputs"], (folder / str(i) for i in range(len(manifest["outputs"])))))
    return sum(_keep_dates(Path(out), earlier[out]) for out in job.outputs if out in earlier)


def _keep_dates(out: Path, old: Path) -> bool:
    """`out` takes `old`'s dates where its bytes are the same (a folder: file by file, then the
    folder when all of it is); True when the whole of it is the same."""
    if out.is_symlink() or old.is_symlink() or not out.exists():
        return False
    if out.is_dir() or old.is_dir():
        if not (out.is_dir() and old.is_dir()):
            return False
        names = sorted(p.name for p in old.iterdir())
        same = [_keep_dates(out / n, old / n) for n in names]      # every file, not only up to a change
        whole = names == sorted(p.name for p in out.iterdir()) and all(same)
    else:
        whole = _same_bytes(out, old)
    if whole:
        st = old.stat()
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    return whole


def _same_bytes(a: Path, b: Path) -> bool:
    """Two files with the same content."""
    try:
        if os.path.samefile(a, b):
            return True
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 20), fb.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def restore(job, fingerprint: str) -> bool:
    """Put back the outputs of the job's finished run made under `fingerprint`, each output that is
    not already that very file; False when there is no such run (nothing is touched then)."""
    folder = Path(Layout(job.results).finished(job.stage, job.name))
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint \
            or manifest.get("outputs") != job.outputs:
        return False
    kept = [folder / str(i) for i in range(len(job.outputs))]
    if not all(k.exists() for k in kept):
        return False
    for out, k in zip(job.outputs, kept):
        if not _same(Path(out), k):
            _put_back(k, Path(out))
    return True


def _link_tree(src: Path, dest: Path) -> None:
    """`dest` as hard links of `src` (a file, or a folder's files; a folder with its dates)."""
    if src.is_dir():
        dest.mkdir()
        for entry in sorted(src.iterdir()):
            _link_tree(entry, dest / entry.name)
        st = src.stat()
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.link(src, dest)


def _same(out: Path, kept: Path) -> bool:
    """Whether `out` is already the kept file (or folder of the kept files)."""
    if kept.is_dir():
        if not out.is_dir() or out.is_symlink():
            return False
        names = sorted(p.name for p in kept.iterdir())
        return names == sorted(p.name for p in out.iterdir()) and all(_same(out / n, kept / n) for n in names)
    try:
        return os.path.samefile(out, kept) and not out.is_symlink()
    except OSError:
        return False


def _put_back(kept: Path, out: Path) -> None:
    """Replace `out` by links to the kept files, at once (a temporary sibling, then a rename)."""
    tmp = out.with_name(f".{out.name}.restoring")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    elif tmp.exists():
        tmp.unlink()
    out.parent.mkdir(parents=True, exist_ok=True)
    _link_tree(kept, tmp)
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    os.replace(tmp, out)
