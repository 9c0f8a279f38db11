"""Each key's help text is written once (the schema's field descriptions) and the docs' key tables
and params.schema.json are generated from it; the cross-section checks are pure, and what they
used to fill in is the expansion's."""
from __future__ import annotations

import copy
import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from minbert.core.errors import MinBertError
from minbert.params import (
    ExperimentParams,
    check_params,
    docs,
    expand,
    parse_params,
    read_yaml,
    validate_params,
)
from minbert.params.studies import Params

REPO = Path(__file__).resolve().parents[1]
CATALOGUES = ["params.yaml", "params/papers.yaml", "params/minilm.yaml"]


# ---------------------------------------------------------------- generated files

def test_committed_tables_and_json_schema_are_the_generated_ones():
    stale = [str(p.relative_to(REPO)) for p, text in docs.outputs(REPO).items() if p.read_text() != text]
    assert not stale, f"out of date: {stale}; run python3 -m minbert.params.docs"


def test_every_table_has_its_markers_and_a_row_per_key():
    for name, (path, model, flatten) in docs.TABLES.items():
        text = (REPO / path).read_text()
        assert text.count(f"<!-- keys: {name} -->") == 1, (path, name)
        block = text.split(f"<!-- keys: {name} -->\n", 1)[1].split("<!-- /keys -->", 1)[0]
        keys = [line.split("|")[1].strip().strip("`") for line in block.splitlines()[2:]]
        nested = {f"{s}.{k}" for s in flatten for k in model.model_fields[s].annotation.model_fields}
        extra = {model.extra_key[0]} if getattr(model, "extra_key", None) else set()     # the heads' `<task>`
        assert set(keys) == (set(model.model_fields) - set(flatten)) | nested | extra, name


def test_an_edited_description_makes_the_tables_stale(monkeypatch):
    field = docs.FinetuneParams.model_fields["epochs"]
    monkeypatch.setattr(field, "description", "an edited help text")
    out = docs.outputs(REPO)
    assert out[REPO / "docs/finetuning.md"] != (REPO / "docs/finetuning.md").read_text()
    assert "| `epochs` | 3 | an edited help text |" in out[REPO / "docs/finetuning.md"]


def test_defaults_are_written_as_params_yaml_writes_them():
    rows = {k: d for k, d, _ in docs.rows(docs.FinetuneParams)}
    assert rows["tasks"] == "`[sst, para, sts]`"
    assert rows["lr"] == "2e-5" and rows["grad_clip"] == "1.0" and rows["compile"] == "false"
    assert rows["head_lr"] == "`null`" and rows["downsample"] == "`{mode: smallest}`" and rows["heads"] == ""
    assert {k: d for k, d, _ in docs.rows(docs.DistillParams)}["teacher"] == "(required)"


def _models(model: type[BaseModel], seen: set) -> set:
    """`model` and every model its fields hold (in unions, lists and mappings too)."""
    if model in seen:
        return seen
    seen.add(model)
    stack = [f.annotation for f in model.model_fields.values()]
    while stack:
        ann = stack.pop()
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            _models(ann, seen)
        stack += [a for a in typing.get_args(ann) if not isinstance(a, (str, int, float))]
    return seen


def test_every_user_facing_key_has_a_description():
    models = _models(Params, set()) | _models(ExperimentParams, set())
    assert len(models) >= 20
    missing = [f"{m.__name__}.{k}" for m in models for k, f in m.model_fields.items()
               if not (f.description or "").strip()]
    assert not missing, missing


def test_the_json_schema_carries_the_descriptions_and_describes_experiments():
    schema = json.loads((REPO / docs.SCHEMA_FILE).read_text())
    exp = schema["$defs"]["ExperimentParams"]
    assert exp["properties"]["seed"]["description"] == ExperimentParams.model_fields["seed"].description
    assert schema["properties"]["base"]["$ref"] == "#/$defs/ExperimentParams"
    fin = schema["$defs"]["FinetuneParams"]["properties"]["hidden_dropout"]
    assert "checkpoint's" in fin["description"]


@pytest.mark.parametrize("path", CATALOGUES)
def test_the_catalogues_validate_against_the_json_schema(path):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads((REPO / docs.SCHEMA_FILE).read_text()))
    raw = read_yaml(REPO / path)
    assert not [e.message for e in validator.iter_errors(raw)]
    raw.setdefault("base", {})["finetun"] = {}         # a typo an editor flags
    assert any("finetun" in e.message for e in validator.iter_errors(raw))


# ---------------------------------------------------------------- the checks are pure

@pytest.mark.parametrize("path", CATALOGUES)
def test_loading_and_checking_change_nothing_they_are_given(path):
    from minbert.params.load import with_transcriptions

    raw = read_yaml(REPO / path)
    raw_before = copy.deepcopy(raw)
    transcribed, _ = with_transcriptions(raw, REPO, path)      # the demo's tables, from params/papers.yaml
    assert raw == raw_before
    params = parse_params(transcribed, path)
    parsed_before = params.model_dump()
    loaded = expand(params, transcribed, path)
    assert params.model_dump() == parsed_before           # the expansion builds new objects
    state = (loaded.params.model_dump(), {k: e.model_dump() for k, e in loaded.experiments.items()},
             copy.deepcopy(loaded.groups))
    check_params(loaded.params, loaded.experiments, loaded.groups, path)
    assert (loaded.params.model_dump(), {k: e.model_dump() for k, e in loaded.experiments.items()},
            loaded.groups) == state
    validate_params(raw, path, REPO)
    assert raw == raw_before


# ---------------------------------------------------------------- what moved into the expansion

def _raw() -> dict:
    return {
        "experiments": {"a": {"finetune": {"epochs": 1}}, "b": {}, "r": {"repeats": 2}},
        "papers": {"p": {"title": "A paper", "overall": "mean"}},
        "studies": [
            {"name": "s1", "title": "Rows", "experiments": ["a", "r"]},
            {"name": "s2", "title": "A table", "paper": {
                "id": "p", "table": "Table 1", "columns": [{"name": "Dev", "metric": "overall"}],
                "rows": [{"label": "A", "run": "b", "dev": {"Dev": 0.5}},
                         {"label": "Best", "best_of": ["s1", "a"], "dev": {"Dev": 0.6}}]}},
        ],
    }


def test_the_expansion_fills_in_what_the_checks_used_to():
    raw = _raw()
    raw["ensembles"] = {"e": {"members": ["r"]}}
    raw["export"] = {"experiments": ["r", "r.seed11711", "a"]}
    raw["studies"].append({"name": "g", "title": "Grid", "grid": {
        "experiment": "a", "axes": [{"key": "finetune.hidden_dropout", "label": "d", "values": [0.1, 0.2]}]}})
    lp = validate_params(raw)
    seeds = ["r.seed11711", "r.seed11712"]
    assert lp.groups == {"r": seeds}
    assert lp.params.ensembles["e"].members == seeds
    assert lp.params.export.experiments == seeds + ["a"]
    s2 = lp.params.studies[1]
    assert s2.experiments == ["b"]                          # the row's run joins the study
    assert s2.paper.row("Best").best_of == ["a", "r"]       # a study stands for its rows
    assert lp.params.studies[2].experiments == ["g.d0.1", "g.d0.2"]
    assert lp.experiments["g.d0.2"].finetune.hidden_dropout == 0.2
    assert raw == {**_raw(), "ensembles": raw["ensembles"], "export": raw["export"], "studies": raw["studies"]}
    assert [st["name"] for st in raw["studies"]] == ["s1", "s2", "g"] and "experiments" not in raw["studies"][1]


def _set(raw, path: str, value):
    node = raw
    parts = path.split("/")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    node[parts[-1]] = value


BAD = [   # (what is set, the error)
    ({"ensembles": {"e": {"members": ["a", "zz"]}}}, "key 'ensembles.e.members': unknown experiment 'zz'"),
    ({"ensembles": {"e": {"members": ["a"]}}}, "key 'ensembles.e.members': an ensemble needs at least two members "
                                               "(got ['a'])"),
    ({"ensembles": {"e": {"members": ["r", "r.seed11711"]}}}, "key 'ensembles.e.members': lists a member twice"),
    ({"export": {"experiments": ["r", "zz"]}}, "key 'export.experiments': unknown experiment 'zz'"),
    ({"studies/1/paper/rows/0/run": "zz"}, "key 'studies[1].paper.rows[0].run' (row 'A'): unknown experiment or "
                                           "ensemble 'zz'"),
    ({"studies/1/paper/rows/1/best_of": ["s9"]}, "key 'studies[1].paper.rows[1].best_of' (row 'Best'): 's9' is no "
                                                 "experiment, ensemble or study"),
    ({"studies/1/paper/id": "q"}, "key 'studies[1].paper.id' (study 's2'): unknown paper 'q'"),
    ({"studies/0/experiments": ["a", "zz"]}, "key 'studies[0].experiments' (study 's1'): unknown experiment 'zz'"),
    ({"studies/0/baseline": "b"}, "key 'studies[0].baseline' (study 's1'): 'b' is not one of the study's "
                                  "experiments"),
    ({"studies/0/experiments": []}, "key 'studies[0]' (study 's1'): no rows"),
    ({"studies/0/grid": {"experiment": "zz", "axes": [{"key": "seed", "values": [1, 2]}]}},
     "key 'studies[0].grid.experiment' (study 's1'): unknown experiment 'zz'"),
    ({"studies/0/grid": {"experiment": "a", "axes": [{"key": "seed", "values": [1]}]}, "experiments/s1.seed1": {}},
     "key 'studies[0].grid' (study 's1'): its cell 's1.seed1' is also an experiment"),
    ({"experiments/a/pretrain": "zz"}, "key 'experiments.a.pretrain': unknown pretraining 'zz'"),
    ({"experiments/r.seed11712": {}}, "key 'experiments.r.repeats': seed 11712 would be experiment 'r.seed11712', "
                                      "which params.yaml already defines"),
    ({"experiments/a/finetune/distill": {"teacher": "zz"}},
     "key 'experiments.a.finetune.distill.teacher': unknown experiment or ensemble 'zz'"),
]


@pytest.mark.parametrize("settings, expected", BAD, ids=[e.split(":")[0] for _, e in BAD])
def test_a_bad_catalogue_still_gives_its_one_line_error(settings, expected):
    raw = _raw()
    for key, value in settings.items():
        _set(raw, key, value)
    with pytest.raises(MinBertError) as err:
        validate_params(raw)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("params.yaml: ") and expected in msg, msg


def test_the_package_imports_point_one_way():
    """messages <- fields <- heads, plateau <- finetune, tasks (neither imports the other) <- schema <- settings (the
    models a job reads) <- studies (the report's sections and the whole file) <- catalogue, validate, scales
    (none imports another) <- resolve (each job's settings), load <- overrides (the command line's settings),
    unread (settings no job reads) <- the rest."""
    import ast

    rank = {"messages": 0, "fields": 1, "heads": 2, "plateau": 2, "finetune": 3, "tasks": 3, "schema": 4, "settings": 5,
            "studies": 5, "catalogue": 6, "validate": 6, "scales": 6, "resolve": 7, "load": 7, "overrides": 8,
            "unread": 8}
    for path in sorted((REPO / "minbert/params").glob("*.py")):
        own = rank.get(path.stem, 9)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minbert."):
                target = node.module.split(".")
                assert target[1] in ("core", "params"), f"{path.name} imports {node.module}"
                if target[1] == "params" and len(target) > 2 and path.stem != "__init__":
                    assert rank.get(target[2], 9) < own, f"{path.name} imports {node.module}"


def test_an_unknown_table_marker_is_a_one_line_error():
    with pytest.raises(MinBertError, match=r"docs/finetuning.md: unknown key table 'finetun' .*finetune, heads"):
        docs.render_doc("<!-- keys: finetun -->\n<!-- /keys -->\n", "docs/finetuning.md")
