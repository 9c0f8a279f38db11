"""Settings from the command line with `dvc exp run -S`'s grammar (minbert.params.overrides: what
`snakemake --config set=...` applies), and the settings no job reads (minbert.params.unread),
said at load and left out of the jobs' descriptions so that changing them re-runs nothing."""
from __future__ import annotations

import pytest
import yaml

from minbert.core.errors import MinBertError
from minbert.params import validate_params
from minbert.params.overrides import load_with_overrides, split_set
from minbert.params.unread import unread_settings
from minbert.pipeline.plan import pipeline


def write_params(folder, raw: dict, catalogue: dict | None = None):
    (folder / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    if catalogue is not None:
        (folder / "params").mkdir(exist_ok=True)
        (folder / "params" / "cat.yaml").write_text(yaml.safe_dump(catalogue, sort_keys=False), encoding="utf-8")
    return folder / "params.yaml"


RAW = {"base": {"seed": 1, "finetune": {"lr": 1.0e-4, "head_lr": 3.0e-3}},
       "experiments": {"a": {"finetune": {"epochs": 2}}, "b": {}}}


# ---------------------------------------------------------------- --config set

@pytest.mark.parametrize("value,expected", [
    ("a.b=1", ["a.b=1"]),
    ("a.b=1 ++c.d=[sst,para]", ["a.b=1", "++c.d=[sst,para]"]),
    ("a.d='two words' b=2", ["a.d=two words", "b=2"]),
    ('a.d="two words', ["a.d=two words"]),          # Snakemake stripped the closing quote of the whole value
    ({"a.d={x": "1}"}, ["a.d={x: 1}"]),               # Snakemake read `a.d={x: 1}` as a YAML mapping
    (None, []),
])
def test_the_set_value_snakemake_hands_over_is_split_into_overrides(value, expected):
    assert split_set(value) == expected


def test_overrides_change_add_and_remove_as_dvc_exp_run_s_does(tmp_path):
    path = write_params(tmp_path, RAW)
    lp = load_with_overrides(path, ["base.seed=7", "++experiments.b.finetune.lr=5e-5", "+experiments.a.seed=3",
                                    "~experiments.a.finetune.epochs", "++experiments.b.finetune.tasks=[sst,para]"])
    assert lp.experiment("a").seed == 3 and lp.experiment("b").seed == 7
    assert lp.experiment("b").finetune.lr == 5e-5 and lp.experiment("a").finetune.lr == 1e-4
    assert lp.experiment("a").finetune.epochs == 3                       # back to the default
    assert lp.experiment("b").finetune.tasks == ["sst", "para"]
    assert lp.raw["experiments"]["b"]["finetune"]["lr"] == 5e-5          # what the report shows
    assert yaml.safe_load(path.read_text()) == RAW                      # the file is left as it was
    assert load_with_overrides(path, []).experiment("b").finetune.lr == 1e-4


@pytest.mark.parametrize("override,message", [
    ("experiments.b.finetune.lr=5e-5", "params.yaml does not set 'experiments.b.finetune'; write "
                                       "++experiments.b.finetune.lr=5e-5 to add it"),
    ("experiments.a.finetune.lr=5e-5", "params.yaml does not set 'experiments.a.finetune.lr'; write "
                                       "++experiments.a.finetune.lr=5e-5 to add it"),
    ("experiments.a.finetune.epoch=3", "does not set 'experiments.a.finetune.epoch' (did you mean 'epochs'?); "
                                       "write experiments.a.finetune.epochs=3"),
    # a typo is told the params' own key, never to add the typo
    ("experiments.b.finetune.lrr=1", "does not set 'experiments.b.finetune'; and no params file may set it: "
                                     "unknown key 'experiments.b.finetune.lrr' (did you mean 'lr'?)"),
    ("experiments.a.finetune.epochz=1", "(did you mean 'epochs'?); write experiments.a.finetune.epochs=1"),
    ("experiments.a.finetune.head_lrr=1", "does not set 'experiments.a.finetune.head_lrr'; and no params file may set "
                                          "it: unknown key 'experiments.a.finetune.head_lrr' (did you mean 'head_lr'?)"),
    ("++experiments.a.finetune.epoch=3", "unknown key 'experiments.a.finetune.epoch' (did you mean 'epochs'?)"),
    ("base.finetune.lr=fast", "key 'base.finetune.lr': Input should be a valid number"),
    ("+base.seed=2", "already sets 'base.seed'"),
    ("~experiments.c", "has no key 'experiments.c' to remove"),
    ("base.finetune.lr=1e-4,5e-5", "is a sweep of several values; one Snakemake run takes one value"),
    ("base.seed", "write KEY=VALUE"),
    ("experiments.x.seed=1", "does not set 'experiments.x'"),
    ("other.yaml:base.seed=1", "other.yaml is not a params file of this run"),
])
def test_a_bad_override_is_one_line_naming_it(tmp_path, override, message):
    path = write_params(tmp_path, RAW)
    with pytest.raises(MinBertError) as err:
        load_with_overrides(path, [override])
    assert "\n" not in str(err.value) and message in str(err.value), str(err.value)


def test_a_catalogue_key_is_set_in_the_catalogue_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path, {"catalogue": "cat", "report": {"title": "t"}}, catalogue={k: v for k, v in RAW.items()})
    lp = load_with_overrides("params.yaml", ["params/cat.yaml:++experiments.a.seed=5", "report.title=u"])
    assert lp.experiment("a").seed == 5 and lp.params.report.title == "u"
    with pytest.raises(MinBertError, match=r"names `catalogue: cat`, which holds that section; write "
                                           r"params/cat.yaml:\+\+experiments.a.seed=5"):
        load_with_overrides("params.yaml", ["++experiments.a.seed=5"])


# ---------------------------------------------------------------- settings no job reads

def lines(raw: dict) -> list[str]:
    return unread_settings(validate_params(raw))


def test_the_shipped_demo_sets_nothing_that_is_never_read(repo_root, monkeypatch):
    from minbert.params import load_params

    monkeypatch.chdir(repo_root)
    assert unread_settings(load_params("params.yaml")) == []


@pytest.mark.parametrize("experiment,key,why", [
    ({"finetune": {"freeze_encoder": True, "lr": 1e-3}}, "experiments.x.finetune.lr", "the encoder is frozen"),
    ({"finetune": {"smart": {"lambda_s": 3.0}}}, "experiments.x.finetune.smart.lambda_s", "`smart.enabled` is false"),
    ({"finetune": {"temperature": 3.0}}, "experiments.x.finetune.temperature", "`schedule: temperature`"),
    ({"finetune": {"downsample": {"mode": "none", "size": 5}}}, "experiments.x.finetune.downsample.size",
     "`downsample.mode: fixed`"),
    ({"finetune": {"heads": {"para": "cross", "sts": "cross", "cosine_affine": False}}},
     "experiments.x.finetune.heads.cosine_affine", "no head of the run reads it (only cosine, cosine_linear)"),
    ({"retrain_heads": {"lr": 1e-2}}, "experiments.x.retrain_heads.lr", "head retraining is off"),
    ({"pretrain": "p", "model": "bert-base-uncased"}, "experiments.x.model", "starts from pretraining `p`"),
], ids=["frozen_lr", "smart_off", "schedule", "downsample", "heads", "retrain_off", "model_with_pretrain"])
def test_a_setting_no_job_reads_is_one_line_saying_why(experiment, key, why):
    raw = {"base": {"finetune": {"head_lr": 3e-3}}, "pretrainings": {"p": {"kind": "mlm"}},
           "experiments": {"x": experiment, "y": {}}}
    got = lines(raw)
    assert len(got) == 1 and f"key '{key}'" in got[0] and why in got[0] and "\n" not in got[0], got


def test_base_and_pretraining_settings_no_job_reads(tmp_path):
    raw = {"base": {"finetune": {"smart": {"mu": 0.5}, "lr": 5e-5}},
           "pretrainings": {"p": {"kind": "mlm", "nli": {"objective": "triplet"}}},
           "experiments": {"x": {"pretrain": "p"}, "y": {"finetune": {"smart": {"enabled": True}}}}}
    got = lines(raw)
    assert any("'pretrainings.p.nli.objective'" in g and "the `nli` kind's section" in g for g in got), got
    assert not [g for g in got if "base.finetune.smart.mu" in g]      # y reads it
    raw["experiments"]["y"] = {}
    assert any("'base.finetune.smart.mu'" in g and "`smart.enabled` is false" in g for g in lines(raw))
    assert not [g for g in lines(raw) if "base.finetune.lr" in g]       # every experiment reads it


def test_a_scales_settings_are_judged_over_every_experiment():
    """A scale sets its keys in every experiment (minbert.params.scales): a key a frozen row skips is
    read by the others, and the base's values the scale overrides are another scale's. Said once, under
    the scale, only when no experiment reads it."""
    scales = {"small": {"description": "one epoch", "experiments": {"finetune": {"lr": 5e-5, "head_lr": 1e-3, "epochs": 1}}},
              "big": {"description": "as written"}}
    raw = {"scale": "small", "scales": scales, "base": {"finetune": {"epochs": 10, "lr": 1e-5}},
           "experiments": {"frozen": {"finetune": {"freeze_encoder": True}}, "tuned": {}}}
    assert lines(raw) == []
    raw["experiments"]["tuned"] = {"finetune": {"freeze_encoder": True}}
    got = lines(raw)
    assert len(got) == 1 and "'scales.small.experiments.finetune.lr'" in got[0] and "the encoder is frozen" in got[0], got


def test_a_setting_at_its_default_or_read_somewhere_is_not_reported():
    raw = {"experiments": {"x": {"finetune": {"freeze_encoder": True, "lr": 2e-5, "head_lr": 1e-3}},   # lr: default
                           "y": {"finetune": {"freeze_encoder": True, "lr": 1e-3}},        # no head_lr: heads use lr
                           "z": {"finetune": {"schedule": "temperature", "temperature": 3.0}},
                           "w": {"retrain_heads": {"enabled": True, "lr": 1e-2}}}}
    assert lines(raw) == []


def test_changing_a_setting_no_job_reads_changes_no_job():
    def finetune_of(lr):
        lp = validate_params({"base": {"finetune": {"head_lr": 3e-3}},
                              "experiments": {"x": {"finetune": {"freeze_encoder": True, "lr": lr}}}})
        return next(j for j in pipeline(lp) if j.id == "finetune@x").settings

    assert finetune_of(1e-3) == finetune_of(5e-4)


def test_sections_of_params_yaml_beside_a_catalogue_are_never_read(tmp_path, monkeypatch):
    from minbert.params import load_params

    monkeypatch.chdir(tmp_path)
    write_params(tmp_path, {"catalogue": "cat", "experiments": {"a": {"seed": 9}}}, catalogue=RAW)
    got = unread_settings(load_params("params.yaml"))
    assert got == ["params.yaml: key 'experiments' is never read: `catalogue: cat` takes that section from "
                   "params/cat.yaml; set it there (dvc exp run -S 'params/cat.yaml:experiments...')"]


# ---------------------------------------------------------------- DVC's rewrite of the params files

SHIPPED = ["params.yaml", "params/papers.yaml", "params/minilm.yaml"]


@pytest.mark.parametrize("name", SHIPPED)
def test_dvc_exp_run_s_rewrites_every_shipped_params_file(repo_root, tmp_path, name):
    """DVC's own rewrite (dvc.utils.hydra.apply_overrides, what `dvc exp run -S` runs) of each shipped
    file, one seed set in every experiment at once: the file reads back as it was but for those keys
    (anchors, aliases, merge keys and comments included)."""
    pytest.importorskip("dvc")
    from dvc.utils.hydra import apply_overrides

    from minbert.params import read_yaml
    from minbert.params.overrides import dvc_rewrite_problems

    assert dvc_rewrite_problems(repo_root / name) == []
    copy = tmp_path / "params.yaml"
    copy.write_bytes((repo_root / name).read_bytes())
    before = read_yaml(copy)
    seeds = {e: 1000 + k for k, e in enumerate(before["experiments"])}
    apply_overrides(copy, [f"++experiments.{e}.seed={s}" for e, s in seeds.items()])
    after = read_yaml(copy)
    for e, s in seeds.items():
        before["experiments"][e] = {**(before["experiments"][e] or {}), "seed": s}
    assert after == before


def test_what_breaks_dvcs_rewrite_is_said_and_breaks_it(tmp_path):
    """The one construct DVC's rewrite corrupts, a comment after an anchor on a list's key: the check
    names it, and DVC's own rewrite indeed fails on it (and not once the comment has moved)."""
    dvc = pytest.importorskip("dvc.utils.hydra")
    from minbert.params.overrides import dvc_rewrite_problems

    bad = tmp_path / "params.yaml"
    bad.write_text("papers:\n  a:\n    differs: &d     # a comment\n      - {setting: x}\n  b:\n    differs: *d\n"
                   "\nseed: 1\n", encoding="utf-8")
    (problem,) = dvc_rewrite_problems(bad)
    assert problem.startswith(f"{bad} line 3: a comment after the anchor &d of a list") and "\n" not in problem
    from dvc.utils.serialize import load_yaml

    dvc.apply_overrides(bad, ["seed=2"])
    with pytest.raises(Exception, match="YAML file structure is corrupted"):   # what `dvc exp run -S` then says
        load_yaml(bad)
    good = tmp_path / "good.yaml"
    good.write_text("papers:\n  a:\n    # a comment\n    differs: &d\n      - {setting: x}\n  b:\n    differs: *d\n"
                    "\nseed: 1\n", encoding="utf-8")
    assert dvc_rewrite_problems(good) == []
    dvc.apply_overrides(good, ["seed=2"])
    assert yaml.safe_load(good.read_text())["papers"]["b"]["differs"] == [{"setting": "x"}]
