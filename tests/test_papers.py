"""The full catalogue against the reports: every row of the rows tables in docs/papers.md names an
experiment of params/full.yaml whose resolved settings are the ones the table states (tasks,
schedule, heads, pooling, data sizes, learning rate, batch, epochs, dropout, what is frozen and
retrained, regularisers, pretraining), and every study of the catalogue has its rows there."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from minbert.params import ExperimentParams, LoadedParams, load_params

PINNED = ["tasks", "schedule", "heads", "pooling", "data", "lr", "batch", "epochs", "dropout", "training",
          "regularisers", "pretraining"]


def _num(x) -> str:
    return f"{x:g}"


def _heads(exp: ExperimentParams) -> str:
    h, tasks = exp.finetune.heads, set(exp.finetune.tasks) | set(exp.retrain_heads.tasks or [])
    parts = [f"{t} {getattr(h, t)}" for t in ("para", "sts") if t in tasks]
    uses_cosine = any(getattr(h, t) in ("cosine", "cosine_linear") for t in ("para", "sts") if t in tasks)
    if uses_cosine and not h.cosine_affine:
        parts.append("plain cosine")
    if "sts" in tasks and h.sts == "cosine" and h.cosine_target == "-1_1":
        parts.append("STS scaled -1..1")
    if "sts" in tasks and h.sts_loss != "mse":
        parts.append(f"STS loss {h.sts_loss}")
    for t in ("sst", "para", "sts", "cfimdb"):
        if t in tasks and h.depth(t):
            parts.append(f"{t} +{h.depth(t)} hidden")
    if h.shared:
        parts.append(f"shared {h.shared.sizes or ['H']} {h.shared.activation} over {', '.join(h.shared.tasks)}")
    for t, n in h.extra_layers.items():
        parts.append(f"{t} +{n} BERT layers")
    if "sst" in tasks and h.sst == "prototypes":
        parts.append(f"sst prototypes {h.prototypes_per_label}/label")
    return ", ".join(parts) or "-"


def row_settings(lp: LoadedParams, name: str) -> dict[str, str]:
    """The settings a rows table pins, as the table writes them."""
    exp = lp.experiment(name)
    ft = exp.finetune
    schedule = ft.schedule
    extra = ([f"epoch {ft.epoch_unit}"] if ft.epoch_unit != "smallest" and ft.schedule != "task_by_task" else []) + \
        ([f"walk {', '.join(ft.walk_through)}"] if ft.walk_through else [])
    if extra:
        schedule += f" ({', '.join(extra)})"
    ds = ft.downsample
    data = {"none": "all", "smallest": "smallest task's size", "fixed": f"{ds.size} each"}[ds.mode]
    pooling = ft.heads.pooling + "".join(f", {t} {p}" for t, p in ft.heads.task_pooling.items())
    training = "encoder frozen" if ft.freeze_encoder else "fine-tuned"
    if exp.retrain_heads.enabled:
        rh = exp.retrain_heads
        training += (f"; then {', '.join(rh.tasks or ft.tasks)} heads over the frozen model "
                     f"({rh.schedule}, {rh.epochs} epochs, batch {rh.batch_size}, lr {_num(rh.lr)})")
    regs = []
    if ft.smart.enabled:
        regs.append(f"SMART lambda {_num(ft.smart.lambda_s)}, mu {_num(ft.smart.mu)}")
    if ft.pcgrad:
        regs.append("PCGrad")
    pretraining = "-"
    if exp.pretrain:
        pre = lp.pretraining(exp.pretrain)
        what = {"mlm": f"MLM on {', '.join(pre.mlm.tasks)}", "nli": f"NLI {pre.nli.objective}",
                "para_first": "paraphrase first"}[pre.kind]
        pretraining = f"{exp.pretrain}: {what}, {pre.epochs} epochs, lr {_num(pre.lr)}"
    dropout = "-" if ft.hidden_dropout is None else _num(ft.hidden_dropout)
    return {"tasks": ", ".join(ft.tasks), "schedule": schedule, "heads": _heads(exp), "pooling": pooling,
            "data": data, "lr": _num(ft.lr), "batch": str(ft.batch_size), "epochs": str(ft.epochs),
            "dropout": dropout, "training": training, "regularisers": "; ".join(regs) or "-",
            "pretraining": pretraining}


def rows_tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table whose header has an `experiment` column and the pinned columns."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", lines[i].strip().strip("|"))]
                rows.append(dict(zip(header, cells)))
                i += 1
            if "experiment" in header and set(PINNED) <= set(header):
                tables.append(rows)
        else:
            i += 1
    return tables


@pytest.fixture(scope="module")
def catalogue(repo_root) -> LoadedParams:
    return load_params(repo_root / "params" / "full.yaml")


@pytest.fixture(scope="module")
def documented(repo_root) -> list[dict[str, str]]:
    rows = [r for t in rows_tables((repo_root / "docs" / "papers.md").read_text()) for r in t]
    assert rows, "docs/papers.md has no rows tables"
    return rows


def _experiment(cell: str) -> str:
    return cell.strip("`").split("`")[0]


def test_every_documented_row_has_the_settings_the_page_states(catalogue, documented):
    for row in documented:
        name = _experiment(row["experiment"])
        assert name in catalogue.experiments, f"docs/papers.md names '{name}', which params/full.yaml lacks"
        actual = row_settings(catalogue, name)
        for column in PINNED:
            assert row[column].replace("\\|", "|") == actual[column], \
                f"{name}: docs/papers.md says {column} = {row[column]!r}, params/full.yaml gives {actual[column]!r}"


def test_every_study_row_of_the_catalogue_is_documented(catalogue, documented):
    named = {_experiment(r["experiment"]) for r in documented}
    cells = set()
    for study, grid in catalogue.grids.items():
        # a grid's cells differ from each other only in the grid's keys: one stands for all
        assert {n for n, _ in grid} & named, f"study {study}: none of its grid cells is in docs/papers.md"
        cells |= {n for n, _ in grid}
    for study in catalogue.params.studies:
        for name in study.experiments:
            if name in catalogue.params.ensembles or name in cells:
                continue
            members = catalogue.groups.get(name, [name])
            assert any(m in named for m in members), f"study {study.name}: '{name}' is not in docs/papers.md"
    for name, ens in catalogue.params.ensembles.items():
        assert name in Path(__file__).resolve().parents[1].joinpath("docs", "papers.md").read_text()


def test_the_reports_key_choices_hold(catalogue):
    """A few settings the reports insist on, stated once more in code."""
    get = catalogue.experiment
    assert get("p002_baseline").finetune.schedule == "sequential"
    assert get("p002_baseline").finetune.tasks == ["para", "sts", "sst"]
    assert get("p002_concat_smart_sim").finetune.walk_through == ["para"]
    assert get("p002_cos_sim").finetune.heads.para == "concat" and get("p002_cos_sim").finetune.heads.sts == "cosine"
    assert get("p004_r5_cos_para_first").pretrain == "para_first_004"
    assert catalogue.pretraining("mlm_all").mlm.tasks == ["sst", "para", "sts"]
    assert catalogue.pretraining("mlm_all").mlm.downsample.size == 6040
    assert get("p004_r6_cos_smart5").finetune.smart.mu == 0 and get("p004_r7_cos_smart0").finetune.smart.lambda_s == 0
    r4, r8 = get("p004_r4_cos_finetuned").finetune.model_dump(), get("p004_r8_cos_pcgrad").finetune.model_dump()
    assert {k for k in r4 if r4[k] != r8[k]} == {"pcgrad"}                 # R8 is R4 plus PCGrad, nothing else
    for name in ("p003_nli_regression", "p003_nli_contrastive", "p003_nli_triplet"):
        exp = get(name)
        assert catalogue.pretraining(exp.pretrain).nli.pooling == exp.finetune.heads.pooling
    fs = get("p003_freeze_sst")
    assert fs.finetune.tasks == ["para", "sts"] and fs.retrain_heads.tasks == ["sst"]
    assert fs.finetune.heads.extra_layers == {"sst": 4}
    base = catalogue.base.finetune
    assert (base.warmup_ratio, base.weight_decay, base.grad_clip, base.lr_schedule) == (0.0, 0.0, None, "constant")
