"""Settings from the command line, with the dotted keys and the grammar of `dvc exp run -S`.

`dvc exp run -S KEY=VALUE` rewrites params.yaml through Hydra's override grammar; Snakemake takes
the same overrides in one `--config set='KEY=VALUE ...'` (Snakemake's own `--config` keys cannot
hold dots), and both then run the params as changed. The grammar is Hydra's, parsed by Hydra
itself (as DVC does):

    experiments.a.finetune.lr=1e-4      change a key the file sets (an error if it sets none)
    ++experiments.a.finetune.lr=1e-4    set it whether or not the file has it (an experiment's key
                                        that it inherits from `base`)
    +experiments.a.seed=3               add a key the file does not set (an error if it does)
    ~experiments.a.finetune.lr          remove a key
    params/full.yaml:experiments.x.seed=3   a key of the catalogue file the params name

Values are Hydra's: `1e-4` and `[sst,para]` as numbers and lists, `null`, `true`; a value with a
space is quoted. A sweep (`lr=1e-4,5e-5`) is DVC's to queue (`dvc exp run -S ... --queue`); one
Snakemake run takes one value. Every mistake is one line naming the override, and the params are
then validated as a file would be (the same one-line errors, the file named with the overrides).
"""
from __future__ import annotations

import copy
import difflib
import re
import shlex
from pathlib import Path
from typing import Any

from minbert.core.errors import MinBertError
from minbert.params.catalogue import LoadedParams
from minbert.params.load import _with_catalogue, catalogue_file, load_params, read_yaml, validate_params
from minbert.params.messages import close
from minbert.params.schema import CATALOGUE_SECTIONS


def split_set(value) -> list[str]:
    """Snakemake's `--config set=...` as a list of overrides: one string of them, separated by
    spaces, quoted as in a shell (Snakemake strips a quote at either end of the whole value, so a
    closing quote it took is put back); a YAML mapping Snakemake made of `key=a: b` is one override
    again."""
    if value is None or value == "":
        return []
    if isinstance(value, dict):       # Snakemake reads "k=v: w" as YAML {"k=v": "w"}
        return [f"{k}: {v}" for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = str(value)
    for tail in ("", '"', "'"):
        try:
            return shlex.split(text + tail)
        except ValueError:
            continue
    raise MinBertError(f"--config set={text}: unbalanced quotes; quote a value with spaces, as in "
                       f"set='experiments.a.description=\"two words\"'")


def parse(overrides: list[str]) -> list[tuple[object, str | None]]:
    """Hydra's parse of each override (what `dvc exp run -S` parses), with the file it names
    (`FILE:KEY=VALUE`, split as DVC splits it; None: the params file); one line for a bad one."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
    except ImportError:
        raise MinBertError("settings on the command line need hydra-core (installed with dvc: pip install "
                           "'minbert-pipeline[workflow]')") from None
    from hydra.errors import OverrideParseException

    parser, out = OverridesParser.create(), []
    for text in overrides:
        file, override_text = None, text
        if ":" in text.partition("=")[0]:
            file, _, override_text = text.partition(":")
        try:
            (override,) = parser.parse_overrides([override_text])
        except OverrideParseException as e:
            first = str(e).splitlines()[0] if str(e) else "not an override"
            raise MinBertError(f"--config set: '{text}': {first}; write KEY=VALUE with a dotted key, as for "
                               f"dvc exp run -S") from None
        if override.is_sweep_override():
            raise MinBertError(f"--config set: '{text}' is a sweep of several values; one Snakemake run takes one "
                               f"value (dvc exp run -S '{text}' --queue queues one experiment per value)")
        out.append((override, file))
    return out


def apply(raw: dict, overrides: list, where: str) -> dict:
    """`raw` (a copy) with the overrides applied as Hydra applies them (see the module docstring):
    each (parsed override, its key, its text as given)."""
    from hydra.core.override_parser.types import OverrideType

    out = copy.deepcopy(raw)
    for o, key, text in overrides:
        parts = key.split(".")
        node: Any = out
        for k, part in enumerate(parts[:-1]):
            if not isinstance(node, dict):
                raise MinBertError(f"--config set: '{text}': '{'.'.join(parts[:k])}' in {where} is not a "
                                   f"mapping")
            if part not in node:
                if o.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
                    node[part] = {}
                else:
                    raise _NotSet(text, key, where, parts, k, node)
            node = node[part]
        last = parts[-1]
        if not isinstance(node, dict):
            raise MinBertError(f"--config set: '{text}': '{'.'.join(parts[:-1])}' in {where} is not a mapping")
        if o.type == OverrideType.DEL:
            if last not in node:
                raise MinBertError(f"--config set: '{text}': {where} has no key '{key}' to remove"
                                   f"{close(last, node)}")
            del node[last]
        elif o.type == OverrideType.ADD and last in node:
            raise MinBertError(f"--config set: '{text}': {where} already sets '{key}'; write {key}=... to "
                               f"change it")
        elif o.type == OverrideType.CHANGE and last not in node:
            raise _NotSet(text, key, where, parts, len(parts) - 1, node)
        else:
            node[last] = o.value()
    return out


class _NotSet(MinBertError):
    """A change of a key the params file does not set: what to write instead is said by
    `load_with_overrides`, which can try it."""

    def __init__(self, text: str, key: str, where: str, parts: list[str], k: int, node: dict):
        self.text, self.key, self.where = text, key, where
        self.missing = ".".join(parts[:k + 1])
        near = difflib.get_close_matches(parts[k], [str(n) for n in node], n=1)
        self.near = ".".join([*parts[:k], near[0], *parts[k + 1:]]) if near else None
        super().__init__(f"--config set: '{text}': {where} does not set '{self.missing}'{close(parts[k], node)}")


def _what_to_write(params_path: Path, overrides: list[str], e: _NotSet) -> str:
    """What to write for a change of a key the file does not set: the key it sets that is nearest, when
    one is near (a typo), and `++KEY` to add the key, when the params may hold it (the params checked
    with it added); otherwise why no params file may."""
    prefix, _, rest = e.text.rpartition(":") if ":" in e.text.partition("=")[0] else ("", "", e.text)
    prefix = prefix + ":" if prefix else ""
    value = rest.split("=", 1)[1] if "=" in rest else ""
    added = f"{prefix}++{e.key}={value}"
    try:
        _load(params_path, [added if o == e.text else o for o in overrides])
        can_add = True
    except _NotSet:
        can_add = True                    # another override's own mistake: said when this one is fixed
    except MinBertError as err:
        can_add, why = False, str(err).split(": ", 1)[-1]
    fixed = f"{prefix}{e.near}={value}" if e.near else None
    if fixed and can_add:
        return f"; write {fixed} to change that key, or {added} to add this one"
    if fixed:
        return f"; write {fixed}"
    if can_add:
        return f"; write {added} to add it (as dvc exp run -S wants)"
    return f"; and no params file may set it: {why}"


def load_with_overrides(params_path: str | Path, overrides: list[str]) -> LoadedParams:
    """params.yaml (and its catalogue) with the overrides applied, validated; without overrides,
    exactly minbert.params.load_params. A change of a key the file does not set is one line saying
    what to write instead (`_what_to_write`)."""
    try:
        return _load(Path(params_path), overrides)
    except _NotSet as e:
        raise MinBertError(str(e) + _what_to_write(Path(params_path), overrides, e)) from None


def _load(path: Path, overrides: list[str]) -> LoadedParams:
    if not overrides:
        return load_params(path)
    parsed = parse(overrides)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raw = {} if raw is None else raw
    own = [(o, o.key_or_group, o.input_line) for o, f in parsed if f is None or _same(f, path)]
    sections = [x for x in own if x[1].split(".")[0] in CATALOGUE_SECTIONS]
    raw = apply(raw, [x for x in own if x not in sections], str(path))   # `catalogue` itself first
    if sections and raw.get("catalogue", "demo") != "demo":
        text = sections[0][2]
        raise MinBertError(f"--config set: '{text}': {path} names `catalogue: {raw['catalogue']}`, which holds that "
                           f"section; write {catalogue_file(path, raw['catalogue'])}:{text}")
    raw = apply(raw, sections, str(path))
    merged, source = _with_catalogue(raw, path)
    rest = [(o, o.key_or_group, f"{f}:{o.input_line}", Path(f)) for o, f in parsed
            if f is not None and not _same(f, path)]
    for o, k, text, f in rest:
        if not _same(f, source):
            raise MinBertError(f"--config set: '{text}': {f} is not a params file of this run ({path}"
                               f"{'' if source == path else ' and ' + str(source)})")
        if k.split(".")[0] not in CATALOGUE_SECTIONS:
            raise MinBertError(f"--config set: '{text}': a catalogue file holds only {', '.join(CATALOGUE_SECTIONS)}")
    merged = apply(merged, [x[:3] for x in rest], str(source))
    loaded = validate_params(merged, f"{source} with --config set", Path(path).parent)
    loaded.path, loaded.source = path, source
    return loaded


_ANCHOR_COMMENT = re.compile(r"^\s*(?:-\s+)?[^#\s][^#]*?:\s*&([\w-]+)\s+#")


def dvc_rewrite_problems(path: str | Path) -> list[str]:
    """What in a params file `dvc exp run -S` cannot rewrite: DVC's round-trip YAML writer
    (ruamel) moves a comment that follows an anchor on a block list's key into the list and
    corrupts the file ("YAML file structure is corrupted"); one line for each, saying the fix."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for k, line in enumerate(lines):
        m = _ANCHOR_COMMENT.match(line)
        if not m:
            continue
        nxt = next((x for x in lines[k + 1:] if x.strip() and not x.lstrip().startswith("#")), "")
        if nxt.lstrip().startswith("- "):
            out.append(f"{path} line {k + 1}: a comment after the anchor &{m.group(1)} of a list breaks `dvc exp "
                       f"run -S` (DVC rewrites the file and reports \"YAML file structure is corrupted\"); move the "
                       f"comment to the line above")
    return out


def _same(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()
