"""params.yaml validation: the shipped files are valid, and bad params fail with one line that
names the key (and the nearest valid key for a typo)."""
from __future__ import annotations

import copy

import pytest
import yaml

from minbert.core.errors import MinBertError
from minbert.params import load_params, validate_params

BASE = {"base": {"finetune": {"epochs": 1}},
        "pretrainings": {"mlm_a": {"kind": "mlm"}},
        "experiments": {"a": {}, "b": {"seed": 2}, "c": {"pretrain": "mlm_a"}},
        "ensembles": {"ab": {"members": ["a", "b"]}},
        "studies": [{"name": "s1", "title": "S", "experiments": ["a", "b", "ab"]}]}


def with_(**changes):
    raw = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = raw
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        node[keys[-1]] = value
    return raw


def error_of(raw) -> str:
    with pytest.raises(MinBertError) as e:
        validate_params(raw, "params.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_valid_params_resolve_experiments():
    lp = validate_params(copy.deepcopy(BASE))
    assert lp.experiment("b").seed == 2 and lp.experiment("b").finetune.epochs == 1
    assert lp.overrides("b") == {"seed": 2}


def test_unknown_key_names_it_and_suggests():
    msg = error_of(with_(experiments__a={"finetune": {"epoch": 3}}))
    assert msg == "params.yaml: unknown key 'experiments.a.finetune.epoch' (did you mean 'epochs'?)"
    msg = error_of(with_(base={"finetune": {"bach_size": 3}}))
    assert msg == "params.yaml: unknown key 'base.finetune.bach_size' (did you mean 'batch_size'?)"
    msg = error_of({**copy.deepcopy(BASE), "studys": []})
    assert msg == "params.yaml: unknown key 'studys' (did you mean 'studies'?)"


def test_wrong_type_names_the_key_and_value():
    msg = error_of(with_(experiments__a={"finetune": {"lr": "fast"}}))
    assert msg.startswith("params.yaml: key 'experiments.a.finetune.lr': ") and "'fast'" in msg
    msg = error_of(with_(experiments__b={"finetune": {"schedule": "round_robbin"}}))
    assert "key 'experiments.b.finetune.schedule'" in msg and "round_robbin" in msg


def test_unknown_experiment_in_study():
    raw = with_(studies=[{"name": "s1", "title": "S", "experiments": ["a", "bb"]}])
    assert error_of(raw) == ("params.yaml: key 'studies[0].experiments' (study 's1'): unknown experiment "
                             "'bb' (did you mean 'b'?)")


def test_ensemble_member_that_does_not_exist():
    raw = with_(ensembles={"ab": {"members": ["a", "bb"]}})
    assert error_of(raw) == "params.yaml: key 'ensembles.ab.members': unknown experiment 'bb' (did you mean 'b'?)"
    assert "at least two members" in error_of(with_(ensembles={"ab": {"members": ["a"]}}))
    assert "lists a member twice" in error_of(with_(ensembles={"ab": {"members": ["a", "a"]}}))


def test_impossible_combinations():
    assert "unknown pretraining 'mlm_b'" in error_of(with_(experiments__c={"pretrain": "mlm_b"}))
    raw = with_(experiments__a={"finetune": {"tasks": ["sst"], "pcgrad": True}})
    assert error_of(raw).startswith("params.yaml: key 'experiments.a.finetune.pcgrad': PCGrad needs at least two")
    raw = with_(data={"nli_file": None}, pretrainings={"mlm_a": {"kind": "mlm"}, "nli_a": {"kind": "nli"}})
    assert error_of(raw) == ("params.yaml: key 'pretrainings.nli_a.kind': NLI pretraining needs NLI data; "
                             "set 'data.nli_file'")
    raw = with_(pretrainings={"mlm_a": {"kind": "mlm", "mlm": {"tasks": ["cfimdb"]}}})
    assert "'cfimdb' needs 'data.include_cfimdb: true'" in error_of(raw)
    raw = with_(experiments__a={"finetune": {"tasks": ["sst", "para"], "smart": {"enabled": True, "tasks": ["sts"]}}})
    assert error_of(raw) == ("params.yaml: key 'experiments.a.finetune.smart.tasks': 'sts' is not trained by "
                             "this experiment (finetune.tasks: ['sst', 'para'])")
    raw = with_(experiments__a={"finetune": {"heads": {"para": "cross", "hybrid": ["para"]}}})
    assert error_of(raw) == ("params.yaml: key 'experiments.a.finetune.heads': hybrid lists para, whose head "
                             "'cross' is no bi-encoder head: give para a bi-encoder head (concat, concat_cos, "
                             "concat_mult, concat_uv, cosine, cosine_linear)")
    raw = with_(experiments__a={"finetune": {"freeze_encoder": True}, "retrain_heads": {"enabled": True}})
    assert "key 'experiments.a.retrain_heads.enabled'" in error_of(raw)
    raw = with_(experiments__a={"finetune": {"tasks": ["sst"]}}, experiments__b={"finetune": {"tasks": ["sts"]}})
    assert "the members share no task" in error_of(raw)


def test_settings_that_would_do_nothing_or_disagree_are_refused():
    # PCGrad projects the gradients of one update's tasks: under round-robin there is one
    raw = with_(experiments__a={"finetune": {"pcgrad": True}})
    assert error_of(raw).startswith("params.yaml: key 'experiments.a.finetune.pcgrad': PCGrad projects the "
                                    "gradients of the tasks of one update, and under schedule 'round_robin'")
    validate_params(with_(experiments__a={"finetune": {"pcgrad": True, "schedule": "simultaneous"}}))
    # NLI pretraining trains the pooled embedding fine-tuning must read
    raw = with_(pretrainings={"mlm_a": {"kind": "mlm"}, "nli_a": {"kind": "nli", "nli": {"pooling": "mean"}}},
                experiments__a={"pretrain": "nli_a", "finetune": {"heads": {"pooling": "cls"}}})
    assert "the NLI pretraining 'nli_a' trains mean-pooled sentence embeddings but sst reads 'cls'" \
        in error_of(raw)
    # ... a task's own pooling included
    raw = with_(pretrainings={"mlm_a": {"kind": "mlm"}, "nli_a": {"kind": "nli", "nli": {"pooling": "mean"}}},
                experiments__a={"pretrain": "nli_a", "finetune": {"heads": {"pooling": "mean",
                                                                             "task_pooling": {"sts": "cls"}}}})
    assert ("key 'experiments.a.finetune.heads.task_pooling.sts': the NLI pretraining 'nli_a' trains mean-pooled "
            "sentence embeddings but sts reads 'cls'") in error_of(raw)
    # a prototypes head needs the encoder frozen while it trains
    raw = with_(experiments__a={"finetune": {"heads": {"sst": "prototypes"}}})
    assert "key 'experiments.a.finetune.heads.sst': sst's head 'prototypes' trains over a frozen encoder only" \
        in error_of(raw)
    validate_params(with_(experiments__a={"finetune": {"tasks": ["para", "sts"], "heads": {"sst": "prototypes"}},
                                          "retrain_heads": {"enabled": True, "tasks": ["sst"]}}))
    # the frozen encoder's dropout is a setting of a frozen encoder only
    raw = with_(experiments__a={"finetune": {"frozen_encoder_dropout": True}})
    assert "key 'experiments.a.finetune.frozen_encoder_dropout': applies to a frozen encoder only" in error_of(raw)
    validate_params(with_(experiments__a={"finetune": {"freeze_encoder": True, "frozen_encoder_dropout": True}}))
    # extra transformer layers are for one-sentence tasks; walked tasks must be trained
    assert "extra_layers lists sts" in error_of(with_(experiments__a={"finetune": {"heads": {"extra_layers": {"sts": 2}}}}))
    raw = with_(experiments__a={"finetune": {"tasks": ["sst", "sts"], "walk_through": ["para"]}})
    assert "key 'experiments.a.finetune.walk_through': 'para' is not trained" in error_of(raw)
    # a paraphrase-first pretraining's own fine-tuning settings are checked where they are written
    raw = with_(pretrainings={"mlm_a": {"kind": "mlm"}, "pf": {"kind": "para_first", "finetune": {"hidden_dropout": 2}}})
    assert error_of(raw).startswith("params.yaml: key 'pretrainings.pf.finetune.hidden_dropout'")
    raw = with_(pretrainings={"mlm_a": {"kind": "mlm", "finetune": {"hidden_dropout": 0.3}}})
    assert "only a para_first pretraining trains with the fine-tuning settings" in error_of(raw)


def test_repeats_expand_into_seed_experiments():
    lp = validate_params({"experiments": {"a": {"repeats": 3}, "b": {"repeats": [5, 7]}, "c": {}},
                          "ensembles": {"e": {"members": ["a"]}},
                          "studies": [{"name": "s", "title": "t", "experiments": ["a", "c"], "repeats": 2}]})
    assert list(lp.experiments) == ["a.seed11711", "a.seed11712", "a.seed11713", "b.seed5", "b.seed7",
                                    "c.seed11711", "c.seed11712"]
    assert lp.groups["a"] == ["a.seed11711", "a.seed11712", "a.seed11713"]
    assert lp.params.ensembles["e"].members == lp.groups["a"]            # the seed ensemble: one entry
    assert {lp.experiments[m].seed for m in lp.groups["b"]} == {5, 7}
    with pytest.raises(MinBertError, match="runs as 3 seeds; name one of them"):
        lp.experiment("a")
    raw = {"experiments": {"a": {"repeats": 2}, "a.seed11712": {}}}
    assert "would be experiment 'a.seed11712', which params.yaml already defines" in error_of(raw)


def test_shipped_params_and_the_papers_catalogue_are_valid(repo_root, tmp_path):
    demo = load_params(repo_root / "params.yaml")
    assert demo.params.catalogue == "demo" and demo.source == repo_root / "params.yaml"
    assert 4 <= len(demo.experiments) <= 8 and demo.params.studies and demo.params.ensembles
    # the switch: one key selects params/papers.yaml's sections, another the papers' model
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "papers.yaml").write_text((repo_root / "params" / "papers.yaml").read_text())
    text = (repo_root / "params.yaml").read_text().replace("\ncatalogue: demo\n",
                                                           "\ncatalogue: papers\nmodel: bert-base-uncased\n")
    (tmp_path / "params.yaml").write_text(text)
    full = load_params(tmp_path / "params.yaml")
    assert full.source == tmp_path / "params" / "papers.yaml" and full.params.scale == "paper"
    assert full.experiment("p000_mt_sequential_rr.seed11711").model == "bert-base-uncased"
    assert len(full.params.ensembles["p002_ensemble"].members) == 15            # five cells, three seeds each
    sources = {s.source.split(",")[0].split()[0] for s in full.params.studies}
    assert sources == {"000", "002", "003", "004"}       # every paper has its tables
    assert full.params.report.title == demo.params.report.title      # `report` stays in params.yaml


def test_minilm_catalogue_is_valid(repo_root, tmp_path):
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "minilm.yaml").write_text((repo_root / "params" / "minilm.yaml").read_text())
    text = (repo_root / "params.yaml").read_text().replace("catalogue: demo", "catalogue: minilm")
    (tmp_path / "params.yaml").write_text(text)
    minilm = load_params(tmp_path / "params.yaml")
    mt = minilm.experiment("mt")
    assert mt.model == "all-MiniLM-L6-v2" and mt.precision == "auto" and mt.finetune.heads.symmetric_pairs
    assert mt.finetune.downsample.caps == {"para": 6040}           # Quora at the STS training size
    kinds = {(p.kind, p.nli.objective if p.kind == "nli" else None) for p in minilm.params.pretrainings.values()}
    assert kinds == {("mlm", None), ("nli", "regression"), ("nli", "contrastive"), ("nli", "triplet"),
                     ("para_first", None)}
    assert minilm.experiment("frozen").finetune.freeze_encoder


@pytest.mark.parametrize("old, new", [("full", "catalogue: papers, model: bert-base-uncased and scale: paper"),
                                      ("reproduce", "catalogue: papers and scale: laptop or scale: paper")])
def test_the_catalogues_merged_into_papers_say_their_new_spelling(tmp_path, old, new):
    """`catalogue: full` and `catalogue: reproduce` (and a params file params/full.yaml) are now one
    catalogue, params/papers.yaml, with the model and the scale as settings: one line says what to write."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params.yaml").write_text(f"catalogue: {old}\n")
    for path in (tmp_path / "params.yaml", tmp_path / "params" / f"{old}.yaml"):
        with pytest.raises(MinBertError) as e:
            load_params(path)
        assert f"catalogue '{old}' is now params/papers.yaml" in str(e.value) and new in str(e.value)
        assert "\n" not in str(e.value)


def test_catalogue_errors(tmp_path):
    (tmp_path / "params.yaml").write_text("catalogue: ful\nexperiments: {a: {}}\n")
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "full.yaml").write_text(yaml.safe_dump({"experiments": {"a": {}}}))
    with pytest.raises(MinBertError, match=r"key 'catalogue': no catalogue file .*ful.yaml \(did you mean 'full'\?\)"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params" / "full.yaml").write_text(yaml.safe_dump({"experiments": {"a": {}}, "reprt": {}}))
    (tmp_path / "params.yaml").write_text("catalogue: full\n")
    with pytest.raises(MinBertError, match=r"full.yaml: unknown key 'reprt'"):
        load_params(tmp_path / "params.yaml")


def test_booleans_are_not_numbers_and_seeds_are_distinct():
    """`seed: yes` is not seed 1, `repeats: [5, 5]` not one seed (issue 33, case 10)."""
    for changes in ({"experiments__a": {"seed": True}}, {"experiments__a": {"repeats": True}},
                    {"experiments__a": {"repeats": [5, False]}}, {"base": {"finetune": {"epochs": True}}},
                    {"experiments__a": {"finetune": {"downsample": {"caps": {"sts": True}}}}},
                    {"data": {"seed": False}}):
        msg = error_of(with_(**changes))
        assert "true/false" in msg and "key '" in msg, msg
    msg = error_of(with_(experiments__a={"repeats": [5, 6, 5]}))
    assert msg.startswith("params.yaml: key 'experiments.a.repeats': seed 5 is listed twice")
    assert "empty list" in error_of(with_(experiments__a={"repeats": []}))
    # booleans where booleans belong still pass
    validate_params(with_(experiments__a={"finetune": {"pcgrad": False}, "deterministic": True}))


@pytest.mark.parametrize("loss", ["pearson", "mse+pearson"])
def test_a_pearson_loss_needs_batches_of_two_sts_pairs(loss):
    """A correlation over one pair is undefined: the loss would be constant (issue 33, case 6)."""
    ft = {"heads": {"losses": {"sts": loss}}, "tasks": ["sts"]}
    msg = error_of(with_(experiments__a={"finetune": {**ft, "batch_size": 1}}))
    assert msg.startswith(f"params.yaml: key 'experiments.a.finetune.batch_size': sts's loss '{loss}' is a "
                          f"statistic of the whole batch") and "another loss" in msg
    msg = error_of(with_(experiments__a={"finetune": {**ft, "downsample": {"mode": "fixed", "size": 1}}}))
    assert "key 'experiments.a.finetune.downsample'" in msg
    msg = error_of(with_(experiments__a={"finetune": {**ft, "downsample": {"caps": {"sts": 1}}}}))
    assert "key 'experiments.a.finetune.downsample'" in msg
    msg = error_of(with_(experiments__a={"finetune": {"heads": {"losses": {"sts": loss}}}, "retrain_heads": {
        "enabled": True, "batch_size": 1, "tasks": ["sts"]}}))
    assert "key 'experiments.a.retrain_heads.batch_size'" in msg
    validate_params(with_(experiments__a={"finetune": {**ft, "batch_size": 2}}))
    validate_params(with_(experiments__a={"finetune": {"heads": {"losses": {"sts": "mse"}}, "batch_size": 1}}))


@pytest.mark.parametrize("nested", ["[" * 600 + "]" * 600, "{a: " * 600 + "1" + "}" * 600], ids=["lists", "mappings"])
def test_deeply_nested_yaml_is_one_line(tmp_path, nested):
    """Hundreds of nesting levels: one line, not a RecursionError (issue 33, case 13)."""
    p = tmp_path / "params.yaml"
    p.write_text(f"base:\n  finetune:\n    task_weights: {nested}\n", encoding="utf-8")
    with pytest.raises(MinBertError) as e:
        load_params(p)
    assert str(e.value) == f"{p}: nested too deeply (hundreds of levels of mappings or lists); params nest a few " \
                           f"levels: fix the file"


def test_deeply_nested_json_the_stages_read_is_one_line(tmp_path):
    """The class of case 13 beyond params: a run record, metrics.json or job file nested thousands deep."""
    from minbert.pipeline.job import Job
    from minbert.report.data import read_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MinBertError, match="nested too deeply"):
        read_json(deep)
    with pytest.raises(MinBertError, match=r"not a job file of this version \(RecursionError\)"):
        Job.read(deep, "prepare", None)


def test_a_correlation_loss_over_one_sts_row_is_refused_when_training_starts():
    """The data side of case 6: STS cut to one row by the data itself (the settings allow more)."""
    from minbert.params.finetune import FinetuneParams
    from minbert.train.experiment import refuse_one_row_batches

    cfg = FinetuneParams(heads={"losses": {"sts": "pearson"}})
    with pytest.raises(MinBertError, match=r"^a: sts's loss 'pearson' is a statistic of the whole batch, and the sts "
                                           r"training data has 1 row"):
        refuse_one_row_batches(cfg, {"sst": [0] * 5, "sts": [0]}, "a")
    refuse_one_row_batches(cfg, {"sts": [0, 1]}, "a")
    refuse_one_row_batches(FinetuneParams(), {"sts": [0]}, "a")
