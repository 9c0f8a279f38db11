"""params.yaml as the user wrote it, after `dvc exp run -S`.

DVC applies `-S KEY=VALUE` by loading the params file, merging the new values into it and writing it
all out again with its own YAML writer: flow lists come back as block lists, long strings wrapped,
an aliased list written out twice, comments inside lists lost, `3.0e-4` written `0.0003`. The
`resolve` stage, which DVC runs first, puts the file back as it was with only the values that
changed edited in place (one line for one key): when the file on disk is exactly what DVC's writer
makes of an earlier text of it (the last one a plan read, kept beside the job files, or the
committed one) with the values it now holds. Anything else (a file the user edited, a value set
through an alias, a change of a block list) is left as it is, with one line saying so.
"""
from __future__ import annotations

import difflib
import io
import json
import math
import subprocess
from pathlib import Path

import yaml

try:
    from ruamel.yaml import YAML          # DVC's YAML library (installed with it): what its writer reads
except ImportError:                       # no DVC, no rewrite of its to undo
    YAML = None

KEPT = "params-text"        # under the job files' folder: the text of each params file the last plan read


def kept_copy(job_files: str | Path, params_file: str) -> Path:
    """Where the text of `params_file` (relative to the project) is kept after a plan."""
    return Path(job_files) / KEPT / Path(params_file).as_posix().lstrip("/")


def keep(job_files: str | Path, params_file: str, text: str) -> None:
    path = kept_copy(job_files, params_file)
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass                     # a folder that cannot be written: the committed text is the fallback


def restore(params_file: str, repo: Path, job_files: str | Path) -> str | None:
    """Put `params_file` back as it was before DVC's writer rewrote it, with only the changed values
    edited; returns a line saying what was done, or None when the file is not such a rewrite."""
    path = Path(repo) / params_file
    if YAML is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
        dvc_writer()
    except (OSError, UnicodeDecodeError, ImportError):
        return None
    for original in _earlier_texts(params_file, repo, job_files):
        if original == text or _rewritten(original, text, path) != text:
            continue
        edited = edit(original, _load(text))
        if edited is None:
            return (f"{params_file}: rewritten by DVC's YAML writer (dvc exp run -S); its layout could not be kept "
                    f"(a change inside a block list, or through an alias): `git diff {params_file}` shows it")
        tmp = path.with_name(f".{path.name}.restore")
        tmp.write_text(edited, encoding="utf-8")
        tmp.replace(path)
        lines = sum(line.startswith("+ ") for line in difflib.ndiff(original.splitlines(), edited.splitlines()))
        return f"{params_file}: DVC's rewrite (dvc exp run -S) undone, {lines} line(s) changed as the values it set"
    return None


def dvc_writer():
    """DVC's own YAML reader for an update, and its writer (what `dvc exp run -S` uses)."""
    from dvc.utils.collections import merge_dicts, remove_missing_keys, to_omegaconf
    from dvc.utils.serialize._yaml import _dump, parse_yaml_for_update

    return parse_yaml_for_update, _dump, merge_dicts, remove_missing_keys, to_omegaconf


def _rewritten(original: str, text: str, path: Path) -> str | None:
    """What DVC's writer makes of `original` once the values of `text` are merged into it."""
    parse, dump, merge, remove, plain = dvc_writer()
    try:           # the values as DVC holds them: plain mappings and lists, each number as it was read
        data, new = parse(original, path), plain(parse(text, path))
        if not isinstance(data, dict) or not isinstance(new, dict):
            return None
        merge(data, new)
        remove(data, new)
        out = io.StringIO()
        dump(data, out)
        return out.getvalue()
    except Exception:            # noqa: BLE001 (any text DVC's reader refuses is no rewrite of it)
        return None


def _earlier_texts(params_file: str, repo: Path, job_files: str | Path) -> list[str]:
    out = []
    try:
        out.append(kept_copy(Path(repo) / job_files, params_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        pass
    for rev in ("HEAD", ""):     # the committed text, then the staged one
        r = subprocess.run(["git", "show", f"{rev}:./{params_file}"], cwd=repo, capture_output=True, check=False)
        if r.returncode == 0:
            try:
                out.append(r.stdout.decode("utf-8"))
            except UnicodeDecodeError:
                pass
    return list(dict.fromkeys(out))


def _load(text: str):
    return YAML(typ="safe", pure=True).load(text)


# ---------------------------------------------------------------- editing values in place

def edit(original: str, data: dict) -> str | None:
    """`original` with the values that differ from `data` edited in place (a scalar replaced where it
    stands, a new key added at the end of its mapping, in the mapping's style); None when a change
    cannot be made so, or the result would not read as `data`."""
    try:
        root = YAML(pure=True).compose(original)
        edits: list[tuple[int, int, str]] = []
        if not _diff(root, _load(original), data, original, edits):
            return None
    except Exception:            # noqa: BLE001
        return None
    text = original
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:start] + new + text[end:]
    try:
        return text if _load(text) == data else None
    except Exception:            # noqa: BLE001
        return None


def _diff(node, old, new, text: str, edits: list) -> bool:
    """The edits that turn mapping `node` (holding `old`) into `new`; False where one is impossible."""
    if not isinstance(old, dict) or not isinstance(new, dict) or node.id != "mapping":
        return False
    pairs = {str(k.value): v for k, v in node.value}
    if old.keys() - new.keys():
        return False                                  # a key removed: left to the user
    for key, value in new.items():
        if key not in old:
            edits.append(_added(node, key, value, text))
            continue
        if _same(old[key], value):
            continue
        child = pairs.get(str(key))
        if child is None:
            return False
        if isinstance(old[key], dict) and isinstance(value, dict):
            if not _diff(child, old[key], value, text, edits):
                return False
        elif child.id == "scalar" or (child.flow_style and child.start_mark.line == child.end_mark.line):
            edits.append(_replaced(child.start_mark.index, child.end_mark.index, _flow(value), text))
        else:
            return False
    return True


def _replaced(start: int, end: int, new: str, text: str) -> tuple[int, int, str]:
    """The edit that puts `new` in place of text[start:end], a comment after it kept in its column
    where the spaces before it allow."""
    rest = text[end:text.find("\n", end) if "\n" in text[end:] else len(text)]
    spaces = len(rest) - len(rest.lstrip(" "))
    grow = len(new) - (end - start)
    if rest.lstrip(" ").startswith("#") and spaces:
        if grow > 0:
            end += min(grow, spaces - 1)
        elif grow < 0:
            new += " " * -grow
    return start, end, new


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _added(mapping, key, value, text: str) -> tuple[int, int, str]:
    """The edit that adds `key: value` to `mapping`: before its closing brace in a flow mapping, else
    on a line of its own after the mapping's last line, at its keys' indentation."""
    entry = f"{_flow(key)}: {_flow(value)}"
    if mapping.flow_style:
        close = text.rindex("}", mapping.start_mark.index, mapping.end_mark.index)
        return (close, close, (", " if mapping.value else "") + entry)
    if not mapping.value:
        raise ValueError("an empty block mapping")
    last = mapping.value[-1][1]
    while last.id != "scalar" and last.value:       # the deepest last value: where its text ends
        last = last.value[-1][1] if last.id == "mapping" else last.value[-1]
    end = text.find("\n", last.end_mark.index)
    end = len(text) if end < 0 else end + 1
    indent = " " * mapping.value[0][0].start_mark.column
    return (end, end, ("" if text[:end].endswith("\n") else "\n") + indent + entry + "\n")


def _flow(value) -> str:
    """A value as YAML in flow style, read back the same by YAML 1.1 and 1.2 readers alike."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
        r = repr(value)
        if "e" in r and "." not in r.split("e")[0]:
            r = r.replace("e", ".0e", 1)
        return r
    if isinstance(value, str):
        return value if _plain(value) else json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"a value of type {type(value).__name__}")


def _plain(value: str) -> bool:
    """A string that reads back as itself unquoted, in a flow collection too."""
    if not value or value != value.strip() or any(c in value for c in ",[]{}#:&*!|>'\"%@`\n\t\\"):
        return False
    try:
        return all(load(f"x: {value}")["x"] == value and load(f"[{value}]") == [value]
                   for load in (_load, yaml.safe_load))
    except Exception:            # noqa: BLE001
        return False
