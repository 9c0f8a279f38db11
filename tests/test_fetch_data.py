"""fetch_data against a local fake of the Hub (no network)."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

import stages.fetch_data as fetch
from minbert.core.errors import MinBertError
from minbert.data.raw import raw_path, read_cs224n, read_nli


def _fake_hub(root):
    """Files laid out as the Hub datasets are (parquet shards, jsonl)."""
    sst = root / "SetFit/sst5"
    sst.mkdir(parents=True)
    for split, n in (("train", 6), ("validation", 3), ("test", 2)):
        pd.DataFrame({"text": [f"{split} film {i}" for i in range(n)], "label": [i % 5 for i in range(n)],
                      "label_text": ["x"] * n}).to_json(sst / f"{split}.jsonl", orient="records", lines=True)
    for task, cols, labels in (("qqp", ("question1", "question2"), [0, 1, 1, 0]),
                               ("stsb", ("sentence1", "sentence2"), [0.0, 2.5, 5.0, 3.2])):
        d = root / "nyu-mll/glue" / task
        d.mkdir(parents=True)
        for split in ("train", "validation", "test"):
            lab = [-1] * 4 if split == "test" else labels
            pd.DataFrame({cols[0]: [f"{split} a{i}" for i in range(4)], cols[1]: [f"{split} b{i}" for i in range(4)],
                          "label": lab, "idx": range(4)}).to_parquet(d / f"{split}-00000-of-00001.parquet")
    snli = root / "stanfordnlp/snli/plain_text"
    snli.mkdir(parents=True)
    pd.DataFrame({"premise": ["A man sits.", "A man sits.", "A dog runs.", "A dog runs."],
                  "hypothesis": ["A person sits.", "A man stands.", "An animal moves.", "A cat sleeps."],
                  "label": [0, 2, 0, -1]}).to_parquet(snli / "train-00000-of-00001.parquet")
    mnli = root / "nyu-mll/multi_nli"
    mnli.mkdir(parents=True)
    pd.DataFrame({"promptID": [7, 7], "pairID": ["7e", "7n"], "premise": ["P.", "P."],
                  "hypothesis": ["H1.", "H2."], "genre": ["fiction"] * 2,
                  "label": [0, 1]}).to_parquet(mnli / "train-00000-of-00001.parquet")


def test_fetch_writes_cs224n_layout(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    _fake_hub(hub)
    calls = []

    def fake_download(repo_id, patterns, cache_dir=None):
        calls.append((repo_id, patterns))
        return hub / repo_id

    monkeypatch.setattr(fetch, "download", fake_download)
    out = tmp_path / "out"
    fetch.main(["--out", str(out)])
    assert [c[0] for c in calls] == ["SetFit/sst5", "nyu-mll/glue", "nyu-mll/glue", "stanfordnlp/snli",
                                     "nyu-mll/multi_nli"]
    sst, rep = read_cs224n(raw_path(out, "sst", "train"), "sst")
    assert rep.read == 6 and sst["label"].tolist() == [0, 1, 2, 3, 4, 0]
    assert read_cs224n(raw_path(out, "sst", "dev"), "sst")[1].kept == 3
    assert read_cs224n(raw_path(out, "sst", "test"), "sst", labelled=False)[1].kept == 2
    para, _ = read_cs224n(raw_path(out, "para", "train"), "para")
    assert para["label"].tolist() == [0, 1, 1, 0] and para["sentence1"][0] == "train a0"
    sts, _ = read_cs224n(raw_path(out, "sts", "dev"), "sts")
    assert sts["label"].tolist() == [0.0, 2.5, 5.0, 3.2]
    test, _ = read_cs224n(raw_path(out, "sts", "test"), "sts", labelled=False)
    assert len(test) == 4
    with pytest.raises(MinBertError, match="missing column 'similarity'"):
        read_cs224n(raw_path(out, "sts", "test"), "sts")
    snli, rep = read_nli(out / "nli-snli.jsonl")
    assert rep.dropped == {"no_gold_label": 1} and snli["label"].tolist() == ["entailment", "contradiction", "entailment"]
    assert snli["group"].nunique() == 2
    mnli, _ = read_nli(out / "nli-mnli.jsonl")
    assert mnli["group"].tolist() == ["7", "7"] and mnli["id"].tolist() == ["7e", "7n"]
    assert json.loads((out / "nli-mnli.jsonl").read_text().splitlines()[0])["promptID"] == "7"


def test_offline_gives_one_line_advice(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(MinBertError, match="needs network access.*set data.dir") as err:
        fetch.main(["--out", str(tmp_path / "out"), "--datasets", "sst"])
    assert "\n" not in str(err.value)


def test_fetch_cli_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stages.fetch_data", "--out", str(tmp_path), "--datasets", "imdb"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown dataset 'imdb'" in proc.stderr
    # HF_HUB_OFFLINE makes the real client refuse to connect: same clear message, exit status 2
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "stages.fetch_data", "--out", str(tmp_path / "o"),
                           "--datasets", "stsb"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "needs network access" in proc.stderr, proc.stderr
