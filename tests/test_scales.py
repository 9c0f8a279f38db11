"""A catalogue's scales: the rows written once, the chosen scale merged over them (settings, seeds,
declared differences, the tables it leaves out), the papers' scale of params/papers.yaml as the papers
state it (a test reads the plan), the model as a setting, and the one-line errors of a scale that does
not exist or is not chosen."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO

from minbert.core.errors import MinBertError
from minbert.params import load_params

CATALOGUE = """\
scale: small
scales:
  big: {description: "as written", repeats: 3}
  small:
    description: "one epoch"
    repeats: 2
    experiments: {finetune: {epochs: 1, lr: 5.0e-5}}
    pretrainings: {epochs: 1}
    differs: [{setting: epochs, paper: "10", ours: "1"}, {setting: MLM, paper: "20 epochs", ours: "1", papers: ["000"]}]
base:
  finetune: {epochs: 10, lr: 1.0e-5}
pretrainings:
  mlm: {kind: mlm, epochs: 20}
experiments:
  a: {finetune: {lr: 2.0e-5}}
  b: {pretrain: mlm}
  c: {description: not in a claim's table}
papers:
  "000": {title: T, overall: mean, differs: [{setting: dev sets, paper: downsampled, ours: full}]}
  "004": {title: U, overall: mean}
studies:
  - name: claimed
    title: A table with a claim
    paper:
      id: "000"
      table: Table 1
      columns: [{name: SST, metric: sst_acc}]
      rows: [{label: A, run: a, dev: {SST: 0.5}}, {label: B, run: b, dev: {SST: 0.4}}]
      claims: [{text: A beats B, better: A, worse: B, column: SST}]
  - name: plain
    title: No claims
    experiments: [c]
"""


def project(tmp_path: Path, params: str, catalogue: str = CATALOGUE) -> Path:
    (tmp_path / "params").mkdir(exist_ok=True)
    (tmp_path / "params" / "cat.yaml").write_text(catalogue)
    (tmp_path / "params.yaml").write_text(params)
    return tmp_path / "params.yaml"


def test_the_chosen_scale_is_merged_over_every_row_and_declared_beside_the_papers(tmp_path):
    lp = load_params(project(tmp_path, "catalogue: cat\n"))          # the catalogue's own `scale: small`
    assert sorted(lp.groups) == ["a", "b"]                           # the claim's rows, 2 seeds each; c runs once
    a, b, c = lp.experiments["a.seed11711"], lp.experiments["b.seed11712"], lp.experiments["c"]
    assert (a.finetune.epochs, a.finetune.lr) == (1, 5.0e-5)        # the scale wins over the row's own lr
    assert (c.finetune.epochs, c.finetune.lr) == (1, 5.0e-5)
    assert b.pretrain == "mlm" and (b.finetune.epochs, b.finetune.lr) == (1, 5.0e-5)   # the row's own keys kept
    assert lp.params.pretrainings["mlm"].epochs == 1
    assert [d.setting for d in lp.params.papers["000"].differs] == ["dev sets", "epochs", "MLM"]
    assert [d.setting for d in lp.params.papers["004"].differs] == ["epochs"]
    assert lp.params.scale == "small" and lp.params.scales["small"].description == "one epoch"
    # params.yaml's scale wins over the catalogue's: the rows as written, three seeds
    lp = load_params(project(tmp_path, "catalogue: cat\nscale: big\n"))
    assert len(lp.groups["a"]) == 3 and lp.experiments["a.seed11711"].finetune.lr == 2.0e-5
    assert lp.experiments["a.seed11711"].finetune.epochs == 10 and lp.params.papers["004"].differs == []


@pytest.mark.parametrize("params,catalogue,message", [
    ("catalogue: cat\nscale: huge\n", CATALOGUE, "key 'scale': unknown scale 'huge' (the catalogue's: big, small)"),
    ("catalogue: cat\n", CATALOGUE.replace("scale: small\n", ""),
     "key 'scale': the catalogue runs at one of its scales (big, small); set 'scale' to one of them"),
    ("catalogue: cat\nscale: big\n", CATALOGUE.split("scales:")[0] + "base:" + CATALOGUE.split("\nbase:")[1],
     "key 'scale': 'big' is set, but the catalogue has no 'scales'; remove it"),
    ("catalogue: cat\n", CATALOGUE.replace("repeats: 2", "repeats: two"), "key 'scales.small.repeats'"),
])
def test_a_scale_that_is_not_there_is_one_line(tmp_path, params, catalogue, message):
    with pytest.raises(MinBertError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_params(project(tmp_path, params, catalogue))
    assert "\n" not in str(e.value)


def catalogue(tmp_path: Path, scale: str, extra: str = ""):
    (tmp_path / "params").mkdir(exist_ok=True)
    shutil.copy(REPO / "params" / "papers.yaml", tmp_path / "params" / "papers.yaml")
    (tmp_path / "params.yaml").write_text(f"catalogue: papers\nscale: {scale}\n{extra}")
    return load_params(tmp_path / "params.yaml")


# each paper's epochs, batch and learning rate as it states them (003 states no epochs: 3, declared)
PAPER_SETTINGS = {"p000_head_baseline": (10, 8, 1e-5), "p000_mt_sequential_rr": (10, 8, 1e-5),
                  "p000_sft": (10, 8, 1e-5),
                  "p002_concat_smart": (10, 8, 1e-5), "p003_nli_triplet": (3, 32, 2e-5),
                  "p004_r1_pretrained": (10, 16, 1e-3), "p004_r4_cos_finetuned": (10, 16, 1e-5),
                  "p004_r9_sweep": (6, 16, 1e-5), "p004_obj2_sst_ft": (10, 8, 1e-5)}


def test_the_papers_scale_plans_each_papers_epochs_on_all_training_rows_over_three_seeds(tmp_path):
    from minbert.pipeline.plan import pipeline

    lp = catalogue(tmp_path, "paper")
    jobs = [j for j in pipeline(lp) if j.stage == "finetune"]
    by_row: dict[str, list] = {}
    for job in jobs:
        by_row.setdefault(job.name.rsplit(".seed", 1)[0], []).append(job)
    claimed = {r.run or b for st in lp.params.studies if st.paper and st.paper.claims
               for r in st.paper.rows for b in ([r.run] if r.run else r.best_of)}
    assert claimed <= set(by_row) | set(lp.params.ensembles)
    assert all(len(by_row[row]) >= 3 for row in claimed if row in by_row)         # >= 3 seeds per claim row
    for row, (epochs, batch, lr) in PAPER_SETTINGS.items():
        ft = by_row[row][0].settings["finetune"]
        rate = ft["head_lr"] if ft["freeze_encoder"] and ft["head_lr"] else ft["lr"]      # frozen: the heads' rate
        assert (ft["epochs"], ft["batch_size"], rate) == (epochs, batch, lr), row
        assert ft["warmup_ratio"] == 0 and ft["lr_schedule"] == "constant"          # unstated: off
    for job in jobs:
        ds = job.settings["finetune"]["downsample"]
        # all the rows the data holds, but where a paper cuts every task to the smallest (000's and 004's
        # round-robin): no caps anywhere
        assert ds["caps"] == {} and ds["mode"] in ("none", "smallest"), job.name
    modes = {row: jobs_[0].settings["finetune"]["downsample"]["mode"] for row, jobs_ in by_row.items()}
    assert modes["p000_head_baseline"] == modes["p002_baseline"] == modes["p003_baseline"] == "none"
    assert modes["p000_mt_sequential_rr"] == modes["p004_r2_finetuned"] == "smallest"
    # every table runs at the papers' scale: 002's grid, its ensemble, the sweeps of single tasks
    assert not any(st.left_out for st in lp.params.studies) and "p002_ensemble" in lp.params.ensembles
    assert "p002_dropout_lambda.lambda5.dropout0.4.seed11713" in lp.experiments


def test_the_laptop_scale_is_the_same_rows_cut_and_declared(tmp_path):
    paper, laptop = catalogue(tmp_path, "paper"), catalogue(tmp_path, "laptop")
    left = {st.name: st.left_out for st in laptop.params.studies if st.left_out}
    assert set(left) == {"p000_mlm_then_multitask", "p002_dropout_lambda", "p002_ensemble", "p002_smart_weight_sst",
                         "p004_smart_single_task"} and all(left.values())
    # one seed each, the rows of the tables that run; R4 for six epochs is R4 itself here, so R9's sweeps
    # are this scale's own; the tables left out run none of their own rows (Table 3's first row is Table 4's)
    rows = {n.rsplit(".seed", 1)[0] for n in paper.experiments} - {"p004_r9_sweep"}
    rows -= {n for n in rows if n.startswith(("p002_dropout_lambda", "p002_smart_weight_sst", "p004_smart_single_task",
                                              "p004_lr_sweep", "p004_smart_sst_single"))}
    rows -= {"p000_mlm_sst_sts_mt", "p000_mlm_para_sts_mt", "p000_mlm_all_mt"}
    assert set(laptop.experiments) - rows == {"p004_lr_sweep.lr0.001", "p004_lr_sweep.lr1e-05", "p004_lr_sweep.lr1e-06"}
    assert rows - set(laptop.experiments) == set() and "p000_mlm_sst_para_mt" in laptop.experiments
    assert not laptop.params.ensembles and paper.params.ensembles
    # the claims of the tables left out are still the catalogue's (the page shows them as left out)
    assert sum(len(st.paper.claims) for st in laptop.params.studies if st.paper) == \
        sum(len(st.paper.claims) for st in paper.params.studies if st.paper)
    ft = laptop.experiments["p004_r4_cos_finetuned"].finetune
    assert (ft.epochs, ft.evals_per_epoch, ft.dev_size, ft.lr, ft.head_lr, ft.warmup_ratio, ft.lr_schedule) == \
        (8, 3, 300, 1e-4, 2e-3, 0.1, "constant")
    assert laptop.experiments["p003_nli_triplet"].finetune.lr == 2e-4            # 10 times each paper's rate
    assert laptop.experiments["p000_sft"].finetune.epochs == 2
    assert laptop.experiments["p003_head_mod"].finetune.epochs == 8
    # every laptop row trains until its plateau (the check's own rule, filled from report.training_check),
    # its epochs the cap; the papers' scale keeps the papers' fixed epochs
    check = laptop.params.report.training_check
    for name, exp in laptop.experiments.items():
        rule = exp.finetune.until_plateau
        assert rule.enabled and (rule.tolerance, rule.window, rule.fit, rule.noise) == \
            (check.tolerance, check.window, check.fit, check.noise), name
    assert not any(e.finetune.until_plateau.enabled for e in paper.experiments.values())
    # the pretrainings' own dev loss 4 times in their one epoch: the training check's curve of each
    for name, p in laptop.params.pretrainings.items():
        assert (p.epochs, p.lr) == (1, 5e-5) and (p.evals_per_epoch == 4 or p.kind == "para_first"), name
    assert laptop.params.pretrainings["para_first"].max_steps_per_epoch == 375
    assert ft.downsample.caps == {"sst": 1000, "para": 1000, "sts": 1000, "cfimdb": 400}
    # the rows that train their heads alone (`frozen`): up to 20 epochs over the encoder's outputs
    # computed once (no dropout in it); at the papers' scale they keep their own epochs and dropout
    for name, exp in laptop.experiments.items():
        f = exp.finetune
        assert not f.frozen_encoder_dropout and (f.epochs == 20 or not f.freeze_encoder), name
        # head re-training: each paper's epochs (000: 10, 003: 3) on the scale's rows
        assert not exp.retrain_heads.enabled or exp.retrain_heads.epochs == (3 if name.startswith("p003") else 10), name
    assert paper.experiments["p000_head_baseline.seed11711"].finetune.frozen_encoder_dropout
    # dev alone predicted at the laptop scale (no claim reads test), both splits at the papers' scale
    assert not any(e.predict_test for e in laptop.experiments.values())
    assert all(e.predict_test for e in paper.experiments.values())
    assert ft.batch_size == 16                                       # each paper's own batch stays
    for pid, paper_params in laptop.params.papers.items():
        settings = [d.setting for d in paper_params.differs]
        assert {"learning rates", "epochs", "dev evaluations", "seeds", "test predictions",
                "frozen-encoder rows", "pretraining learning rates"} <= set(settings), pid
        # the papers' scale's own differences are not this scale's
        assert "Para's phase" not in settings and "the best of the 9" not in str(paper_params.differs), pid


def test_the_model_is_one_setting_at_either_scale(tmp_path):
    lp = catalogue(tmp_path, "laptop", "model: bert-base-uncased\n")
    assert {e.model for e in lp.experiments.values()} == {"bert-base-uncased"}
    assert lp.experiments["p004_r4_cos_finetuned"].finetune.epochs == 8     # the scale applies alike


def test_the_laptop_scales_r9_is_its_own_sweep_and_never_r4(tmp_path):
    """R9 "fails to improve on R4" could not fail if a row it takes the best of were R4: R4 for six
    epochs is R4 at this scale's epochs, and the paper's lr 1e-4 is this scale's own rate. The scale's
    `named` settings sweep 10x, 0.1x and 0.01x its rate (the paper's ratios to its R4's) and run no R9
    as it is."""
    laptop = catalogue(tmp_path, "laptop")
    r4 = laptop.experiments["p004_r4_cos_finetuned"]
    table = next(st for st in laptop.params.studies if st.name == "p004_extensions").paper
    r9 = table.row("R9").best_of
    assert sorted(laptop.experiments[r].finetune.lr for r in r9) == sorted([1e-3, 1e-5, 1e-6] + [1e-4] * 3)
    assert sorted(laptop.experiments[r].finetune.heads.dropout for r in r9) == sorted([0.3] * 3 + [0.4, 0.5, 0.6])
    for r in r9:
        assert laptop.experiments[r].finetune.epochs == r4.finetune.epochs
        assert laptop.experiments[r].model_dump(exclude={"description"}) != r4.model_dump(exclude={"description"}), r
    assert laptop.params.pretrainings["mlm_sst_para"].mlm.downsample.size == 2000
    assert any(d.setting == "R9" for d in laptop.params.papers["004"].differs)
    # without them the claim is refused in one line, naming it
    raw = (REPO / "params" / "papers.yaml").read_text()
    cut = raw.replace("        p004_r9_sweep: {<<: *l004, template: true}", "        p004_r9_sweep: *l004").replace(
        "        p004_dropout_sweep: {experiments: []}\n", "")
    assert cut != raw
    (tmp_path / "params" / "papers.yaml").write_text(cut)
    with pytest.raises(MinBertError) as e:
        load_params(tmp_path / "params.yaml")
    assert "(claim 'varying the hyperparameters fails to improve on R4'): row 'R9' runs 'p004_r9_sweep'" in str(e.value)
    assert "could not fail" in str(e.value) and "\n" not in str(e.value)


NAMED = """\
    named:
      experiments: {a: {finetune: {batch_size: 4}}, c: {template: true}}
      pretrainings: {mlm: {epochs: 2}}
      studies: {plain: {title: Renamed, experiments: [a]}}
"""


@pytest.mark.parametrize("section,right,wrong", [("experiments", "a: {finetune", "aa: {finetune"),
                                                 ("pretrainings", "mlm: {epochs: 2", "mln: {epochs: 2"),
                                                 ("studies", "plain: {title", "plane: {title")])
def test_a_scales_named_settings_apply_to_the_row_they_name_and_an_unknown_name_is_one_line(
        tmp_path, section, right, wrong):
    named = CATALOGUE.replace("    differs: [{setting: epochs", NAMED + "    differs: [{setting: epochs")
    lp = load_params(project(tmp_path, "catalogue: cat\n", named))
    a = lp.experiments["a.seed11711"].finetune
    assert (a.batch_size, a.epochs) == (4, 1)                          # named, over the scale's settings for all
    assert lp.experiments["b.seed11711"].finetune.batch_size != 4
    assert "c" not in lp.experiments                                   # a template at this scale: not run
    assert lp.params.pretrainings["mlm"].epochs == 2                    # named wins over the scale's own
    assert next(st for st in lp.params.studies if st.name == "plain").title == "Renamed"
    with pytest.raises(MinBertError, match=rf"key 'scales.small.named.{section}.{wrong.split(':')[0]}': the catalogue "
                                           rf"has no .*did you mean") as e:
        bad = CATALOGUE.replace("    differs: [{setting: epochs", NAMED.replace(right, wrong) + "    differs: [{setting: epochs")
        load_params(project(tmp_path, "catalogue: cat\n", bad))
    assert "\n" not in str(e.value)


def test_the_laptop_scales_epochs_state_what_its_plan_gives(tmp_path, shared_data):
    """The laptop scale's declared epochs say how many updates of each task a fine-tuned row gets
    ("500 updates of each task", "250", "256", "504", at the caps): its figures are those of the plan (each row's updates
    per task, minbert.train.training.Plan), one per paper's batch."""
    import re

    from minbert.data.downsample import target_sizes
    from minbert.pipeline.estimate import train_rows
    from minbert.train.training import Plan

    laptop = catalogue(tmp_path, "laptop")
    rows = train_rows(laptop)["train"]
    per_paper: dict[str, set] = {}
    for name, exp in laptop.experiments.items():
        ft = exp.finetune
        # the frozen rows, FREEZE_SST's two tasks first, and drop round-robin (one task drawn a step: 000 drops
        # the other two batches, so each task gets a third of its steps)
        if ft.freeze_encoder or len(ft.tasks) < 3 or ft.schedule == "drop_round_robin":
            continue
        tasks = [t for t in ft.tasks if rows.get(t)]
        plan = Plan.build(ft, tasks, target_sizes({t: rows[t] for t in tasks}, ft.downsample), exp.seed)
        phase_updates = {sum(task in update for (p, _), ups in plan.epochs.items() for update in ups) for task in tasks}
        per_paper.setdefault(name[1:4], set()).update(phase_updates)
    ours = next(d.ours for d in laptop.params.papers["004"].differs if d.setting == "epochs")
    stated = re.search(r"\((\d+) updates of each task\) and 2 for those that train one task a phase \((\d+)\), "
                       r"8 for 003's \((\d+)\) and 004's \((\d+)\)", ours).groups()
    assert per_paper["000"] == per_paper["002"] == {int(stated[0]), int(stated[1])}, per_paper
    assert per_paper["003"] == {int(stated[2])} and per_paper["004"] == {int(stated[3])}, per_paper
    assert f"({stated[0]} updates of each task)" in " ".join(laptop.params.scales["laptop"].description.split())
