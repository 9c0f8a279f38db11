"""`minbert estimate`: a pipeline's time said before it starts. The updates are the ones the loop
plans (minbert.train.training.Plan on the rows after downsampling), each priced at the pipeline's
update measured here; every planned job is priced and the jobs scheduled as the engine runs them.
Checked here against hand counts with a made-up cost, the schedule on hand-built chains, the parts
adding up to the total, and the command's line on the demo."""
from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, child_env

from minbert.core.runtime import precision_on
from minbert.params import load_params
from minbert.params.plateau import UntilPlateau
from minbert.pipeline.estimate import (
    Machine,
    Priced,
    StepCost,
    describe,
    estimate,
    fit_seconds,
    pretrain_seconds,
    rounded_parts,
    schedule,
    sentences,
    train_rows,
    typical_length,
)
from minbert.train import plateau as plateau_rule
from minbert.train import stopping

PARAMS = """\
data: {dir: DATA, nli_file: null}
base:
  model: all-MiniLM-L6-v2
  finetune: {epochs: 2, batch_size: 10, tasks: [sst, sts], schedule: round_robin, downsample: {mode: smallest},
             heads: {sts: cosine}, evals_per_epoch: 3}
experiments:
  plain: {}
  frozen: {finetune: {freeze_encoder: true}}
"""
COST = StepCost(train=(0.0, 1e-3), forward=(0.0, 1e-4))    # a second per thousand sentences trained


@pytest.fixture()
def lp(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS.replace("DATA", str(REPO / "data" / "demo")))
    return load_params(tmp_path / "params.yaml")


def test_a_fine_tuning_costs_its_planned_updates_and_evaluations(lp):
    rows = train_rows(lp)
    assert rows["train"]["sst"] == rows["train"]["sts"] == 600 and rows["dev"]["sts"] == 200   # the demo's
    exp = lp.experiments["plain"]
    seconds, updates = fit_seconds(exp.finetune, ["sst", "sts"], rows, COST, exp.seed)
    # round-robin over 600 rows per task at batch 10: 60 updates of each task an epoch, one task's batch
    # each (sst one sentence, sts a pair: 10 and 20 sentences), for 2 epochs; 3 dev passes an epoch
    # over 200 sst sentences and 200 pairs, in batches of 128, forward only
    assert updates == 240
    train = 120 * 10 * 1e-3 + 120 * 20 * 1e-3
    evals = 2 * 3 * math.ceil((200 + 400) / 128) * 128 * 1e-4
    assert seconds == pytest.approx(train + evals)


def test_dev_evaluations_on_a_subset_cost_its_rows(lp):
    rows = train_rows(lp)
    cfg = lp.experiments["plain"].finetune.model_copy(update={"dev_size": 50})
    seconds, updates = fit_seconds(cfg, ["sst", "sts"], rows, COST, 1)
    train = 120 * 10 * 1e-3 + 120 * 20 * 1e-3
    evals = 2 * 3 * math.ceil((50 + 100) / 128) * 128 * 1e-4     # 50 sst sentences and 50 pairs a pass
    assert updates == 240 and seconds == pytest.approx(train + evals)


def test_a_frozen_encoder_without_dropout_costs_one_pass_over_its_data(lp):
    rows = train_rows(lp)
    exp = lp.experiments["frozen"]
    seconds, updates = fit_seconds(exp.finetune, ["sst", "sts"], rows, COST, exp.seed)
    # the training rows and the dev rows encoded once (dev in batches of 128), then no encoder pass
    dev_once = math.ceil(200 / 128) * 128 * 1e-4 + math.ceil(400 / 128) * 128 * 1e-4
    assert updates == 240 and seconds == pytest.approx((600 + 1200) * 1e-4 + dev_once)


def test_a_frozen_task_with_its_own_layers_pays_every_update(lp):
    """A task with its own top layers (extra_layers: a branch) is encoded anew each time even over a
    frozen encoder (minbert.train.frozen.cacheable), and its branch trains, as SST in 003's FREEZE_SST
    head re-training."""
    rows = train_rows(lp)
    cfg = lp.experiments["frozen"].finetune
    cfg = cfg.model_copy(update={"heads": cfg.heads.model_copy(update={"extra_layers": {"sst": 2}})})
    seconds, updates = fit_seconds(cfg, ["sst", "sts"], rows, COST, 1)
    # every update (its branch's layers train: priced as a training pass) and every evaluation
    sst = 120 * 10 * 1e-3 + 2 * 3 * math.ceil(200 / 128) * 128 * 1e-4
    sts = 1200 * 1e-4 + math.ceil(400 / 128) * 128 * 1e-4                     # once
    assert updates == 240 and seconds == pytest.approx(sst + sts)


def plateau_params(tmp_path, noise: str = "") -> str:
    """PARAMS whose plain row stops at its plateau, its cap 8 epochs of 4 evaluations at a constant rate."""
    text = PARAMS.replace("DATA", str(REPO / "data" / "demo")).replace(
        "  plain: {}", "  plain: {finetune: {epochs: 8, evals_per_epoch: 4, lr_schedule: constant, "
                       "until_plateau: {enabled: true" + noise + "}}}")
    (tmp_path / "params.yaml").write_text(text)
    return load_params(tmp_path / "params.yaml")


def test_a_run_that_stops_at_its_plateau_is_priced_between_its_earliest_stop_and_its_cap(tmp_path):
    """A fine-tuning that stops at its plateau is priced halfway between the earliest evaluation at which
    the loop could stop it (where the loop itself, fed a flat curve at the noise of the dev rows it scores,
    first reads it flat) and its cap (every planned epoch, as the same run without the rule costs)."""
    lp = plateau_params(tmp_path)
    rows, exp = train_rows(lp), lp.experiments["plain"]
    ft = exp.finetune
    cap, cap_updates = fit_seconds(ft.model_copy(update={"until_plateau": UntilPlateau()}), ["sst", "sts"], rows,
                                   COST, exp.seed)
    ends = [fit_seconds(ft, ["sst", "sts"], rows, COST, exp.seed, plateau=p) for p in (0.0, 0.5, 1.0)]
    # the loop's own reading of a flat curve at the plan's evaluations (120 updates an epoch: 60 of each task,
    # round-robin; 4 evaluations an epoch; a warm-up of 96 of its 960 updates)
    at = [120 * e + k for e in range(8) for k in (30, 60, 90, 120)]
    budget = plateau_rule.lr_budget(np.array(at, dtype=float), 960, 96, "constant") * ft.lr
    rule = ft.until_plateau
    history, first = [], None
    for k, (u, b) in enumerate(zip(at, budget), 1):
        history.append({"phase": "sst+sts", "update": u, "lr_budget": b, "dev_score": 0.6})
        if stopping.reading(history, "sst+sts", ["sst", "sts"], {"sst": 200, "sts": 200}, rule)[0] == "flat":
            first = k
            break
    assert first is not None and 8 <= first < 32
    share = at[first - 1] / 960
    assert ends[2][0] == pytest.approx(cap) and ends[2][1] == cap_updates == 960
    assert ends[0][0] == pytest.approx(share * cap) and ends[0][1] == round(share * 960)
    assert ends[1][0] == pytest.approx((share + (1 - share) / 2) * cap)
    est = estimate(lp, COST, Machine("cpu", 2, threads=1))
    plain = next(j for j in est.jobs if j.id == "finetune@plain")
    assert plain.ends == pytest.approx((ends[0][0], ends[2][0])) and est.walls[0] < est.wall < est.walls[1]
    said = describe(est, "cpu")
    assert "1 fine-tunings stop at their plateau, each priced halfway between the earliest stop" in said


def test_a_run_whose_noise_never_tells_is_priced_at_its_cap(tmp_path):
    """Where the rule cannot tell the tolerance within the cap at its evaluations' noise (here a jitter of
    0.2 an evaluation), the run trains to its cap, and is priced so, with no range beside it."""
    loud = ", noise: {classification: {jitter: 0.2, rows: 1}, binary: {jitter: 0.2, rows: 1}, " \
           "regression: {jitter: 0.2, rows: 1}}"
    lp = plateau_params(tmp_path, loud)
    rows, exp = train_rows(lp), lp.experiments["plain"]
    priced = fit_seconds(exp.finetune, ["sst", "sts"], rows, COST, exp.seed)
    assert priced == fit_seconds(exp.finetune, ["sst", "sts"], rows, COST, exp.seed, plateau=0.0)
    assert priced[1] == 960
    est = estimate(lp, COST, Machine("cpu", 2, threads=1))
    assert est.walls is None and "plateau" not in describe(est, "cpu")


def test_the_whole_estimate_prices_every_planned_job_and_schedules_them(lp):
    from minbert.pipeline.plan import pipeline

    est = estimate(lp, COST)
    planned = pipeline(lp)
    assert sorted(j.id for j in est.jobs) == sorted(j.id for j in planned)     # prepare, evaluate, report too
    assert est.updates == 480 and {"finetune", "predict", "evaluate", "prepare", "report"} <= set(est.seconds)
    assert est.total == pytest.approx(sum(j.seconds for j in est.jobs))
    # one core: one job at a time, the wall time is the work; the longest chain runs from prepare to the report
    assert est.wall == pytest.approx(est.total)
    assert est.chain[0] == "prepare" and est.chain[-1] == "report" and est.chain_seconds <= est.total
    wide = estimate(lp, COST, Machine(cores=64))
    assert wide.chain_seconds <= wide.wall < est.total             # side by side: down to the longest chain
    assert sentences("sts", lp.experiments["plain"].finetune.heads) == 2 and sentences("sst", None) == 1


def priced(*jobs):
    return [Priced(i, i.split("@")[0], s, list(deps), network) for i, s, deps, network in jobs]


def test_jobs_are_scheduled_as_the_engine_runs_them():
    jobs = priced(("prepare", 1, [], False), ("pretrain@m", 10, ["prepare"], True),
                  ("finetune@a", 5, ["prepare"], True), ("finetune@b", 5, ["pretrain@m"], True),
                  ("report", 1, ["finetune@a", "finetune@b"], False))
    # two cores, a network job takes both: one at a time, the chain through the pretraining first
    wall, chain, chain_seconds = schedule(jobs, Machine(cores=2))
    assert wall == pytest.approx(22) and chain == ["prepare", "pretrain@m", "finetune@b", "report"]
    assert chain_seconds == pytest.approx(17)
    # eight cores, two threads a job: the pretraining and the other fine-tune side by side
    assert schedule(jobs, Machine(cores=8, threads=2))[0] == pytest.approx(17)
    # the params' torch threads change what a job measures, not the cores the engine holds for it
    assert schedule(jobs, Machine(cores=2, torch_threads=1))[0] == pytest.approx(22)
    # one GPU shared by four: up to four at their own speed; five or more share four jobs' throughput
    gpu = Machine("cuda", cores=16, gpus=1, jobs_per_gpu=8)
    many = priced(*[(f"finetune@{k}", 10, [], True) for k in range(8)])
    assert schedule(many, gpu)[0] == pytest.approx(20)           # 8 jobs of 10 s at 4 jobs' throughput
    assert schedule(many[:4], gpu)[0] == pytest.approx(10)


def test_the_work_by_stage_adds_up_to_its_total_as_printed(lp):
    parts, total = rounded_parts({"finetune": 8.4 * 60, "predict": 2.4 * 60, "pretrain": 1.4 * 60, "report": 5})
    assert total == 12 and sum(parts.values()) == 12             # 8 + 2 + 1 rounded would say 11 of 12
    line = describe(estimate(lp, StepCost(train=(0.5, 0.01), forward=(0.1, 1e-3), startup=4, light_startup=1)), "cpu")
    work = re.search(r"the work (\d+\.\d) min = (.*)$", line)            # a short run: tenths of a minute
    assert work and float(work.group(1)) == pytest.approx(sum(float(m) for m in re.findall(r"(\d+\.\d) min",
                                                                                          work.group(2))))


def test_a_pretraining_costs_its_capped_steps_and_its_dev_passes(lp):
    from minbert.params.schema import PretrainParams

    rows = train_rows(lp)
    pre = PretrainParams(kind="mlm", epochs=2, batch_size=16, max_steps_per_epoch=8, mlm={"tasks": ["sst", "para"]})
    seconds, updates = pretrain_seconds(pre, rows, COST, lp.base.finetune, 1)
    # 1,200 rows would be 75 steps an epoch: capped at 8; dev loss before and after each epoch over 400 rows
    assert updates == 16
    assert seconds == pytest.approx(16 * 16 * 1e-3 + 3 * math.ceil(400 / 16) * 16 * 1e-4)


def test_a_pretraining_pays_a_dev_pass_after_each_part_of_an_epoch(lp):
    """A pretraining evaluated `evals_per_epoch` times an epoch (the laptop scale's 4, so its one epoch
    gives the training check a curve) pays a dev pass after each part and one before the first."""
    from minbert.params.schema import PretrainParams

    rows = train_rows(lp)
    pre = PretrainParams(kind="mlm", epochs=1, batch_size=16, max_steps_per_epoch=8, evals_per_epoch=4,
                         mlm={"tasks": ["sst", "para"]})
    seconds, updates = pretrain_seconds(pre, rows, COST, lp.base.finetune, 1)
    assert updates == 8
    assert seconds == pytest.approx(8 * 16 * 1e-3 + 5 * math.ceil(400 / 16) * 16 * 1e-4)


def test_each_job_is_priced_at_the_precision_it_runs(tmp_path):
    """A pretraining in float32 beside fine-tunings in bf16 (the papers' catalogue) is priced at
    float32's step, which `minbert estimate` measures apart; the fine-tunings keep the base's."""
    pretraining = ("pretrainings:\n  mlm: {kind: mlm, epochs: 1, batch_size: 16, max_steps_per_epoch: 8, precision: fp32,"
                   " mlm: {tasks: [sst, para]}}\nexperiments:\n  after_mlm: {pretrain: mlm}\n")
    text = PARAMS.replace("DATA", str(REPO / "data" / "demo")).replace("experiments:\n", pretraining)
    (tmp_path / "params.yaml").write_text(text)
    lp = load_params(tmp_path / "params.yaml")
    slow = StepCost(train=(0.0, 2e-3), forward=(0.0, 2e-4))
    asked = []

    def cost_at(precision):
        asked.append(precision)
        return slow if precision == "fp32" else COST

    same, apart = estimate(lp, COST), estimate(lp, COST, cost_at=cost_at)
    seconds = {j.id: j.seconds for j in same.jobs}
    for job in apart.jobs:
        if job.stage == "pretrain":
            # every network second doubles; the start-up (0 in these costs) does not
            assert job.seconds == pytest.approx(2 * seconds[job.id]) and job.seconds > 0
        else:
            assert job.seconds == pytest.approx(seconds[job.id])
    assert "fp32" in asked and set(asked) <= {"fp32", "auto"}


def test_a_paraphrase_first_pretraining_costs_its_own_batch_and_capped_steps(lp):
    """Paraphrase-first pretraining trains Para at its own batch, epochs and `max_steps_per_epoch` (as
    minbert.params.settings.para_first_config runs it), not base.finetune's."""
    from minbert.params.schema import PretrainParams

    rows = train_rows(lp)
    pre = PretrainParams(kind="para_first", epochs=1, batch_size=16, max_steps_per_epoch=5)
    seconds, updates = pretrain_seconds(pre, rows, COST, lp.base.finetune, 1)
    assert updates == 5
    evals = lp.base.finetune.evals_per_epoch * math.ceil(rows["dev"]["para"] * 2 / 128) * 128 * 1e-4
    assert seconds == pytest.approx(5 * 16 * 2 * 1e-3 + evals)


def test_each_tasks_sentences_weigh_their_length(lp):
    """A task's sentence costs its typical length over the one measured (cut to the job's max_length):
    CFIMDB's reviews, ten times an SST sentence, cost ten times as much, not the mean of all tasks."""
    rows = train_rows(lp)
    exp = lp.experiments["plain"]
    plain, _ = fit_seconds(exp.finetune, ["sst", "sts"], rows, COST, exp.seed)
    cost = StepCost(train=COST.train, forward=COST.forward, length=20.0, lengths={"sst": 200.0, "sts": 20.0})
    long, _ = fit_seconds(exp.finetune, ["sst", "sts"], rows, cost, exp.seed)
    # SST's share (its 60 updates of 10 sentences and its dev passes) ten times over; STS's the same
    sst = 2 * 60 * 10 * 1e-3 + 2 * 3 * 200 * 1e-4
    assert long - plain == pytest.approx(9 * sst, rel=0.05)
    capped, _ = fit_seconds(exp.finetune, ["sst", "sts"], rows, cost, exp.seed,
                            max_length=40)
    assert capped - plain == pytest.approx(1 * sst, rel=0.05)
    assert cost.weight("para") == 1.0 and StepCost((0, 1), (0, 1)).weight("sst") == 1.0   # unknown: as measured


def test_the_typical_length_is_the_datas_mean_word_pieces(lp, minilm_dir):
    # the mean over the first 400 training rows of each CS224N file, every text column, counted by
    # transformers' own tokenizer of the model ([CLS] and [SEP] included), rounded up
    import pandas as pd
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    counts = []
    for name, cols in (("ids-sst-train.csv", ["sentence"]), ("quora-train.csv", ["sentence1", "sentence2"]),
                       ("sts-train.csv", ["sentence1", "sentence2"])):
        frame = pd.read_csv(REPO / "data" / "demo" / name, sep="\t", index_col=0).head(400)
        for col in cols:
            counts += [len(tok(str(t))["input_ids"]) for t in frame[col]]
    assert typical_length(lp, str(minilm_dir)) == math.ceil(sum(counts) / len(counts))


@pytest.mark.slow
def test_the_command_says_how_long_before_anything_runs(tmp_path, tiny_model_dir):
    (tmp_path / "params.yaml").write_text(PARAMS.replace("DATA", str(REPO / "data" / "demo"))
                                          .replace("all-MiniLM-L6-v2", str(tiny_model_dir)))
    out = subprocess.run([sys.executable, "-m", "minbert.cli", "estimate", "--params", "params.yaml", "--device", "cpu",
                          "--threads", "1", "--cores", "2"], cwd=tmp_path, env=child_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[0]
    precision = precision_on("auto", torch.device("cpu"))     # what the params' `auto` means here, as measured
    assert re.match(rf"about \d+\.\d min on cpu \({precision}, eager steps, sentences of \d+ word pieces\), 2 cores, 1 "
                    r"threads a network job \(2 at a time\): 8 jobs, 480 training updates; the longest chain \d+\.\d min "
                    r"\(finetune \w+ -> predict \w+ -> evaluate \w+\); the work \d+\.\d min = ", line), line


def test_an_estimate_measured_on_busy_cores_says_so():
    from minbert.pipeline.costs import busy_note

    note = busy_note("cpu", load=2.9, cores=2)
    assert "busy" in note and "load average 2.9 on 2 cores" in note and "\n" not in note
    assert busy_note("cpu", load=0.4, cores=2) is None
    assert busy_note("cuda", load=9.0, cores=2) is None          # a GPU's step is not the CPU's load
    assert busy_note("cpu") is None or "busy" in busy_note("cpu")  # this machine's own load, read


@pytest.mark.parametrize("schedule", ["round_robin", "drop_round_robin", "simultaneous", "task_by_task", "proportional",
                                      "temperature", "sequential"])
@pytest.mark.parametrize("cap", [None, 7])
def test_the_planned_updates_are_the_loops_summed_in_closed_form(lp, schedule, cap):
    """Every schedule's updates as minbert.train.training.Plan lists them: exactly (a random schedule:
    the total exactly, each task's share by its expectation: what 300 epochs drew lies near it)."""
    from minbert.pipeline.estimate import planned_updates
    from minbert.train.training import Plan

    sizes = {"sst": 95, "para": 230, "sts": 41}
    cfg = lp.experiments["plain"].finetune.model_copy(update={
        "schedule": schedule, "tasks": list(sizes), "batch_size": 10, "epochs": 300, "max_steps_per_epoch": cap,
        "epoch_unit": "largest"})
    plan, counted = Plan.build(cfg, list(sizes), sizes, 5), planned_updates(cfg, list(sizes), sizes)
    drawn = {t: sum(t in u for ups in plan.epochs.values() for u in ups) for t in sizes}
    assert counted.total == plan.total_updates and len(counted.phases) == len(plan.phases)
    assert [p.updates for p in counted.phases] == plan.phase_updates
    assert [p.tasks for p in counted.phases] == [list(p) for p in plan.phases]
    per_task = {t: sum(p.per_task.get(t, 0) for p in counted.phases) for t in sizes}
    if schedule in ("drop_round_robin", "proportional", "temperature"):      # within 4 binomial deviations
        for t, expected in per_task.items():
            share = expected / counted.total
            assert abs(drawn[t] - expected) <= 4 * math.sqrt(counted.total * share * (1 - share)), (t, drawn)
    else:
        assert per_task == drawn


def test_the_estimate_of_the_most_epochs_answers_at_once_and_more_are_refused(lp, tmp_path):
    """1e7 epochs: no answer in 120 s (the loop over every planned update); the params accepted 1e9."""
    import time

    from minbert.core.errors import MinBertError

    rows = train_rows(lp)
    cfg = lp.experiments["plain"].finetune.model_copy(update={"epochs": 100_000, "schedule": "proportional"})
    t0 = time.perf_counter()
    _, updates = fit_seconds(cfg, ["sst", "sts"], rows, COST, 1)
    assert time.perf_counter() - t0 < 0.1 and updates == 100_000 * 120
    for epochs in (10**7, 10**9):
        (tmp_path / "many.yaml").write_text(PARAMS.replace("DATA", str(REPO / "data" / "demo"))
                                            .replace("epochs: 2", f"epochs: {epochs}"))
        with pytest.raises(MinBertError) as e:
            load_params(tmp_path / "many.yaml")
        assert str(e.value) == (f"{tmp_path / 'many.yaml'}: key 'base.finetune.epochs': Input should be less than or "
                                f"equal to 100000 (got {epochs})")
