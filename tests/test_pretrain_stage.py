"""The pretrain stage end to end on slices of the real data with the tiny BERT: each kind lowers
its own dev loss, writes the file contract, and shares one output per pretraining name."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml

from minbert.core.runtime import Runtime
from minbert.data.raw import read_cs224n, read_nli, split_by_group
from minbert.data.read import read_split, write_split
from minbert.model.tokenizer import Tokenizer
from minbert.model.weights import load_encoder
from minbert.params import ExperimentParams, PretrainParams
from minbert.train.mlm import MlmObjective, build_mlm_head
from minbert.train.pretrain import encode_texts, mean_dev_loss, mlm_frames
from stages import pretrain as stage

FAST = {"epochs": 2, "batch_size": 16, "lr": 1.0e-3, "warmup_ratio": 0.0, "max_steps_per_epoch": 12,
        "dev_size": 64}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shared_data):
    """results/data-style splits: 240 train / 64 dev rows per task, and the SNLI sample split by premise."""
    out = tmp_path_factory.mktemp("data")
    cs = shared_data / "cs224n"
    for task, prefix in (("sst", "ids-sst"), ("para", "quora"), ("sts", "sts")):
        for split, n in (("train", 240), ("dev", 64)):
            frame, _ = read_cs224n(cs / f"{prefix}-{split}.csv", task, on_bad_rows="drop")
            write_split(frame.head(n), out / f"{task}-{split}.tsv")
    nli, _ = read_nli(shared_data / "nli" / "snli-sample.jsonl")
    train, dev = split_by_group(nli, 0.2, seed=1)
    write_split(train, out / "nli-train.tsv")
    write_split(dev, out / "nli-dev.tsv")
    return out


@pytest.fixture(scope="module")
def params_file(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    raw = {
        "base": {"model": str(tiny_model_dir), "max_length": 32, "device": "cpu", "seed": 3},
        "pretrainings": {
            # a random tiny BERT needs a large step to move its vocabulary logits within 24 steps
            "mlm": {"kind": "mlm", **FAST, "lr": 5.0e-3, "mlm": {"tasks": ["sst", "para", "sts"]}},
            **{f"nli_{o}": {"kind": "nli", **FAST, "nli": {"objective": o}}
               for o in ("regression", "contrastive", "triplet")},
            "para": {"kind": "para_first", **FAST},
        },
        "experiments": {"a": {"pretrain": "mlm"}, "b": {"pretrain": "mlm", "seed": 5}},
    }
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def results_with(prepared, results):
    """A results folder holding the prepared data (as the prepare stage leaves it)."""
    if not (results / "data").exists():
        shutil.copytree(prepared, results / "data")
    return results


def _run(params_file, prepared, results, name):
    """Run the stage; its outputs are results/pretrain/<name>/."""
    stage.main(["--params", str(params_file), "--results", str(results_with(prepared, results)), "--name", name])
    return json.loads((results / "pretrain" / name / "metrics.json").read_text())


@pytest.mark.slow
def test_mlm_stage_lowers_dev_loss_and_keeps_its_head(params_file, prepared, tmp_path):
    m = _run(params_file, prepared, tmp_path, "mlm")
    out = tmp_path / "pretrain" / "mlm"
    assert m["kind"] == "mlm" and m["mlm_head_loaded"] is False
    assert m["dev_loss_last"] < m["dev_loss_before"] - 0.3, m
    assert m["train_examples"] == {"sst": 240, "para": 240, "sts": 240}   # downsampled to the smallest
    hist = pd.read_csv(out / "history.csv")
    assert list(hist.columns) == ["epoch", "update", "lr_budget", "train_loss", "dev_loss"]
    assert hist["epoch"].tolist() == [1, 2] and hist["update"].is_monotonic_increasing
    assert hist["dev_loss"].iloc[-1] == pytest.approx(m["dev_loss_last"])
    run = json.loads((tmp_path / "runs" / "pretrain" / "mlm.json").read_text())
    assert run["stage"] == "pretrain" and run["name"] == "mlm" and run["wall_seconds"] > 0
    assert run["description"]["settings"]["pretraining"]["kind"] == "mlm"
    assert run["description"]["settings"]["finetune"] is None          # MLM does not read base.finetune
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary folder left behind"

    # the saved folder carries the trained MLM head, tied to the word embeddings again on load
    enc, tensors, folder = load_encoder(out / "model")
    assert (folder / "vocab.txt").is_file() and (folder / "tokenizer.json").is_file()
    head, loaded = build_mlm_head(enc, tensors)
    assert loaded and head.decoder.weight is enc.embeddings.word.weight

    # on a checkpoint with an MLM head, the loss starts lower with that head than with a fresh one
    pp = PretrainParams.model_validate({"kind": "mlm", **FAST})
    exp = ExperimentParams(model=str(out / "model"), max_length=32, seed=3)
    tok = Tokenizer(folder, 32)
    dev_frames = {t: read_split(prepared / f"{t}-dev.tsv") for t in pp.mlm.tasks}
    dev = encode_texts(tok, mlm_frames(dev_frames, pp, exp.seed))[:64]
    fresh, _ = build_mlm_head(enc, None)
    torch.manual_seed(0)
    cpu = Runtime(torch.device("cpu"), bf16=False)
    with_head = mean_dev_loss(MlmObjective(enc, head, tok, dev, dev, 0.15, 3), cpu, 16)
    with_fresh = mean_dev_loss(MlmObjective(enc, fresh, tok, dev, dev, 0.15, 3), cpu, 16)
    assert with_head < with_fresh - 0.3, (with_head, with_fresh)


@pytest.mark.slow
def test_mlm_from_a_checkpoint_with_a_head_starts_where_the_last_run_ended(params_file, prepared, tmp_path):
    """Pretraining again from an MLM output loads its head: the starting dev loss equals the
    previous run's final dev loss (same dev texts, same dev masks)."""
    first = _run(params_file, prepared, tmp_path, "mlm")
    raw = yaml.safe_load(params_file.read_text())
    raw["pretrainings"]["again"] = {**raw["pretrainings"]["mlm"], "model": str(tmp_path / "pretrain" / "mlm" / "model"),
                                    "epochs": 1, "max_steps_per_epoch": 2}
    again_params = tmp_path / "params.yaml"
    again_params.write_text(yaml.safe_dump(raw))
    second = _run(again_params, prepared, tmp_path, "again")
    assert second["mlm_head_loaded"] is True
    assert second["dev_loss_before"] == pytest.approx(first["dev_loss_last"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["regression", "contrastive", "triplet"])
def test_nli_stage_lowers_its_dev_loss(params_file, prepared, tmp_path, objective):
    m = _run(params_file, prepared, tmp_path, f"nli_{objective}")
    out = tmp_path / "pretrain" / f"nli_{objective}"
    assert m["kind"] == "nli" and m["objective"] == objective and m["pooling"] == "mean"
    assert m["dev_loss_last"] < m["dev_loss_before"], m
    assert m["train_examples"] > 100 and m["dev_examples"] == 64
    enc, tensors, _ = load_encoder(out / "model")
    assert tensors == {}   # NLI pretraining saves no MLM head


@pytest.mark.slow
def test_para_first_trains_the_paraphrase_task_and_saves_the_encoder(params_file, prepared, tmp_path, tiny_model_dir):
    """kind=para_first fine-tunes on the whole Quora training split and saves the encoder."""
    m = _run(params_file, prepared, tmp_path, "para")
    out = tmp_path / "pretrain" / "para"
    assert m["kind"] == "para_first" and m["epochs"] == 2
    assert m["dev_loss_last"] < m["dev_loss_before"], m
    hist = pd.read_csv(out / "history.csv")
    assert list(hist.columns) == ["epoch", "update", "lr_budget", "train_loss", "dev_loss"]
    assert hist["epoch"].tolist() == [1, 2] and hist["update"].is_monotonic_increasing
    enc, tensors, folder = load_encoder(out / "model")
    start, _, _ = load_encoder(tiny_model_dir)
    assert tensors == {} and (folder / "tokenizer.json").is_file()
    moved = [k for k, v in enc.state_dict().items() if not torch.equal(v, start.state_dict()[k])]
    assert moved, "the saved encoder is the starting one"
    # paraphrase-first reads base.finetune (its heads, dropout, clipping): its description says so
    run = json.loads((tmp_path / "runs" / "pretrain" / "para.json").read_text())
    heads = run["description"]["settings"]["finetune"]["heads"]
    assert heads["pooling"] == "cls" and heads.get("para", "cross") == "cross"     # para's declared head


def test_bad_input_is_one_line_with_exit_2(params_file, prepared, tmp_path, repo_root):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "stages.pretrain", "--params", str(params_file), *args],
                              cwd=repo_root, capture_output=True, text=True, timeout=120)

    results = results_with(prepared, tmp_path / "results")
    r = cli("--name", "mlmm", "--results", str(results))
    assert r.returncode == 2 and "unknown pretraining 'mlmm' (did you mean 'mlm'?)" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("--name", "mlm", "--results", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "stages.prepare" in r.stderr
    # NLI data in which no premise has both an entailment and a contradiction
    bad = tmp_path / "bad"
    bad.mkdir()
    frame = pd.DataFrame({"id": ["1", "2"], "group": ["g1", "g2"], "sentence1": ["p1", "p2"],
                          "sentence2": ["h1", "h2"], "label": ["entailment", "contradiction"]})
    write_split(frame, bad / "data" / "nli-train.tsv")
    write_split(frame, bad / "data" / "nli-dev.tsv")
    r = cli("--name", "nli_triplet", "--results", str(bad))
    assert r.returncode == 2 and "nli-train.tsv: no (premise, entailment, contradiction) triplet" in r.stderr
    assert not (bad / "pretrain").exists() or not any((bad / "pretrain").rglob("*.*"))


def test_a_pretraining_may_set_its_own_precision(tiny_model_dir, prepared, tmp_path, monkeypatch):
    import minbert.core.runtime as runtime  # every stage's autocast goes through Runtime.amp

    seen = []
    original = runtime.autocast
    monkeypatch.setattr(runtime, "autocast", lambda device, precision: seen.append(precision) or
                        original(device, precision))
    quick = {**FAST, "epochs": 1, "max_steps_per_epoch": 2, "dev_size": 16}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({
        "base": {"model": str(tiny_model_dir), "max_length": 32, "device": "cpu", "precision": "bf16"},
        "pretrainings": {"inherits": {"kind": "nli", **quick},
                         "fp32": {"kind": "nli", **quick, "precision": "fp32"}},
        "experiments": {"a": {"pretrain": "fp32", "finetune": {"heads": {"pooling": "mean"}}}}}), encoding="utf-8")
    results = results_with(prepared, tmp_path)
    for name, expected in (("inherits", {"bf16"}), ("fp32", {"fp32"})):
        seen.clear()
        stage.main(["--params", str(path), "--results", str(results), "--name", name])
        assert seen and set(seen) == expected, name            # the precision each autocast ran in
        record = json.loads((results / "runs" / "pretrain" / f"{name}.json").read_text())
        assert record["precision"] == expected.pop(), name   # what ran
