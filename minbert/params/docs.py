"""The docs' key tables and the editors' JSON schema, generated from the schema's field
descriptions (minbert.params.schema and minbert.params.studies), so that each key's help text is written once.

    python3 -m minbert.params.docs [--check] [--root DIR]

writes each table between `<!-- keys: NAME -->` and `<!-- /keys -->` in its docs file (the prose
around it is left as it is) and params.schema.json at the repository root; with --check it writes
nothing and exits 1 when a file differs from what it would write (tests/test_params_docs.py).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from minbert.core.errors import MinBertError
from minbert.params.finetune import DistillParams, EarlyStopping, FinetuneParams, RetrainHeadsParams
from minbert.params.heads import HeadsParams
from minbert.params.plateau import UntilPlateau
from minbert.params.schema import ExperimentParams, PretrainParams
from minbert.params.studies import Params
from minbert.params.tasks import TaskParams

# table name -> (docs file, the model whose keys it lists, nested sections listed key by key as section.key)
TABLES: dict[str, tuple[str, type[BaseModel], tuple[str, ...]]] = {
    "finetune": ("docs/finetuning.md", FinetuneParams, ()),
    "heads": ("docs/finetuning.md", HeadsParams, ()),
    "distill": ("docs/finetuning.md", DistillParams, ()),
    "retrain_heads": ("docs/finetuning.md", RetrainHeadsParams, ()),
    "early_stopping": ("docs/finetuning.md", EarlyStopping, ()),
    "until_plateau": ("docs/finetuning.md", UntilPlateau, ()),
    "pretraining": ("docs/pretraining.md", PretrainParams, ("mlm", "nli")),
    "task": ("docs/extending.md", TaskParams, ("files",)),
}
SCHEMA_FILE = "params.schema.json"
_BLOCK = re.compile(r"(<!-- keys: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /keys -->)", re.S)


def _yaml(v) -> str:
    """A default as it is written in params.yaml (flow style)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return re.sub(r"e-0*(\d)", r"e-\1", repr(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, BaseModel):
        return _yaml(v.model_dump(exclude_unset=True))
    return str(v) if v != "" else '""'


def default_text(field) -> str:
    """The table's default column: `(required)`, nothing for a section left at its own defaults,
    else the value as params.yaml writes it (the keys a section's default sets)."""
    v = field.get_default(call_default_factory=True)
    if v is PydanticUndefined:
        return "(required)"
    if isinstance(v, BaseModel) and not v.model_dump(exclude_unset=True):
        return ""
    return f"`{_yaml(v)}`" if v is None or isinstance(v, (str, list, dict, BaseModel)) else _yaml(v)


def rows(model: type[BaseModel], flatten: tuple[str, ...] = (), prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, meaning) of each field of `model`, first the keys a model takes beside its fields
    (`extra_key`: the heads' task names); a section in `flatten` as its own keys."""
    extra = getattr(model, "extra_key", None)
    out = [(f"{prefix}{extra[0]}", extra[1], extra[2])] if extra else []
    for name, field in model.model_fields.items():
        if name in flatten:
            out += rows(field.annotation, (), f"{prefix}{name}.")
            continue
        out.append((f"{prefix}{name}", default_text(field), field.description or ""))
    return out


def table(model: type[BaseModel], flatten: tuple[str, ...] = ()) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{key}` | {cell(default)} | {cell(meaning)} |" for key, default, meaning in rows(model, flatten)]
    return "\n".join(lines) + "\n"


def render_doc(text: str, path: str) -> str:
    """`text` with each `<!-- keys: NAME -->` block's table generated; a one-line error for an
    unknown table name."""
    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES or TABLES[name][0] != path:
            known = [n for n, (p, _, _) in TABLES.items() if p == path]
            raise MinBertError(f"{path}: unknown key table '{name}' in a `<!-- keys: NAME -->` marker; this "
                               f"file's tables are {', '.join(known)}")
        _, model, flatten = TABLES[name]
        return m.group(1) + table(model, flatten) + m.group(4)

    return _BLOCK.sub(block, text)


def json_schema() -> dict:
    """params.yaml's JSON schema with every key's description; `base` and each experiment are an
    experiment's keys (ExperimentParams), which the Params model itself keeps as plain mappings
    because they are deep-merged before they are validated."""
    schema = Params.model_json_schema()
    exp = ExperimentParams.model_json_schema()
    defs = schema.setdefault("$defs", {})
    defs.update(exp.pop("$defs", {}))
    defs["ExperimentParams"] = exp
    defs = dict(sorted(defs.items()))
    # a table transcribed in a catalogue (`transcribed_in`) takes these from there, and its paper too
    for name, keys in (("PaperParams", ("title", "overall")), ("StudyPaper", ("columns",))):
        defs[name]["required"] = [k for k in defs[name].get("required", []) if k not in keys]
    schema["$defs"] = defs
    props = schema["properties"]
    props["base"] = {"$ref": "#/$defs/ExperimentParams", "description": props["base"]["description"]}
    props["experiments"]["additionalProperties"] = {"$ref": "#/$defs/ExperimentParams"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file under `root` -> its content."""
    out = {}
    for path in sorted({p for p, _, _ in TABLES.values()}):
        out[root / path] = render_doc((root / path).read_text(), path)
    out[root / SCHEMA_FILE] = json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help="the repository root")
    args = ap.parse_args(argv)
    try:
        generated = outputs(Path(args.root))
    except MinBertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = []
    for path, text in generated.items():
        if not path.is_file() or path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
