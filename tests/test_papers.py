"""The papers' catalogue against the reports: every row of the rows tables in docs/papers.md names an
experiment of params/papers.yaml (the papers' model at their scale) whose resolved settings are the ones the table
states (tasks,
schedule, heads, pooling, data sizes, learning rate, batch, epochs, dropout, what is frozen and
retrained, regularisers, pretraining), and every study of the catalogue has its rows there."""
from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest

from minbert.params import ExperimentParams, FinetuneParams, LoadedParams, deep_merge, load_params
from minbert.model.blocks import shared_widths

BERT_BASE_WIDTH = 768
PINNED = ["tasks", "schedule", "heads", "pooling", "data", "lr", "batch", "epochs", "dropout", "training",
          "regularisers", "pretraining"]


def _num(x) -> str:
    return f"{x:g}"


def _heads(exp: ExperimentParams) -> str:
    h, tasks = exp.finetune.heads, set(exp.finetune.tasks) | set(exp.retrain_heads.tasks or [])
    parts = [f"{t} {h.head_of(t)}" for t in ("para", "sts") if t in tasks]
    uses_cosine = any(h.head_of(t) in ("cosine", "cosine_linear") for t in ("para", "sts") if t in tasks)
    if uses_cosine and not h.cosine_affine:
        parts.append("plain cosine")
    if "sts" in tasks and h.head_of("sts") == "cosine" and h.cosine_target == "-1_1":
        parts.append("STS scaled -1..1")
    if "sts" in tasks and h.loss_of("sts") != "mse":
        parts.append(f"STS loss {h.loss_of('sts')}")
    for t in ("sst", "para", "sts", "cfimdb"):
        if t in tasks and h.depth(t):
            parts.append(f"{t} +{h.depth(t)} hidden")
    if h.shared:      # the widths on bert-base, the model the rows tables describe
        parts.append(f"shared {shared_widths(h.shared.sizes, BERT_BASE_WIDTH)} {h.shared.activation} over "
                     f"{', '.join(h.shared.tasks)}")
    for t, n in h.extra_layers.items():
        parts.append(f"{t} +{n} BERT layers")
    if "sst" in tasks and h.head_of("sst") == "prototypes":
        parts.append(f"sst prototypes {h.prototypes_per_label}/label")
    return ", ".join(parts) or "-"


def one(lp: LoadedParams, name: str) -> ExperimentParams:
    """An experiment, or a repeated one's first seed (the seeds differ in their seed alone)."""
    return lp.experiments[lp.groups[name][0]] if name in lp.groups else lp.experiment(name)


def row_settings(lp: LoadedParams, name: str) -> dict[str, str]:
    """The settings a rows table pins, as the table writes them."""
    exp = one(lp, name)
    ft = exp.finetune
    schedule = ft.schedule
    # the epoch's unit matters where one update takes several tasks' batches
    several = ft.schedule not in ("task_by_task", "sequential") and len(ft.tasks) > 1
    extra = ([f"epoch {ft.epoch_unit}"] if ft.epoch_unit != "smallest" and several else []) + \
        ([f"walk {', '.join(ft.walk_through)}"] if ft.walk_through else [])
    if extra:
        schedule += f" ({', '.join(extra)})"
    ds = ft.downsample
    data = {"none": "all", "smallest": "smallest task's size", "fixed": f"{ds.size} each"}[ds.mode]
    pooling = ft.heads.pooling + "".join(f", {t} {p}" for t, p in ft.heads.task_pooling.items())
    training = ("encoder frozen" + (" (its dropout on)" if ft.frozen_encoder_dropout else "")) if ft.freeze_encoder \
        else "fine-tuned"
    if exp.retrain_heads.enabled:
        rh = exp.retrain_heads
        training += (f"; then {', '.join(rh.tasks or ft.tasks)} heads over the frozen model "
                     f"({rh.schedule}, {rh.epochs} epochs, batch {rh.batch_size}, lr {_num(rh.lr)})")
    regs = []
    if ft.smart.enabled:
        sm = ft.smart
        regs.append(f"SMART lambda {_num(sm.lambda_s)}, mu {_num(sm.mu)}, eps {_num(sm.epsilon)}"
                    + (f", beta {_num(sm.beta)}" if sm.mu > 0 else ""))
    if ft.pcgrad:
        regs.append("PCGrad")
    pretraining = "-"
    if exp.pretrain:
        pre = lp.pretraining(exp.pretrain)
        ds = pre.mlm.downsample
        rows = {"none": "all rows", "smallest": "the smallest source's size", "fixed": f"{ds.size} rows each"}[ds.mode]
        nli = pre.nli
        nli_extra = {"contrastive": f", temperature {_num(nli.temperature)}", "triplet": f", margin {_num(nli.margin)}",
                     "regression": ""}[nli.objective]
        if pre.kind == "para_first":
            pft = FinetuneParams.model_validate(deep_merge(lp.base.finetune.model_dump(), pre.finetune))
            first = (f"paraphrase first (para {pft.heads.head_of('para')}, +{pft.heads.depth('para')} hidden, dropout hidden "
                     f"{_num(pft.hidden_dropout)}, heads {_num(pft.heads.dropout)})")
        what = {"mlm": f"MLM on {', '.join(pre.mlm.tasks)} ({rows}, batch {pre.batch_size})",
                "nli": f"NLI {nli.objective} ({nli.pooling}{nli_extra})",
                "para_first": first if pre.kind == "para_first" else ""}[pre.kind]
        pretraining = f"{exp.pretrain}: {what}, {pre.epochs} epochs, lr {_num(pre.lr)}"
    hidden = "-" if ft.hidden_dropout is None else _num(ft.hidden_dropout)
    attention = "BERT's" if ft.attention_dropout is None else _num(ft.attention_dropout)
    dropout = f"hidden {hidden}, attention {attention}, heads {_num(ft.heads.dropout)}"
    return {"tasks": ", ".join(ft.tasks), "schedule": schedule, "heads": _heads(exp), "pooling": pooling,
            "data": data, "lr": _num(ft.lr) + (f", heads {_num(ft.head_lr)}" if ft.head_lr not in (None, ft.lr) else
                                               ""),
            "batch": str(ft.batch_size), "epochs": str(ft.epochs),
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
def catalogue(repo_root, tmp_path_factory) -> LoadedParams:
    folder = tmp_path_factory.mktemp("papers")
    (folder / "params").mkdir()
    (folder / "params" / "papers.yaml").write_text((repo_root / "params" / "papers.yaml").read_text())
    (folder / "params.yaml").write_text("catalogue: papers\nmodel: bert-base-uncased\nscale: paper\n")
    return load_params(folder / "params.yaml")


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
        assert name in catalogue.experiments or name in catalogue.groups, \
            f"docs/papers.md names '{name}', which params/papers.yaml lacks"
        actual = row_settings(catalogue, name)
        for column in PINNED:
            assert row[column].replace("\\|", "|") == actual[column], \
                f"{name}: docs/papers.md says {column} = {row[column]!r}, params/papers.yaml gives {actual[column]!r}"


def test_every_study_row_of_the_catalogue_is_documented(catalogue, documented):
    named = {_experiment(r["experiment"]) for r in documented}
    cells = set()
    for study, grid in catalogue.grids.items():
        # a grid's cells differ from each other only in the grid's keys: one stands for all
        assert {n for n, _ in grid} & named, f"study {study}: none of its grid cells is in docs/papers.md"
        cells |= {n for n, _ in grid} | {m for n, _ in grid for m in catalogue.groups.get(n, [])}
    for study in catalogue.params.studies:
        for name in study.experiments:
            if name in catalogue.params.ensembles or name in cells:
                continue
            members = catalogue.groups.get(name, [name])
            assert name in named or any(m in named for m in members), \
                f"study {study.name}: '{name}' is not in docs/papers.md"
    for name, ens in catalogue.params.ensembles.items():
        assert name in Path(__file__).resolve().parents[1].joinpath("docs", "papers.md").read_text()


def test_the_reports_key_choices_hold(catalogue):
    """A few settings the reports insist on, stated once more in code."""
    get = partial(one, catalogue)
    assert get("p002_baseline").finetune.schedule == "sequential"
    assert get("p002_baseline").finetune.tasks == ["para", "sts", "sst"]
    assert get("p002_concat_smart_sim").finetune.walk_through == ["para"]
    assert get("p002_cos_sim").finetune.heads.head_of("para") == "concat" and get("p002_cos_sim").finetune.heads.head_of("sts") == "cosine"
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


def test_the_audited_fidelity_choices_hold(catalogue):
    """Each choice the audit of the catalogue against the four reports settled (docs/papers.md,
    "Fidelity"), pinned."""
    get = partial(one, catalogue)
    p004 = [n for n in catalogue.experiments if n.startswith("p004_")]
    # 1. 004's "dropout 0.3" is the course's flag, which reaches the task heads only; BERT keeps 0.1
    for name in p004:
        ft = get(name).finetune
        assert (ft.hidden_dropout, ft.attention_dropout) == (0.1, None), name
        if "dropout_sweep" not in name:
            assert ft.heads.dropout == 0.3, name
    sweep = next(s for s in catalogue.params.studies if s.name == "p004_dropout_sweep")
    assert [a.key for a in sweep.grid.axes] == ["finetune.heads.dropout"]
    # ... 002 states BERT's own dropout (embeddings, encoder, pooler): its 0.3 is the hidden dropout
    for name in [n for n in catalogue.experiments if n.startswith("p002_") and "dropout_lambda" not in n]:
        assert (get(name).finetune.hidden_dropout, get(name).finetune.heads.dropout) == (0.3, 0.1), name
    grid = next(s for s in catalogue.params.studies if s.name == "p002_dropout_lambda")
    assert grid.grid.axes[1].key == "finetune.hidden_dropout"
    # 000: p = 0.1 everywhere
    for name in [n for n in catalogue.experiments if n.startswith("p000_")]:
        assert (get(name).finetune.hidden_dropout, get(name).finetune.heads.dropout) == (0.1, 0.1), name
    # 2. 003's contrastive NLI objective follows SimCSE: temperature 0.05
    assert catalogue.pretraining("nli_contrastive").nli.temperature == 0.05
    # 3. 004's Objective 2 at the course's defaults: batch 8, head dropout 0.3, 10 epochs
    for name in [n for n in p004 if "obj2" in n]:
        ft = get(name).finetune
        assert (ft.batch_size, ft.heads.dropout, ft.epochs) == (8, 0.3, 10), name
    # 4. a frozen encoder keeps its dropout in the rows that follow the course's code (000, 004)
    for name in [n for n in catalogue.experiments if n.startswith(("p000_", "p004_"))]:
        ft = get(name).finetune
        assert ft.frozen_encoder_dropout == ft.freeze_encoder, name
    # 5. 004's SMART radius is its library's default, 1e-6; 002 keeps the SMART paper's 1e-5 and
    #    the momentum copy's beta 0.99
    for name in p004:
        if get(name).finetune.smart.enabled:
            assert get(name).finetune.smart.epsilon == 1e-6 and get(name).finetune.smart.mu == 0, name
    for name in ("p002_concat_smart", "p002_concat_smart_sim"):
        sm = get(name).finetune.smart
        assert (sm.epsilon, sm.beta, sm.mu, sm.lambda_s) == (1e-5, 0.99, 1.0, 1.0)
    # 6. 003's shared layers run on each sentence's embedding (bi-encoder heads), before the pair features
    shared = get("p003_shared").finetune.heads
    assert shared.shared.tasks == ["para", "sts"] and shared.shared.sizes == ["encoder", "encoder"]   # 768 on bert-base
    assert shared.para == "concat_uv" and shared.sts == "concat_uv"
    # label scaling: 003 scales STS to 0..1 (and tries -1..1), 002's cosine reads -1..1
    assert get("p003_head_mod").finetune.heads.cosine_target == "0_1"
    assert get("p003_head_mod_scale_m1_1").finetune.heads.cosine_target == "-1_1"
    assert get("p002_cos_sim").finetune.heads.cosine_target == "-1_1"
    # 10. para_first trains the heads it states: 002 the cross-encoder, 004 R4's two-layer [u, v]
    pre = {n: FinetuneParams.model_validate(deep_merge(catalogue.base.finetune.model_dump(),
                                                       catalogue.pretraining(n).finetune))
           for n in ("para_first", "para_first_004")}
    assert (pre["para_first"].heads.head_of("para"), pre["para_first"].hidden_dropout) == ("cross", 0.3)
    assert (pre["para_first_004"].heads.head_of("para"), pre["para_first_004"].heads.depth("para"),
            pre["para_first_004"].heads.dropout, catalogue.pretraining("para_first_004").batch_size) == \
        ("concat_uv", 1, 0.3, 16)
    # MLM budgets (000 §5.3): 20 epochs, batch 8, lr 1e-5, each source cut to 6,040 rows
    for name in ("mlm_sst_para", "mlm_sst_sts", "mlm_para_sts", "mlm_all"):
        mlm = catalogue.pretraining(name)
        assert (mlm.epochs, mlm.batch_size, mlm.lr, mlm.mlm.downsample.mode, mlm.mlm.downsample.size) == \
            (20, 8, 1e-5, "fixed", 6040), name


def test_the_ensemble_is_the_five_best_cells_of_the_transcribed_table_3(catalogue):
    """9. 002 Table 4's members are fixed from 002's Table 3 (not chosen from this pipeline's own
    grid results, a deviation docs/papers.md states): the five best printed cells by Overall,
    read from the transcribed table; a tie for fifth goes to either."""
    table3 = next(s for s in catalogue.params.studies if s.name == "p002_dropout_lambda").paper
    ranked = sorted(table3.rows, key=lambda r: -r.dev["Overall"])
    fifth = ranked[4].dev["Overall"]
    top4, tied = [r.run for r in ranked[:4]], {r.run for r in ranked if r.dev["Overall"] == fifth}
    members = [m.rsplit(".seed", 1)[0] for m in catalogue.params.ensembles["p002_ensemble"].members][::3]
    assert members[:4] == top4 and members[4] in tied
