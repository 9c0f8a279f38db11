"""A trained model leaves the pipeline. On new text: `minbert predict` (files in every format, stdin)
and the Python API give the predict stage's own predictions on the same rows; bad input is one line
and exit status 2. Exported: transformers and sentence-transformers (the real libraries) load the
export folder and give our hidden states, embeddings and cross-encoder outputs; the model card holds
the report's scores and intervals."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import child_env, error_line, minbert_in_process as minbert_here
from test_train import restore_threads, write_prepared  # noqa: E402, F401  (tests/ is on sys.path; fixture)

from minbert.data.read import read_split
from minbert.entry import run
from stages import export, finetune, predict

# compares numbers between two ways of computing them: CI runs it again with the other precision as `auto`
pytestmark = pytest.mark.numbers

FT = {"epochs": 1, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.0, "max_steps_per_epoch": 3,
      "downsample": {"mode": "fixed", "size": 24}}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shipped_heads(name: str) -> dict:
    """The heads of an experiment of the shipped params.yaml, as its settings resolve them."""
    from minbert.params import load_params

    lp = load_params(os.path.join(REPO, "params.yaml"))
    return lp.experiment(name).finetune.heads.model_dump(mode="json")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A results folder with tiny trained experiments and their predictions: `bi` (mean pooling,
    cosine pair heads), `cross` (pooler output, cross-encoder pair heads), `shipped_cross` (the
    heads of the shipped params.yaml's `cross_encoder`: mean pooling, cross-encoder pair heads) and
    `deep_cross` (CLS pooling, a hidden layer in each pair head)."""
    root = tmp_path_factory.mktemp("use")
    results = root / "results"
    write_prepared(results / "data", n_train=32, n_dev=24, n_test=16)
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({
        "base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "seed": 3, "max_length": 32,
                 "predict_batch_size": 16, "finetune": FT},
        "experiments": {
            "bi": {"description": "cosine heads", "finetune": {"heads": {"pooling": "mean", "para": "cosine",
                                                                          "sts": "cosine"}}},
            "cross": {"finetune": {"heads": {"pooling": "pooler", "para": "cross", "sts": "cross"}}},
            "shipped_cross": {"finetune": {"heads": shipped_heads("cross_encoder")}},
            "deep_cross": {"finetune": {"heads": {"pooling": "cls", "para": "cross", "sts": "cross",
                                                  "hidden_layers": {"para": 1, "sts": 2}}}}},
        "export": {"experiments": ["bi", "cross", "shipped_cross", "deep_cross"], "license": "mit"}}), encoding="utf-8")
    for name in ("bi", "cross", "shipped_cross", "deep_cross"):
        for stage in (finetune, predict, export):
            run(stage.main, ["--experiment", name, "--params", str(params), "--results", str(results)])
    return results


def minbert_cli(args, stdin: str | None = None, cwd=None):
    """`minbert ARGS` as a user runs it (the console script's module, this checkout first)."""
    env = child_env(REPO, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "minbert.cli", *map(str, args)], input=stdin, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


# On a GPU the predict stage and the command are two processes whose kernels (cuBLAS's and the
# attention's choice in each process) agree to the last bit of the precision they run in only: bf16
# keeps 8 bits (2^-8 = 3.9e-3 relative), and an H200 showed 5.7e-4 on a similarity score. On a CPU
# the same batches give the same numbers to float32's rounding.
RTOL, ATOL, PROB_ATOL = (4e-3, 1e-4, 1e-4) if torch.cuda.is_available() else (1e-5, 1e-5, 1e-6)


def stage_predictions(results, name, task):
    return pd.read_csv(results / "experiments" / name / "predictions" / f"{task}-dev.csv", dtype={"id": str})


def assert_same(task: str, ours: pd.DataFrame, theirs: pd.DataFrame):
    """The command's columns for `task` against the predict stage's file, row by row."""
    if task == "sts":
        np.testing.assert_allclose(ours["sts_score"].astype(float), theirs["prediction"], rtol=RTOL, atol=ATOL)
        return
    assert ours[f"{task}_label"].astype(int).tolist() == theirs["prediction"].tolist()
    for c in [c for c in theirs.columns if c.startswith("prob_")]:
        np.testing.assert_allclose(ours[f"{task}_{c}"].astype(float), theirs[c], rtol=RTOL, atol=PROB_ATOL)


def test_console_script_is_declared():
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["minbert"] == "minbert.cli:main"
    r = minbert_cli(["predict", "--help"])
    assert r.returncode == 0 and "MODEL" in r.stdout and "--task" in r.stdout


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_files_of_sentences_and_pairs_give_the_stage_predictions(trained, tmp_path, fmt, capsys):
    for name in ("bi", "cross"):
        for task, columns in (("sst", ["id", "sentence"]), ("para", ["id", "sentence1", "sentence2"]),
                              ("sts", ["id", "sentence1", "sentence2"])):
            rows = read_split(trained / "data" / f"{task}-dev.tsv")[columns]
            path = tmp_path / f"{name}-{task}.{fmt}"
            if fmt == "tsv":
                path.write_text("\t".join(columns) + "\n" + "".join("\t".join(r) + "\n" for r in rows.to_numpy()))
            elif fmt == "csv":
                rows.to_csv(path, index=False)
            else:
                rows.to_json(path, orient="records", lines=True)
            code, _, err = minbert_here(["predict", trained / "experiments" / name, path, "--out",
                                         tmp_path / f"out.{fmt}"], capsys)
            assert code == 0, err
            out_path = tmp_path / f"out.{fmt}"
            out = (pd.read_json(out_path, lines=True, dtype={"id": str}) if fmt == "jsonl" else
                   pd.read_csv(out_path, sep="\t" if fmt == "tsv" else ",", dtype={"id": str}, quoting=3 if fmt == "tsv" else 0))
            assert out["id"].tolist() == rows["id"].tolist()
            tasks = ["sst"] if task == "sst" else ["para", "sts"]      # every task the columns fit
            assert [c for c in out.columns if c.endswith(("_label", "_score"))] == \
                [f"{t}_{'score' if t == 'sts' else 'label'}" for t in tasks]
            assert_same(task, out, stage_predictions(trained, name, task))


def test_stdin_text_and_the_python_api(trained):
    from minbert.api import load_model

    sst = read_split(trained / "data" / "sst-dev.tsv")
    r = minbert_cli(["predict", trained / "experiments" / "bi", "-"], stdin="".join(s + "\n" for s in sst["sentence"]))
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(__import__("io").StringIO(r.stdout), sep="\t", quoting=3)
    assert list(out.columns) == ["sentence", "sst_label", "sst_class"] + [f"sst_prob_{k}" for k in range(5)]
    assert_same("sst", out, stage_predictions(trained, "bi", "sst"))

    sts = read_split(trained / "data" / "sts-dev.tsv")
    jsonl = "".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n" for a, b in zip(sts["sentence1"], sts["sentence2"]))
    r = minbert_cli(["predict", trained / "experiments" / "cross" / "finetune" / "model.pt", "--task", "sts"], stdin=jsonl)
    assert r.returncode == 0, r.stderr
    out = pd.read_json(__import__("io").StringIO(r.stdout), lines=True)
    assert_same("sts", out, stage_predictions(trained, "cross", "sts"))

    m = load_model(trained / "experiments" / "cross", device="cpu", batch_size=16)
    pairs = list(zip(sts["sentence1"], sts["sentence2"]))
    np.testing.assert_allclose(m.similarity(pairs)["prediction"], stage_predictions(trained, "cross", "sts")["prediction"],
                               rtol=RTOL, atol=ATOL)
    para = read_split(trained / "data" / "para-dev.tsv")
    got = m.paraphrase(list(zip(para["sentence1"], para["sentence2"])))
    assert got["prediction"].tolist() == stage_predictions(trained, "cross", "para")["prediction"].tolist()
    assert set(got["class"]) <= {"not paraphrase", "paraphrase"}
    s = m.sentiment(sst["sentence"].tolist())
    assert s["prediction"].tolist() == stage_predictions(trained, "cross", "sst")["prediction"].tolist()


def test_a_long_input_shows_a_progress_bar_and_keeps_the_order(trained, tmp_path, capsys):
    sst = read_split(trained / "data" / "sst-dev.tsv")
    many = pd.concat([sst] * 6, ignore_index=True)[["sentence"]]          # 144 rows, batches of 4: two chunks
    path = tmp_path / "many.csv"
    many.to_csv(path, index=False)
    code, stdout, err = minbert_here(["predict", trained / "experiments" / "bi", path, "--batch-size", "4"], capsys)
    assert code == 0, err
    assert "0/144" in err and "row/s" in err                             # tqdm's bar on stderr
    out = pd.read_csv(__import__("io").StringIO(stdout), sep="\t", quoting=3)
    stage = stage_predictions(trained, "bi", "sst")
    assert out["sst_label"].tolist() == stage["prediction"].tolist() * 6


@pytest.mark.parametrize("case", ["missing column", "empty text", "pair file for sst", "no such head",
                                  "unreadable file", "not a model", "bad json", "ragged csv"])
def test_bad_input_is_one_line_naming_file_and_line(trained, tmp_path, case, capsys):
    exp = trained / "experiments" / "bi"
    f = tmp_path / "in.csv"
    args, expect = None, None
    if case == "missing column":
        f.write_text("sentence1,other\na,b\n")
        args, expect = ["predict", exp, f, "--task", "para"], f"{f}:1: para reads sentence pairs but the input has no column 'sentence2'"
    elif case == "empty text":
        f.write_text("id,sentence\n1,fine\n2,   \n3,good\n")
        args, expect = ["predict", exp, f], f"{f}:3: empty text in column 'sentence'; fill it or remove the row"
    elif case == "pair file for sst":
        f.write_text("sentence1,sentence2\na,b\n")
        args, expect = ["predict", exp, f, "--task", "sst"], f"{f}:1: sst reads one sentence per row, but this is a pair file"
    elif case == "no such head":
        shutil.copy(exp / "finetune" / "model.pt", tmp_path / "model.pt")
        ckpt = torch.load(tmp_path / "model.pt", weights_only=True)
        ckpt["tasks"] = ["sst"]
        ckpt["state_dict"] = {k: v for k, v in ckpt["state_dict"].items() if not k.startswith(("heads.para", "heads.sts"))}
        torch.save(ckpt, tmp_path / "model.pt")
        f.write_text("sentence1,sentence2\na,b\n")
        args, expect = ["predict", tmp_path / "model.pt", f, "--task", "sts"], f"{tmp_path / 'model.pt'}: the model has no sts head"
    elif case == "unreadable file":
        args, expect = ["predict", exp, tmp_path / "absent.tsv"], f"{tmp_path / 'absent.tsv'}: input file not found"
    elif case == "not a model":
        args, expect = ["predict", tmp_path, f], f"{tmp_path}: not a trained model; give an experiment's folder"
        f.write_text("sentence\na\n")
    elif case == "bad json":
        f = tmp_path / "in.jsonl"
        f.write_text('{"sentence": "fine"}\n{"sentence": \n')
        args, expect = ["predict", exp, f], f"{f}:2: not a JSON object"
    else:
        f.write_text('id,sentence\n1,"one, quoted"\n2,two,three\n')
        args, expect = ["predict", exp, f], f"{f}:3: 3 fields where the header has 2"
    code, out, err = minbert_here(args, capsys)
    assert code == 2, (code, err)
    assert error_line(err).startswith("error: " + expect), err
    assert out == ""


# ---------------------------------------------------------------- the export

def test_transformers_loads_the_encoder_with_our_hidden_states(trained):
    from transformers import AutoModel, AutoTokenizer

    from minbert.api import load_model

    sentences = read_split(trained / "data" / "sst-dev.tsv")["sentence"].tolist()[:8]
    for name in ("bi", "cross"):
        folder = trained / "exports" / name
        hf = AutoModel.from_pretrained(folder).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        ours = load_model(trained / "experiments" / name, device="cpu")
        batch = tok(sentences, padding=True, truncation=True, return_tensors="pt")
        mine = ours.tokenizer(sentences)
        assert torch.equal(batch["input_ids"], mine["input_ids"])           # the same tokenizer
        with torch.no_grad():
            out = hf(**batch)
            hidden, pooled = ours.model.encoder(mine["input_ids"], mine["attention_mask"], mine["token_type_ids"])
        mask = batch["attention_mask"].bool()
        torch.testing.assert_close(out.last_hidden_state[mask], hidden[mask], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.pooler_output, pooled, atol=1e-5, rtol=0)


def test_sentence_transformers_gives_our_sentence_embeddings(trained):
    from sentence_transformers import SentenceTransformer

    from minbert.api import load_model

    sentences = read_split(trained / "data" / "sst-dev.tsv")["sentence"].tolist()
    for name in ("bi", "cross"):            # mean pooling; the pooler's output (a Dense module with tanh)
        st = SentenceTransformer(str(trained / "exports" / name), device="cpu")
        # sentence-transformers computes in float32: ours in float32 too (by default the API takes the
        # predict stage's precision, bf16 where `auto` means bf16, which test_stdin_... compares)
        ours = load_model(trained / "experiments" / name, device="cpu", precision="fp32")
        np.testing.assert_allclose(st.encode(sentences, batch_size=8), ours.embed(sentences), atol=1e-5, rtol=0)


def cross_encoder_matches(folder, model, task: str, pairs: list, stage=None, stage_precision: str = "fp32"):
    """sentence_transformers.CrossEncoder on the export's `cross-encoder-<task>/` against the API's
    float32 predictions of `model` (the export's own model) and, when given, the predict stage's.
    CrossEncoder computes in float32. The predict stage ran in the precision `auto` means here (its
    run record says which): in float32 its numbers must be CrossEncoder's; in bf16 autocast they
    differ by bf16's rounding (8 bits of mantissa, about 0.4% per product), which is no error, so
    then the stage is compared within that rounding and the API in float32 exactly."""
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(folder / f"cross-encoder-{task}"), device="cpu")
    got = ce.predict(pairs, batch_size=8)
    ours = model.predict(task, pd.DataFrame(pairs, columns=["sentence1", "sentence2"]))
    tol = {"atol": 1e-5, "rtol": 1e-5} if stage_precision == "fp32" else {"atol": 2e-2, "rtol": 0}
    if task == "para":                   # sigmoid of the logit: the paraphrase probability
        np.testing.assert_allclose(got, ours["prob_1"], atol=1e-5, rtol=1e-5)
        if stage is not None:
            np.testing.assert_allclose(got, stage["prob_1"], **tol)
    else:                                # the raw output: 5 * output, clipped, is the score
        np.testing.assert_allclose(np.clip(5 * got, 0, 5), ours["prediction"], atol=1e-4, rtol=1e-5)
        if stage is not None:
            np.testing.assert_allclose(np.clip(5 * got, 0, 5), stage["prediction"], **{k: v * 5 for k, v in tol.items()})


@pytest.mark.parametrize("name, form", [("cross", "BertForSequenceClassification"), ("shipped_cross", "modules"),
                                        ("deep_cross", "modules")])
def test_a_cross_encoder_head_loads_as_a_cross_encoder(trained, name, form):
    """A cross-encoder pair head on the pooler's output is `BertForSequenceClassification`; the shipped
    `cross_encoder` experiment's (mean pooling) and one with CLS pooling and hidden layers are
    sentence-transformers modules (the encoder, the pooling, the head's layers as Dense modules):
    CrossEncoder loads each and predicts what the pipeline predicts."""
    from minbert.api import load_model

    folder = trained / "exports" / name
    stage_precision = json.loads((trained / "runs" / "predict" / f"{name}.json").read_text())["precision"]
    fp32 = load_model(trained / "experiments" / name, device="cpu", precision="fp32")
    for task in ("para", "sts"):
        rows = read_split(trained / "data" / f"{task}-dev.tsv")
        pairs = list(zip(rows["sentence1"], rows["sentence2"]))
        written = json.loads((folder / f"cross-encoder-{task}" / "config.json").read_text())["architectures"]
        assert (written == ["BertForSequenceClassification"]) == (form == "BertForSequenceClassification")
        assert (folder / f"cross-encoder-{task}" / "modules.json").is_file() == (form == "modules")
        cross_encoder_matches(folder, fp32, task, pairs, stage_predictions(trained, name, task), stage_precision)
    card = (folder / "README.md").read_text()
    assert 'CrossEncoder("path/to/this/folder/cross-encoder-para")' in card
    assert ("sentence-transformers modules (sentence-transformers 6 or later)" in card) == (form == "modules")


def test_a_cross_encoders_calibration_is_folded_into_its_output_layer(trained, tmp_path):
    """A head whose outputs the model maps by a fitted calibration (a loss that fixes no scale,
    minbert.model.outputs) is exported with the map in its output layer: CrossEncoder predicts the
    calibrated probability and score, in either form."""
    from minbert.api import load_model
    from minbert.share.export import export_model

    for name in ("cross", "deep_cross"):
        m = load_model(trained / "experiments" / name, device="cpu", precision="fp32")
        m.model.calibration.update({"para": [1.7, -0.4], "sts": [0.8, 0.6]})
        export_model(m.model, m.tokenizer, tmp_path / name)
        for task in ("para", "sts"):
            rows = read_split(trained / "data" / f"{task}-dev.tsv")
            cross_encoder_matches(tmp_path / name, m, task, list(zip(rows["sentence1"], rows["sentence2"])))


def test_other_pair_heads_load_through_the_api(trained):
    from minbert.api import load_model

    bi = trained / "exports" / "bi"
    assert not list(bi.glob("cross-encoder-*"))
    assert "paraphrase (Quora) head loads through the pipeline's API only (its cosine head is a bi-encoder: it embeds " \
        "each sentence apart)" in (bi / "README.md").read_text()
    umask = os.umask(0)
    os.umask(umask)
    assert (bi / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask       # not the owner's alone
    m = load_model(bi, device="cpu", batch_size=16)                     # every head, from the export alone
    for task in ("sst", "para", "sts"):
        rows = read_split(trained / "data" / f"{task}-dev.tsv")
        got = m.predict(task, rows[[c for c in rows.columns if c.startswith("sentence")]])
        stage = stage_predictions(trained, "bi", task)
        np.testing.assert_allclose(got["prediction"], stage["prediction"], atol=1e-4, rtol=1e-5)


def test_the_model_card_holds_metadata_scores_with_intervals_and_provenance(trained):
    from minbert.scoring.evaluate import read_predictions
    from minbert.scoring.stats import Sample, task_estimate

    text = (trained / "exports" / "bi" / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["license"] == "mit" and meta["library_name"] == "sentence-transformers"
    # data.dir is the demo's (the default): no Hub scores claiming SST-5, Quora or STS; the card says so
    assert "model-index" not in meta and "synthetic-data" in meta["tags"]
    assert "Trained on the minBERT demo data: synthetic" in text
    assert "The scores of sentiment (SST-5), paraphrase (Quora), similarity (STS) are on the synthetic demo data" in text
    assert "- sentiment (SST-5): synthetic demo data (not the data set its name says), from `data/demo/ids-sst-train.csv`" \
        in text
    # the base model is a local folder: named in the text, no Hub id in the metadata
    assert "base_model" not in meta and "A BERT encoder: `" in text
    for task in ("sst", "para", "sts"):
        frame = read_predictions(trained / "experiments" / "bi" / "predictions" / f"{task}-dev.csv", task)
        est = task_estimate(task, Sample.of(frame))
        value, iv = est.value, est.interval()
        assert f"| {value:.4f} | [{iv.low:.4f}, {iv.high:.4f}] | {len(frame)} |" in text
    record = json.loads((trained / "runs" / "finetune" / "bi.json").read_text())
    export_record = json.loads((trained / "runs" / "export" / "bi.json").read_text())
    assert f"training fingerprint: `{record['fingerprint']}`" in text
    assert f"export fingerprint: `{export_record['fingerprint']}`" in text
    assert "lr: 0.001" in text and "| test |" not in text     # test: no labels
    assert "`data/demo/ids-sst-test-student.csv`; 32 rows in the prepared training split" in text


def test_a_card_names_its_base_model_through_its_pretraining_and_real_data_scores_go_to_the_hub():
    from minbert.params.settings import ExportSettings
    from minbert.share.export import model_card

    score = {"dev": {"sst": (0.5, 0.45, 0.55, 200), "para": (0.8, 0.78, 0.82, 200), "sts": (0.7, 0.65, 0.75, 200)}}
    files = {"pooling": "mean of the token vectors", "cross": {}}
    training = {"model": None, "pretrain": "mlm_x", "finetune": {"tasks": ["sst", "para", "sts"]}}
    s = ExportSettings(model_stage="finetune", predicts=["sst", "para", "sts"], license="mit", language="en", data="data/cs224n", demo_data=False,
                       base_model="sentence-transformers/all-MiniLM-L6-v2",
                       start_model="sentence-transformers/all-MiniLM-L6-v2", pretraining="mlm_x (mlm)")
    text = model_card(s, "e", files, score, training, {}, {})
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["base_model_relation"] == "finetune"
    assert {r["dataset"]["type"] for r in meta["model-index"][0]["results"]} == {"sst", "para", "sts"}
    assert "`sentence-transformers/all-MiniLM-L6-v2`, further pretrained by `mlm_x (mlm)`, then fine-tuned" in text
    assert "model: sentence-transformers/all-MiniLM-L6-v2 after pretraining mlm_x" in text    # not `model: null`
    demo = model_card(s.model_copy(update={"demo_data": True}), "e", files, score, training, {}, {})
    assert "model-index" not in yaml.safe_load(demo.split("---\n")[1])


def test_a_cards_data_comes_from_each_tasks_declaration(tmp_path):
    """The demo's built-in tasks are named as synthetic; a task of the user's read from real files
    (the CS224N CFIMDB files, declared with their paths) is named by those files, and only its scores
    go to the Hub's metadata; a task of the user's read from the demo folder is synthetic too."""
    from minbert.core.tasks import TASKS
    from minbert.params.settings import ExportSettings
    from minbert.share.export import model_card

    real = tmp_path / "cs224n"            # the real files' layout; the card reads the declaration, not them
    real.mkdir()
    demo = os.path.join(REPO, "data", "demo")
    tasks = {"imdb": {"classes": ["negative", "positive"], "files": {
                 "format": "tsv", "train": str(real / "ids-cfimdb-train.csv"), "dev": str(real / "ids-cfimdb-dev.csv"),
                 "texts": ["sentence"], "label": "sentiment", "id": "id"}},
             "sst_score": {"range": [0, 4], "files": {
                 "format": "tsv", "train": f"{demo}/ids-sst-train.csv", "dev": f"{demo}/ids-sst-dev.csv",
                 "texts": ["sentence"], "label": "sentiment", "id": "id"}}}
    s = ExportSettings(model_stage="finetune", predicts=["sst", "imdb", "sst_score"], license="mit", language="en",
                       data="data/demo", demo_data=True, tasks=tasks)
    score = {"dev": {"sst": (0.5, 0.45, 0.55, 200), "imdb": (0.9, 0.87, 0.93, 245), "sst_score": (0.6, 0.5, 0.7, 200)}}
    with s.registry.active():            # the export job's registry: its settings' declared tasks
        text = model_card(s, "e", {"pooling": "mean of the token vectors", "cross": {}}, score, {},
                          {"sst": 600, "imdb": 1707}, {})
    assert set(TASKS) == {"sst", "para", "sts", "cfimdb"}
    meta = yaml.safe_load(text.split("---\n")[1])
    assert "synthetic-data" in meta["tags"]                  # the SST rows are the demo's
    assert [r["dataset"]["type"] for r in meta["model-index"][0]["results"]] == ["imdb"]
    assert "Trained on the minBERT demo data: synthetic, template-generated sentences in the layout of sentiment " \
           f"(SST-5), sst_score (`data/demo`, `{demo}`), not those data sets" in text
    assert f"and on imdb from the files `{real}/ids-cfimdb-train.csv`, `{real}/ids-cfimdb-dev.csv`." in text
    assert f"- imdb: real data, from `{real}/ids-cfimdb-train.csv`, `{real}/ids-cfimdb-dev.csv`; 1707 rows in the " \
           "prepared training split" in text
    assert "- sentiment (SST-5): synthetic demo data (not the data set its name says), from `data/demo/ids-sst-train.csv`" \
        in text and f"- sst_score: synthetic demo data (not the data set its name says), from `{demo}/ids-sst-train.csv`" \
        in text
    assert "The scores of sentiment (SST-5), sst_score are on the synthetic demo data" in text
    # the built-in CFIMDB task with data.dir the real folder: real data, named by its files
    s = ExportSettings(model_stage="finetune", predicts=["cfimdb"], license="mit", language="en", data=str(real))
    text = model_card(s, "e", {"pooling": "mean", "cross": {}}, {"dev": {"cfimdb": (0.9, 0.87, 0.93, 245)}}, {}, {}, {})
    assert f"Trained on binary sentiment (CFIMDB) from the files `{real}/ids-cfimdb-train.csv`, " \
           f"`{real}/ids-cfimdb-dev.csv`, `{real}/ids-cfimdb-test-student.csv`." in text
    assert "synthetic" not in text and yaml.safe_load(text.split("---\n")[1])["model-index"]


def test_the_demo_export_names_its_hub_base_model_and_its_synthetic_data(repo_root, monkeypatch):
    from minbert.params import load_params
    from minbert.params.resolve import export_settings

    monkeypatch.chdir(repo_root)
    lp = load_params("params.yaml")
    s = export_settings(lp, lp.experiment("mlm_multitask"))
    assert s.base_model == "sentence-transformers/all-MiniLM-L6-v2" and s.pretraining == "mlm_demo (mlm)"
    assert s.demo_data and s.data == "data/demo"


# ---------------------------------------------------------------- the course's submission files

def starter_files(preds: dict) -> dict:
    """What the starter's test_model_multitask (evaluation.py) writes for these predictions: its own
    lines, on the numpy values its model_eval functions hold (argmax int64, sigmoid().round()
    float32, float32 logits)."""
    out = {}
    for (task, split), frame in preds.items():
        ids = [i.lower().strip() for i in frame["id"].astype(str)]          # datasets.py: id.lower().strip()
        if task == "sst":
            y = frame[[f"prob_{k}" for k in range(5)]].to_numpy().argmax(axis=1).flatten()
            header = "id \t Predicted_Sentiment \n"
        elif task == "para":
            p1 = torch.tensor(frame["prob_1"].to_numpy(), dtype=torch.float32)
            y = p1.round().flatten().cpu().numpy()
            header = "id \t Predicted_Is_Paraphrase \n"
        else:
            y = torch.tensor(frame["prediction"].to_numpy(), dtype=torch.float32).flatten().cpu().numpy()
            header = "id \t Predicted_Similiary \n"
        text = header
        for p, s in zip(ids, y):
            text += f"{p} , {s} \n"
        out[f"{task}-{split}-output.csv"] = text
    return out


def test_submission_files_are_the_starter_codes_bytes(trained, tmp_path, capsys):
    import zipfile

    exp = trained / "experiments" / "bi"
    code, out, err = minbert_here(["submission", exp, "--out", tmp_path / "predictions"], capsys)
    assert code == 0, err
    preds = {(t, s): pd.read_csv(exp / "predictions" / f"{t}-{s}.csv", dtype={"id": str})
             for t in ("sst", "para", "sts") for s in ("dev", "test")}
    expected = starter_files(preds)
    assert sorted(p.name for p in (tmp_path / "predictions").iterdir()) == sorted(expected)
    for name, text in expected.items():
        assert (tmp_path / "predictions" / name).read_bytes() == text.encode(), name
    # read back as the leaderboard's format has it: a header, then `id , value` per row of the data file
    for (task, split), frame in preds.items():
        lines = (tmp_path / "predictions" / f"{task}-{split}-output.csv").read_text().splitlines()
        assert lines[0].split("\t")[0].strip() == "id"
        rows = [line.split(" , ") for line in lines[1:]]
        assert [r[0] for r in rows] == [i.lower() for i in read_split(trained / "data" / f"{task}-{split}.tsv")["id"]]
        values = [float(r[1]) for r in rows]
        if task == "sst":
            assert all(r[1].strip().isdigit() for r in rows) and set(values) <= set(range(5))
        elif task == "para":
            assert set(values) <= {0.0, 1.0} and all(r[1].strip() in ("0.0", "1.0") for r in rows)
        np.testing.assert_allclose(values, frame["prediction"], rtol=1e-6)
    zip_path = tmp_path / "cs224n_default_final_project_submission.zip"
    assert out.splitlines()[-1] == str(zip_path)
    with zipfile.ZipFile(zip_path) as zz:                # prepare_submit.py's entry names
        assert sorted(zz.namelist()) == sorted(f"./predictions/{n}" for n in expected)
        assert zz.read("./predictions/sts-dev-output.csv") == expected["sts-dev-output.csv"].encode()
    first = zip_path.read_bytes()
    minbert_here(["submission", exp, "--out", tmp_path / "predictions"], capsys)
    assert zip_path.read_bytes() == first                # the same predictions, the same zip

    code, _, err = minbert_here(["submission", tmp_path / "predictions"], capsys)
    assert code == 2 and error_line(err).startswith(f"error: {tmp_path / 'predictions'}: no predictions here")


def test_submission_refuses_predictions_with_rows_missing(trained, tmp_path, capsys):
    """Predictions missing rows of their split never become submission files, as the evaluate stage
    refuses them (issue 33, case 4); the zip goes where --help says."""
    results = tmp_path / "results"
    shutil.copytree(trained / "data", results / "data")
    shutil.copytree(trained / "experiments" / "bi" / "predictions", results / "experiments" / "bi" / "predictions")
    folder = results / "experiments" / "bi" / "predictions"
    frame = pd.read_csv(folder / "sts-test.csv", dtype=str, keep_default_na=False)
    frame.iloc[:-5].to_csv(folder / "sts-test.csv", index=False)
    out = tmp_path / "sub" / "predictions"
    code, stdout, err = minbert_here(["submission", results / "experiments" / "bi", "--out", out], capsys)
    assert code == 2 and stdout == ""
    first = frame["id"].iloc[-5]
    assert error_line(err) == (f"error: {folder / 'sts-test.csv'}: no prediction for id '{first}' of "
                           f"{results.resolve() / 'data' / 'sts-test.tsv'} (5 of {len(frame)} rows missing); re-run "
                           f"the predict stage")
    assert not out.exists() and not (tmp_path / "sub").exists()
    # a predictions folder outside a results folder is checked against the one --results names
    shutil.copytree(trained / "experiments" / "bi" / "predictions", tmp_path / "loose" / "predictions")
    code, _, err = minbert_here(["submission", tmp_path / "loose" / "predictions", "--out", out], capsys)
    assert code == 2 and "cannot be checked against its prepared split" in err and "--results" in err
    code, stdout, err = minbert_here(["submission", tmp_path / "loose" / "predictions", "--out", out,
                                      "--results", trained], capsys)
    assert code == 0, err
    assert stdout.splitlines()[-1] == str(tmp_path / "sub" / "cs224n_default_final_project_submission.zip")
    code, stdout, _ = minbert_here(["submission", "--help"], capsys)
    assert "cs224n_default_final_project_submission.zip" in " ".join(stdout.split())
    assert "in the folder that holds --out" in " ".join(stdout.split())


def test_the_predict_stage_refuses_another_experiments_checkpoint(trained, tmp_path, capsys):
    """A model.pt copied or moved from another experiment, or from another run of this one, is refused
    by the predict stage, as `minbert predict` refuses a foreign model (issue 33, case 7)."""
    results = tmp_path / "results"
    shutil.copytree(trained, results)
    params = trained.parent / "params.yaml"
    model = results / "experiments" / "bi" / "finetune" / "model.pt"
    own = model.read_bytes()
    argv = ["--experiment", "bi", "--params", str(params), "--results", str(results)]

    def predict_stage():
        with pytest.raises(SystemExit) as e:
            run(predict.main, argv)
        return e.value.code, capsys.readouterr().err

    shutil.copy(results / "experiments" / "cross" / "finetune" / "model.pt", model)
    code, err = predict_stage()
    assert code == 2 and error_line(err) == (
        f"error: {model}: the checkpoint was written by the finetune stage of experiment 'cross', not finetune of "
        f"'bi' (copied or moved?); re-run its finetune stage (or put back the experiment's own model)")
    assert not list((results / "experiments" / "bi" / "predictions").glob("*.csv"))
    with pytest.raises(SystemExit) as e:                 # the export stage reads it the same way
        run(export.main, argv)
    assert e.value.code == 2 and "written by the finetune stage of experiment 'cross', not finetune of 'bi'" in \
        capsys.readouterr().err
    ckpt = torch.load(trained / "experiments" / "bi" / "finetune" / "model.pt", weights_only=True)
    ckpt["fingerprint"] = "0" * 64                 # bi, but trained by another run (other settings or data)
    torch.save(ckpt, model)
    code, err = predict_stage()
    assert code == 2 and error_line(err).startswith(f"error: {model}: the checkpoint is not the one finetune of 'bi' wrote last "
                                        f"(its fingerprint 000000000000, the run record ")
    model.write_bytes(own)
    run_code = 0
    try:
        run(predict.main, argv + ["--force"])
    except SystemExit as e:
        run_code = e.code
    assert run_code in (0, None), capsys.readouterr().err


def test_upload_checks_the_folder_before_any_network(tmp_path, capsys):
    code, out, err = minbert_here(["upload", tmp_path, "someone/model"], capsys)
    assert code == 2 and error_line(err) == (f"error: {tmp_path}: not an export folder (no minbert.json or README.md); run "
                                         f"the export stage (snakemake --cores all results/exports/<experiment>)")


# ---------------------------------------------------------------- issue 33: input lines, arguments, sizes

def test_lines_split_at_line_feeds_only(trained, tmp_path, capsys):
    """U+2028, a form feed or a file separator inside a line are text, not line breaks; CRLF is read;
    raw U+2028 inside a JSON string is valid JSONL (issue 33, case 5). A blank line is a row (without
    text: refused, tests/test_predict_inputs.py)."""
    from minbert.cli import read_rows

    frame, lines = read_rows("f", "one\u2028two\nthree\x0cfour\r\nfive\x1csix\n", "txt")
    assert frame["sentence"].tolist() == ["one\u2028two", "three\x0cfour", "five\x1csix"] and lines == [1, 2, 3]
    jsonl = '{"sentence": "a\u2028b"}\r\n{"sentence": "c\\u001cd"}\n{"sentence": "e\u0085f\u2029"}\n'
    frame, lines = read_rows("f", jsonl, "jsonl")
    assert frame["sentence"].tolist() == ["a\u2028b", "c\x1cd", "e\u0085f\u2029"] and lines == [1, 2, 3]
    frame, lines = read_rows("f", jsonl.replace("\r\n", "\r\n\n"), "jsonl")
    assert frame["sentence"].isna().tolist() == [False, True, False, False] and lines == [1, 2, 3, 4]
    for name, text in (("in.txt", "one\u2028two\nthree\x0cfour\r\nfive\x1csix\n"), ("in.jsonl", jsonl)):
        (tmp_path / name).write_text(text, encoding="utf-8", newline="")
        code, out, err = minbert_here(["predict", trained / "experiments" / "bi", tmp_path / name, "-q",
                                       "--out-format", "jsonl"], capsys)
        assert code == 0, err
        assert len(out.strip().split("\n")) == 3


@pytest.mark.parametrize("case", ["batch size 0", "threads -1", "batch size abc", "sentence twice in a csv",
                                  "sentence twice in a tsv", "a json key twice", "out is a folder",
                                  "out under a file"])
def test_bad_arguments_and_headers_are_one_line(trained, tmp_path, case, capsys):
    """(issue 33, case 11)"""
    exp = trained / "experiments" / "bi"
    f = tmp_path / "in.csv"
    f.write_text("sentence\nfine\n")
    args = ["predict", exp, f]
    expect = {"batch size 0": "--batch-size 0: expected a positive number",
              "threads -1": "--threads -1: expected a positive number",
              "batch size abc": "minbert predict: argument --batch-size: invalid int value: 'abc'",
              "sentence twice in a csv": f"{f}:1: column 'sentence' appears twice in the header; keep one",
              "sentence twice in a tsv": f"{tmp_path / 'in.tsv'}:1: column 'sentence' appears twice in the header",
              "a json key twice": f"{tmp_path / 'in.jsonl'}:2: key 'sentence' appears twice in the object; keep one",
              "out is a folder": f"{tmp_path}: is a folder; give --out a file name",
              "out under a file": f"{f / 'out.tsv'}: cannot write the predictions ({f} is a file, not a folder)"}[case]
    if case == "batch size 0":
        args += ["--batch-size", "0"]
    elif case == "threads -1":
        args += ["--threads", "-1"]
    elif case == "batch size abc":
        args += ["--batch-size", "abc"]
    elif case == "sentence twice in a csv":
        f.write_text("id,sentence,sentence\n1,a,b\n")
    elif case == "sentence twice in a tsv":
        (tmp_path / "in.tsv").write_text("sentence\tsentence\na\tb\n")
        args = ["predict", exp, tmp_path / "in.tsv"]
    elif case == "a json key twice":
        (tmp_path / "in.jsonl").write_text('{"sentence": "a"}\n{"sentence": "a", "sentence": "b"}\n')
        args = ["predict", exp, tmp_path / "in.jsonl"]
    elif case == "out is a folder":
        args += ["--out", tmp_path]
    else:
        args += ["--out", f / "out.tsv"]
    code, out, err = minbert_here(args, capsys)
    assert code == 2, (code, err)
    assert error_line(err).startswith("error: " + expect), err
    assert out == ""


def test_the_api_refuses_bad_batch_sizes_and_huge_texts(trained):
    from minbert.api import MAX_TEXT_CHARS, load_model

    with pytest.raises(Exception, match=r"^batch_size 0: expected a positive integer$"):
        load_model(trained / "experiments" / "bi", device="cpu", batch_size=0)
    m = load_model(trained / "experiments" / "bi", device="cpu")
    with pytest.raises(Exception, match=r"^sst: row 1: the text in column 'sentence' has 131,073 characters, more "
                                        r"than 131,072"):
        m.sentiment(["fine", "x" * (MAX_TEXT_CHARS + 1)])


@pytest.mark.parametrize("where", ["stdin", "file"])
def test_a_50_mb_line_is_refused_quickly_in_little_memory(trained, tmp_path, where):
    """A single line of 50 MB: one line naming it, in seconds and without gigabytes (issue 33, case 16)."""
    import resource
    import time

    line = "word " * 10_000_000 + "\n"
    args = ["predict", trained / "experiments" / "bi", tmp_path / "big.txt" if where == "file" else "-", "--format",
            "txt"]
    if where == "file":
        (tmp_path / "big.txt").write_text("fine\n" + line)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    r = minbert_cli(args, stdin=("fine\n" + line) if where == "stdin" else None)
    seconds = time.perf_counter() - t0
    assert r.returncode == 2, r.stderr[-2000:]
    name = "<stdin>" if where == "stdin" else str(tmp_path / "big.txt")
    assert error_line(r.stderr) == (f"error: {name}:2: the text in column 'sentence' has 50,000,000 characters, more "
                                f"than 131,072 (a broken line?); the model reads only its first few hundred word "
                                f"pieces: shorten it or split it into rows")
    assert seconds < 30
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mib < 2000 or peak_mib <= before / 1024, peak_mib


@pytest.mark.parametrize("device", ["tpu", "cuda:9", "CPU", "", None, 0])
def test_the_api_refuses_a_device_it_cannot_honour_as_the_command_does(lone_model, capsys, device):
    """`load_model(path, device="tpu")` gave a model on the CPU with no word (issue 51); the API and
    `minbert predict --device` now accept the same devices (minbert.core.devices.DEVICES), and refuse
    the others in one line before the model is read."""
    from minbert.api import load_model
    from minbert.core.devices import DEVICES
    from minbert.core.errors import MinBertError

    with pytest.raises(MinBertError) as e:
        load_model(lone_model, device=device)
    assert str(e.value) == f"device {device!r}: expected one of auto, cpu, cuda (auto: cuda when there is a GPU, " \
                           f"else cpu)"
    if isinstance(device, str):
        code, out, err = minbert_here(["predict", lone_model, "--device", device], capsys)
        assert code == 2 and "argument --device: invalid choice" in error_line(err)
    from minbert.cli import parse

    assert [parse(["predict", str(lone_model), "--device", d]).device for d in DEVICES] == list(DEVICES)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_the_api_refuses_cuda_without_a_gpu_in_one_line(lone_model):
    from minbert.api import load_model
    from minbert.core.errors import MinBertError

    with pytest.raises(MinBertError, match=r"^device 'cuda' was asked for but no CUDA GPU is available; use auto or "
                                           r"cpu$"):
        load_model(lone_model, device="cuda")


@pytest.mark.parametrize("threads", [-1, 0, 5000])
def test_a_thread_count_torch_cannot_take_is_one_line(lone_model, threads):
    """`minbert estimate --threads -1` ended in torch's traceback; every caller of set_threads (the
    stages, `minbert estimate`, the API) now gets one line."""
    from minbert.api import load_model
    from minbert.core.errors import MinBertError
    from minbert.core.runtime import set_threads

    with pytest.raises(MinBertError, match=rf"^threads {threads}: expected a whole number of CPU threads from 1 to "
                                           r"1024$"):
        set_threads(threads)
    with pytest.raises(MinBertError, match=rf"^threads {threads}: expected a"):
        load_model(lone_model, device="cpu", threads=threads)
