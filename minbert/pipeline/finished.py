"""A job's finished work, recorded by content: the fingerprint its last finished run had and the
content hash, size and date of every output it wrote, in results/finished/<stage>[/<name>].json.
No copy of an output is kept (nothing holds a second name of a file a user may edit in place, and
deleting an output gives its disk back).

- `record`: after a run, each output that came out byte for byte as the file it replaced gets that
  file's date, or, where none was in place, as the last finished run wrote it, the date it had then
  (a folder: each such file, and the folder when all of it is the same), so an engine that judges by
  date (Snakemake without its own record of the run, e.g. after DVC made or restored the outputs)
  runs nothing downstream of a job whose outputs did not change; then the new record.
- `in_place`: the job's outputs are what a finished run of this fingerprint wrote (its last, or one of
  the few before it that the record keeps: DVC restores an earlier run from its cache), every file
  hashed again (about a second for a bert-base checkpoint). A job that waited for another process
  running it, or a stage run again by hand, then has nothing to run (minbert.pipeline.runinfo); an
  output edited in place, replaced or removed since is not in place, and the job runs.
- `accept`: a reviewed edit that changes nothing computed (minbert.pipeline.accept) is recorded
  here, beside the outputs it leaves in place: the new fingerprint, and the code accepted for the
  run its run record describes (`accepted`), which the planner reads as that run's code. The run
  record itself keeps saying what ran (the report shows it: re-stamping it would change the
  report's inputs).
- `prune`: the records of jobs a plan no longer has, and the folders of hard links an earlier
  version kept there, are removed (the engines' planning calls it).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from minbert.core.io import write_json
from minbert.core.layout import Layout
from minbert.core.provenance import file_hash

FORMAT = "minbert-finished-2"
LEGACY_MANIFEST = "finished.json"          # inside a folder of hard links (the earlier way of keeping work)


def _record_path(job) -> Path:
    return Path(Layout(job.results).finished(job.stage, job.name))


def _read(job) -> dict | None:
    try:
        info = json.loads(_record_path(job).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(info, dict) and info.get("format") == FORMAT and isinstance(info.get("outputs"), dict)
    return info if ok else None


def _entry(path: Path) -> dict | None:
    """What an output is now: a file's hash, size and date; a folder's date and its files' (hidden
    entries, temporaries among them, left out); None when absent or neither (a link, a FIFO)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if os.path.islink(path):
        return None
    if os.path.isdir(path):
        files = {}
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if not n.startswith("."):
                    sub = _entry(Path(root) / n)
                    if sub is None or "files" in sub:
                        return None
                    files[(Path(root) / n).relative_to(path).as_posix()] = sub
        return {"mtime_ns": st.st_mtime_ns, "files": files}
    if not os.path.isfile(path):
        return None
    return {"sha256": file_hash(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _same(a: dict | None, b: dict | None) -> bool:
    """Two entries with the same content (dates aside)."""
    if a is None or b is None or ("files" in a) != ("files" in b):
        return False
    if "files" in a:
        return a["files"].keys() == b["files"].keys() and all(_same(a["files"][k], b["files"][k]) for k in a["files"])
    return a.get("sha256") == b.get("sha256") and a.get("size") == b.get("size")


def in_place(job, fingerprint: str) -> bool:
    """The job's outputs are, byte for byte, those a finished run of `fingerprint` wrote (the same
    settings, inputs, code and runtime; or the code accepted since): its last run's, or an earlier
    one's that DVC restored from its cache."""
    entry = _matching(_read(job), fingerprint)
    if entry is None:
        return False
    kept = entry["outputs"]
    if set(kept) != {job.portable(o) for o in job.outputs}:
        return False
    return all(_same(_entry(Path(o)), kept[job.portable(o)]) for o in job.outputs)


def accept(job, run_fingerprint: str, fingerprint: str, code: dict) -> None:
    """Record `code` (the description's `code`, and `modules` where it has them) as accepted for the
    run of `run_fingerprint` (its run record's), and `fingerprint` (the run's, with that code) as the
    fingerprint of the outputs in place."""
    info = _read(job)
    entry = _matching(info, run_fingerprint) or {"outputs": (info or {}).get("outputs", {})}
    head = {"fingerprint": fingerprint, "outputs": entry["outputs"], "accepted": {"run": run_fingerprint, **code}}
    _write(job, head, [e for e in _runs(info) if e != entry])


def accepted(job, run_fingerprint: str) -> dict:
    """The code accepted for the run of `run_fingerprint` ({"code": ..., "modules": ...}), or {} (none,
    or accepted for another run)."""
    for entry in _runs(_read(job)):
        acc = entry.get("accepted")
        if isinstance(acc, dict) and acc.get("run") == run_fingerprint:
            return {k: v for k, v in acc.items() if k in ("code", "modules") and isinstance(v, dict)}
    return {}


# the finished runs kept per job: the last, and a few before it (a setting tried, then undone: DVC
# restores the earlier run's outputs and run record from its cache, and its entry still says what it wrote)
KEPT_RUNS = 8


def _runs(info: dict | None) -> list[dict]:
    """The finished runs a record holds, the last first."""
    if info is None:
        return []
    head = {k: info[k] for k in ("fingerprint", "outputs", "accepted") if k in info}
    earlier = [e for e in info.get("earlier") or [] if isinstance(e, dict) and isinstance(e.get("outputs"), dict)]
    return [head, *earlier]


def _matching(info: dict | None, fingerprint: str) -> dict | None:
    """The newest run of the record whose fingerprint, or whose accepted run's, is `fingerprint`."""
    for entry in _runs(info):
        acc = entry.get("accepted")
        if fingerprint in (entry.get("fingerprint"), acc.get("run") if isinstance(acc, dict) else None):
            return entry
    return None


def _write(job, head: dict, earlier: list[dict]) -> None:
    """The record: `head` the last run, then the earlier ones (one per fingerprint, the newest kept)."""
    seen, kept = {head.get("fingerprint")}, []
    for entry in earlier:
        if entry.get("fingerprint") not in seen and len(kept) < KEPT_RUNS - 1:
            seen.add(entry.get("fingerprint"))
            kept.append(entry)
    write_json(_record_path(job), {"format": FORMAT, **head, "earlier": kept})


def _first_known(first, second):
    """An entry made of `first` where it has one (file by file within a folder), else of `second`."""
    if not isinstance(first, dict):
        return second if isinstance(second, dict) else None
    if "files" in first and isinstance(second, dict) and isinstance(second.get("files"), dict):
        names = {**second["files"], **first["files"]}
        return {**first, "files": {k: _first_known(first["files"].get(k), second["files"].get(k)) for k in names}}
    return first


def _put_dates(path: Path, now: dict, then: dict) -> dict:
    """Give `path` (entry `now`) the dates of `then` where its content is the same; the entry as it is
    after."""
    if "files" in now:
        files = {k: (_put_dates(path / k, v, then["files"][k]) if "files" in then and k in then["files"] else v)
                 for k, v in now["files"].items()}
        now = {**now, "files": files}
    if _same(now, then):
        os.utime(path, ns=(then["mtime_ns"], then["mtime_ns"]))
        return {**now, "mtime_ns": then["mtime_ns"]}
    return now


def replaced(job) -> dict:
    """The job's outputs in place before a run replaces them (content and dates), for `record`."""
    return {job.portable(out): _entry(Path(out)) for out in job.outputs}


def record(job, fingerprint: str, in_place_before: dict | None = None) -> int:
    """Record the job's outputs (just written) as its finished work, after giving each output that
    came out as the file it replaced (`in_place_before`, from `replaced`) that file's dates, or, where
    none was in place, as the last finished run wrote it that run's dates; returns how many outputs
    were wholly the same. The file in place comes first: it is what the engines compared with, and
    DVC may have restored it from its cache since the last run (another content, another date)."""
    last = (_read(job) or {}).get("outputs", {})
    entries, same = {}, 0
    for out in job.outputs:
        now, key = _entry(Path(out)), job.portable(out)
        then = _first_known((in_place_before or {}).get(key), last.get(key))
        if now is not None and isinstance(then, dict):
            now = _put_dates(Path(out), now, then)
            same += _same(now, then)
        entries[key] = now
    path = _record_path(job)
    legacy = path.with_suffix("") if path.suffix == ".json" else None
    if legacy is not None and (legacy / LEGACY_MANIFEST).is_file():
        shutil.rmtree(legacy, ignore_errors=True)         # the hard links an earlier version kept
    _write(job, {"fingerprint": fingerprint, "outputs": entries}, _runs(_read(job)))
    return same


def prune(results: str, jobs) -> list[Path]:
    """Remove what results/finished holds for no job of `jobs` (the jobs of the plan): the records of
    removed or renamed jobs, and every folder of hard links an earlier version kept (which held the
    disk of outputs long deleted). Returns what was removed."""
    folder = Path(Layout(results).finished_records)
    wanted = {Path(Layout(results).finished(j.stage, j.name)) for j in jobs}
    removed = []
    if not folder.is_dir():
        return removed
    for root, dirs, files in os.walk(folder):          # links are not followed
        here = Path(root)
        legacy = [d for d in dirs if (here / d / LEGACY_MANIFEST).is_file() and not (here / d).is_symlink()]
        for d in legacy:
            shutil.rmtree(here / d, ignore_errors=True)
            removed.append(here / d)
        dirs[:] = [d for d in dirs if d not in legacy]
        for f in files:
            if f.endswith(".json") and here / f not in wanted and not (here / f).is_symlink():
                (here / f).unlink()
                removed.append(here / f)
    return removed
