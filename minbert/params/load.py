"""Reading params.yaml and its catalogue file: YAML that refuses a key given twice, the catalogue's
sections in place of params.yaml's, then parse (minbert.params.studies.Params), expand
(minbert.params.catalogue) and check (minbert.params.validate). Each step reports a one-line
MinBertError naming the file and the key."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from minbert.core.errors import MinBertError
from minbert.core.io import read_input
from minbert.params.catalogue import LoadedParams, expand
from minbert.params.fields import NAME_RE
from minbert.params.messages import close, raise_validation
from minbert.params.scales import at_scale
from minbert.params.schema import CATALOGUE_SECTIONS
from minbert.params.studies import Params
from minbert.params.validate import check_params


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (YAML itself would keep the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *anchor`: the keys after it override
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def read_yaml(path: str | Path):
    """A YAML file's content; a one-line error for a missing or unreadable file, a syntax error
    (with its line) or a duplicate key (with both lines)."""
    path = Path(path)
    data = read_input(path, "parameter file", limit=16 << 20)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinBertError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        return _bounded(yaml.load(text, Loader=_StrictLoader), path)   # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as e:
        raise MinBertError(f"{path} line {e.second}: key '{e.key}' is given twice in one mapping (first on line "
                           f"{e.first}); keep one") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MinBertError(f"{path}{where}: not valid YAML ({e.problem or e.context}); fix the syntax") from None
    except yaml.YAMLError as e:
        raise MinBertError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise MinBertError(too_deep(path)) from None


MAX_VALUES = 1_000_000     # what a params file's aliases may expand to (the papers' catalogue: about 4,200)


def _bounded(data, path: Path):
    """`data` as loaded, once the values its aliases expand to are counted: each mapping or list is
    counted once however many aliases name it (`*a` shares the object `&a` made), so the count takes
    time linear in the file, and a file whose aliases expand past MAX_VALUES (a "billion laughs":
    nine nested lists of ten aliases each are a billion values, from 1 KB) or an alias inside
    itself is refused in one line before anything walks it."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(data, False)]
    open_now: set[int] = set()
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        children = [x for kv in node.items() for x in kv] if isinstance(node, dict) else node
        if done:
            open_now.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[id(node)] > MAX_VALUES:
                raise MinBertError(f"{path}: its YAML aliases (*name) expand to more than {MAX_VALUES:,} values (a "
                                   f"'billion laughs' file?); a params file holds a few thousand: write the "
                                   f"repeated part with fewer nested aliases")
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_now:
            raise MinBertError(f"{path}: a YAML alias (*name) inside the very mapping or list it names repeats it "
                               f"without end; remove the alias")
        open_now.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)) and id(c) not in sizes)
    return data


def too_deep(where) -> str:
    return (f"{where}: nested too deeply (hundreds of levels of mappings or lists); params nest a few levels: "
            f"fix the file")


def catalogue_file(params_path: str | Path, name: str) -> Path:
    return Path(params_path).parent / "params" / f"{name}.yaml"


# catalogues merged into params/papers.yaml: what to write instead of each
RENAMED = {"full": "catalogue: papers, model: bert-base-uncased and scale: paper (the papers' model at their scale)",
           "reproduce": "catalogue: papers and scale: laptop or scale: paper (the packaged MiniLM unless `model` "
                        "says otherwise)"}


def renamed(name: str) -> str:
    """The line that says what a catalogue merged into params/papers.yaml is now written as."""
    return (f"catalogue '{name}' is now params/papers.yaml, the papers' tables and claims written once with the "
            f"model and the scale as settings: write {RENAMED[name]}")


def _with_catalogue(raw: Any, path: Path) -> tuple[Any, Path]:
    """`catalogue: demo` (the default) uses params.yaml's own sections; `catalogue: NAME` takes them
    from params/NAME.yaml instead, so switching the whole study catalogue is one key."""
    if not isinstance(raw, dict) or raw.get("catalogue", "demo") == "demo":
        return raw, path
    name = raw["catalogue"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MinBertError(f"{path}: key 'catalogue': expected 'demo' or the name of a file in params/ (got {name!r})")
    cat_path = catalogue_file(path, name)
    if not cat_path.is_file() and name in RENAMED:
        raise MinBertError(f"{path}: key 'catalogue': {renamed(name)} (docs/papers.md)")
    if not cat_path.is_file():
        known = ["demo"] + sorted(p.stem for p in cat_path.parent.glob("*.yaml"))
        raise MinBertError(f"{path}: key 'catalogue': no catalogue file {cat_path}{close(name, known)}")
    cat = read_yaml(cat_path)
    if not isinstance(cat, dict):
        raise MinBertError(f"{cat_path}: expected a mapping at the top level")
    extra = sorted(set(cat) - set(CATALOGUE_SECTIONS) - {"scale"})
    if extra:
        raise MinBertError(f"{cat_path}: unknown key '{extra[0]}'{close(extra[0], CATALOGUE_SECTIONS)} "
                           f"(a catalogue holds {', '.join(CATALOGUE_SECTIONS)} and its default 'scale')")
    merged = {k: v for k, v in raw.items() if k not in CATALOGUE_SECTIONS}
    merged.update({k: v for k, v in cat.items() if k != "scale"})
    if "scale" in cat:                  # the catalogue's default scale; params.yaml's `scale` wins
        merged.setdefault("scale", cat["scale"])
    return merged, cat_path


def parse_params(raw: Any, where: str = "params.yaml") -> Params:
    """The sections, each validated on its own (`base` as an experiment's keys)."""
    if not isinstance(raw, dict):
        raise MinBertError(f"{where}: expected a mapping at the top level")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise_validation(err, Params, where)


def with_transcriptions(raw: Any, root: Path, where: str) -> tuple[Any, list[Path]]:
    """`raw` with each paper table that names the catalogue it is transcribed in (`paper.transcribed_in`:
    params/NAME.yaml beside params.yaml) completed from that catalogue's table of the same paper and
    name: its columns, its rows' printed values by label, how many rows it prints, its data and the
    claims whose rows are all here; the paper's title, formula and sizes (`papers.<id>`, but its
    `differs`) likewise. So the papers' tables and claims are written once (params/papers.yaml) and a
    study that shows some of their rows (the demo's) names only its rows' runs. Returns a new mapping
    and the catalogue files read."""
    studies = raw.get("studies") if isinstance(raw, dict) else None
    if not isinstance(studies, list):
        return raw, []
    cached: dict[str, dict] = {}
    files: list[Path] = []
    out, papers = [], dict(raw["papers"]) if isinstance(raw.get("papers"), dict) else {}
    for i, st in enumerate(studies):
        paper = st.get("paper") if isinstance(st, dict) else None
        name = paper.get("transcribed_in") if isinstance(paper, dict) else None
        if not isinstance(name, str):
            out.append(st)
            continue
        key = f"{where}: key 'studies[{i}].paper"
        if name not in cached:
            path = catalogue_file(root / "params.yaml", name)
            if not NAME_RE.match(name) or not path.is_file():
                raise MinBertError(f"{key}.transcribed_in': no catalogue file {path}")
            cached[name] = read_yaml(path)
            files.append(path)
        theirs = next((s["paper"] for s in cached[name].get("studies") or [] if isinstance(s, dict)
                       and isinstance(s.get("paper"), dict) and (s["paper"].get("id"), s["paper"].get("table"))
                       == (paper.get("id"), paper.get("table"))), None)
        if theirs is None:
            raise MinBertError(f"{key}.table': params/{name}.yaml has no table {paper.get('table')!r} of paper "
                               f"{paper.get('id')!r}")
        printed = {r["label"]: r for r in theirs["rows"]}
        rows = []
        for j, row in enumerate(paper.get("rows") or []):
            if not isinstance(row, dict) or row.get("label") not in printed:
                label = row.get("label") if isinstance(row, dict) else row
                raise MinBertError(f"{key}.rows[{j}].label': params/{name}.yaml's {paper.get('table')} has no row "
                                   f"{label!r}{close(str(label), list(printed))}")
            rows.append({**{k: v for k, v in printed[row["label"]].items() if k in ("dev", "test")}, **row})
        labels = {r["label"] for r in rows}
        claims = [c for c in theirs.get("claims") or []
                  if set(c.get("same") or c.get("no_gain") or [c.get("better"), c.get("worse")]) <= labels]
        taken = {k: theirs[k] for k in ("columns", "data") if k in theirs}
        own_rows = sum(1 for r in theirs["rows"] if not r.get("from_table"))
        out.append({**st, "paper": {**taken, "printed_rows": theirs.get("printed_rows") or own_rows, **paper,
                                    "rows": rows, "claims": claims}})
        pid = paper.get("id")
        source = (cached[name].get("papers") or {}).get(pid)
        mine = papers.get(pid) if isinstance(papers.get(pid), dict) else {}
        if isinstance(source, dict) and "title" not in mine:
            papers[pid] = {**{k: v for k, v in source.items() if k != "differs"}, **mine}
    return {**raw, "studies": out, **({"papers": papers} if papers else {})}, files


def validate_params(raw: Any, where: str = "params.yaml", root: str | Path = ".") -> LoadedParams:
    """Params from their YAML content: parsed, expanded (grids, seeds) and checked across sections;
    `raw` is left as it was. `root`: the folder of params.yaml, whose params/ holds the catalogues a
    paper table is transcribed in."""
    try:
        raw, transcribed = with_transcriptions(raw, Path(root), where)
        raw = at_scale(raw, where)
        parsed = parse_params(raw, where)
        with parsed.registry.active():      # every later section names its tasks, losses and heads
            loaded = expand(parsed, raw, where)
            check_params(loaded.params, loaded.experiments, loaded.groups, where, templates=loaded.templates)
    except RecursionError:     # YAML that parses but nests deeper than merging and validation go
        raise MinBertError(too_deep(where)) from None
    loaded.transcribed = transcribed
    return loaded


def load_params(path: str | Path = "params.yaml") -> LoadedParams:
    """params.yaml (and the catalogue file it names), validated."""
    path = Path(path)
    if not path.is_file() and path.parent.name == "params" and path.stem in RENAMED:
        raise MinBertError(f"{path}: no such file; {renamed(path.stem)}, in params.yaml or a params file of your own "
                           f"(docs/papers.md)")
    raw = read_yaml(path)
    raw, source = _with_catalogue(raw, path)
    loaded = validate_params(raw, str(source), path.parent)
    loaded.path, loaded.source = path, source
    return loaded
