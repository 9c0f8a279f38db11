"""`minbert estimate`: a pipeline's work priced before it starts. The updates are the ones the loop
plans (minbert.train.training.Plan on the rows after downsampling), each priced at the encoder's
measured pass time; checked here against a hand count with a made-up step cost, and the command's
one line on the demo."""
from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, child_env

from minbert.core.runtime import precision_on
from minbert.params import load_params
from minbert.pipeline.estimate import StepCost, estimate, fit_seconds, sentences, train_rows, typical_length

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
    seconds, updates = fit_seconds(exp.finetune, ["sst", "sts"], rows["train"], rows["dev"], COST, exp.seed)
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
    seconds, updates = fit_seconds(cfg, ["sst", "sts"], rows["train"], rows["dev"], COST, 1)
    train = 120 * 10 * 1e-3 + 120 * 20 * 1e-3
    evals = 2 * 3 * math.ceil((50 + 100) / 128) * 128 * 1e-4     # 50 sst sentences and 50 pairs a pass
    assert updates == 240 and seconds == pytest.approx(train + evals)


def test_a_frozen_encoder_without_dropout_costs_one_pass_over_its_data(lp):
    rows = train_rows(lp)
    exp = lp.experiments["frozen"]
    seconds, updates = fit_seconds(exp.finetune, ["sst", "sts"], rows["train"], rows["dev"], COST, exp.seed)
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
    seconds, updates = fit_seconds(cfg, ["sst", "sts"], rows["train"], rows["dev"], COST, 1)
    # every update (its branch's layers train: priced as a training pass) and every evaluation
    sst = 120 * 10 * 1e-3 + 2 * 3 * math.ceil(200 / 128) * 128 * 1e-4
    sts = 1200 * 1e-4 + math.ceil(400 / 128) * 128 * 1e-4                     # once
    assert updates == 240 and seconds == pytest.approx(sst + sts)


def test_the_whole_estimate_adds_every_job(lp):
    est = estimate(lp, COST)
    assert est.jobs == 4 and est.updates == 480                   # two fine-tunings and their predictions
    assert set(est.seconds) == {"finetune", "predict"}
    assert est.total == pytest.approx(sum(s for s, _ in est.longest))
    assert sentences("sts", lp.experiments["plain"].finetune.heads) == 2 and sentences("sst", None) == 1


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
                          "--threads", "1"], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    precision = precision_on("auto", torch.device("cpu"))     # what the params' `auto` means here, as measured
    assert re.match(rf"about .* of work on cpu \({precision}, 1 threads, sentences of \d+ word pieces\), one job at "
                    r"a time: 4 jobs, 480 training updates .*the longest: ", line), line


def test_an_estimate_measured_on_busy_cores_says_so():
    from minbert.pipeline.estimate import busy_note

    note = busy_note("cpu", load=2.9, cores=2)
    assert "busy" in note and "load average 2.9 on 2 cores" in note and "\n" not in note
    assert busy_note("cpu", load=0.4, cores=2) is None
    assert busy_note("cuda", load=9.0, cores=2) is None          # a GPU's step is not the CPU's load
    assert busy_note("cpu") is None or "busy" in busy_note("cpu")  # this machine's own load, read
