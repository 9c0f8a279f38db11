"""Readers, validation, prepared splits and downsampling."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from minbert.core.errors import MinBertError
from minbert.data.downsample import downsample, target_sizes
from minbert.data.raw import raw_path, read_cs224n, read_nli, split_by_group
from minbert.data.read import load_splits, read_split, write_split
from minbert.params import Downsample

# rows per file, from ../shared/data/README.md
README_COUNTS = {
    ("sst", "train"): 8544, ("sst", "dev"): 1101, ("sst", "test"): 2210,
    ("cfimdb", "train"): 1707, ("cfimdb", "dev"): 245, ("cfimdb", "test"): 488,
    ("sts", "train"): 6040, ("sts", "dev"): 863, ("sts", "test"): 1725,
    ("para", "train"): 14214, ("para", "dev"): 3000, ("para", "test"): 3000,
}


@pytest.mark.parametrize("task,split", sorted(README_COUNTS))
def test_reads_every_shared_file_with_readme_counts(shared_data, task, split):
    frame, report = read_cs224n(raw_path(shared_data / "cs224n", task, split), task,
                                labelled=split != "test", on_bad_rows="drop")
    assert report.read == README_COUNTS[task, split]
    assert report.kept == len(frame) == report.read - sum(report.dropped.values())
    assert frame["id"].is_unique
    if split == "test":
        assert frame["label"].isna().all()
    elif task == "sts":
        assert frame["label"].between(0, 5).all() and frame["label"].dtype == float
    else:
        assert set(frame["label"]) <= ({0, 1} if task in ("para", "cfimdb") else {0, 1, 2, 3, 4})


def test_quora_train_has_two_broken_rows(shared_data):
    """quora-train.csv really has a row without label and one without sentence2."""
    path = raw_path(shared_data / "cs224n", "para", "train")
    _, report = read_cs224n(path, "para", on_bad_rows="drop")
    assert report.dropped == {"missing_label": 1, "empty_text": 1}
    with pytest.raises(MinBertError, match=r"quora-train\.csv line 9624: column 'is_duplicate' is empty"):
        read_cs224n(path, "para", on_bad_rows="error")


def test_reads_snli_sample(shared_data):
    frame, report = read_nli(shared_data / "nli" / "snli-sample.jsonl")
    # the README's table says 2,526; the file holds 2,527 JSON lines, all with a gold label
    assert report.read == 2527 and report.kept == 2527 and not report.dropped
    assert set(frame["label"]) == {"entailment", "neutral", "contradiction"}
    assert frame["group"].nunique() == 852
    train, dev = split_by_group(frame, 0.1, seed=1)
    assert len(train) + len(dev) == 2527
    assert not set(train["group"]) & set(dev["group"])
    assert abs(dev["group"].nunique() - 85) <= 1
    again_train, _ = split_by_group(frame, 0.1, seed=1)
    assert again_train.equals(train)


# ---------------------------------------------------------------- bad rows and files

HEADER = "\tid\tsentence\tsentiment\n"


def _write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("row,reason,message", [
    ("1\tb\tfine film\t7\n", "bad_label", r"line 3: column 'sentiment' is '7', expected an integer in \{0, 1, 2, 3, 4\}"),
    ("1\tb\tfine film\t2.5\n", "bad_label", r"line 3: column 'sentiment' is '2.5'"),
    ("1\tb\tfine film\tgood\n", "bad_label", r"line 3: column 'sentiment' is 'good'"),
    ("1\tb\tfine film\t\n", "missing_label", r"line 3: column 'sentiment' is empty"),
    ("1\tb\t   \t3\n", "empty_text", r"line 3: column 'sentence' is empty"),
    ("1\tb\n", "field_count", r"line 3: 2 tab-separated fields, the header has 4"),
    ("1\t\tfine film\t3\n", "missing_id", r"line 3: column 'id' is empty"),
    ("1\ta\tanother film\t3\n", "duplicate_id", r"line 3: column 'id': a already appears on line 2"),
    ("1\tb\tfine\tfilm\t3\n", "field_count", r"line 3: 5 tab-separated fields, the header has 4"),
])
def test_each_bad_row_errors_or_is_dropped(tmp_path, row, reason, message):
    text = HEADER + "0\ta\ta good film\t3\n" + row + "2\tc\ta bad film\t0\n"
    path = _write(tmp_path, "ids-sst-train.csv", text)
    with pytest.raises(MinBertError, match=r"ids-sst-train\.csv " + message) as err:
        read_cs224n(path, "sst", on_bad_rows="error")
    assert "on_bad_rows: drop" in str(err.value) and "\n" not in str(err.value)
    frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
    assert report.as_dict()["dropped_by_reason"] == {reason: 1}
    assert (report.read, report.kept) == (3, 2)
    assert list(frame["id"]) == ["a", "c"]


def test_label_ranges_per_task(tmp_path):
    para = _write(tmp_path, "quora-train.csv", "\tid\tsentence1\tsentence2\tis_duplicate\n"
                  "0\ta\tq1\tq2\t1.0\n1\tb\tq1\tq3\t2\n")
    _, rep = read_cs224n(para, "para", on_bad_rows="drop")
    assert rep.dropped == {"bad_label": 1}
    sts = _write(tmp_path, "sts-train.csv", "\tid\tsentence1\tsentence2\tsimilarity\n"
                 "0\ta\ts1\ts2\t4.6\n1\tb\ts1\ts3\t5.2\n2\tc\ts1\ts4\t-0.1\n3\td\ts1\ts5\tnan\n")
    frame, rep = read_cs224n(sts, "sts", on_bad_rows="drop")
    assert rep.dropped == {"bad_label": 3} and frame["label"].tolist() == [4.6]
    imdb = _write(tmp_path, "ids-cfimdb-train.csv", HEADER + "0\ta\tgreat\t1\n1\tb\tmeh\t3\n")
    _, rep = read_cs224n(imdb, "cfimdb", on_bad_rows="drop")
    assert rep.dropped == {"bad_label": 1}


def test_encoding_errors(tmp_path):
    body = HEADER.encode() + b"0\ta\tgood film\t3\n1\tb\tcaf\xe9 film\t2\n"
    path = _write(tmp_path, "ids-sst-dev.csv", body)
    with pytest.raises(MinBertError, match=r"ids-sst-dev\.csv line 3: not UTF-8 text"):
        read_cs224n(path, "sst")
    frame, rep = read_cs224n(path, "sst", on_bad_rows="drop")
    assert rep.dropped == {"encoding": 1} and rep.read == 2 and len(frame) == 1
    latin_header = _write(tmp_path, "x.csv", "\tid\tsentence\tsentiment\xe9\n".encode("latin-1"))
    with pytest.raises(MinBertError, match="line 1: the header is not UTF-8"):
        read_cs224n(latin_header, "sst", on_bad_rows="drop")


def test_bad_files(tmp_path):
    with pytest.raises(MinBertError, match="file not found"):
        read_cs224n(tmp_path / "nope.csv", "sst")
    with pytest.raises(MinBertError, match="the file is empty"):
        read_cs224n(_write(tmp_path, "e.csv", ""), "sst")
    wrong = _write(tmp_path, "w.csv", "\tid\ttext\tlabel\n0\ta\tb\t1\n")
    with pytest.raises(MinBertError, match=r"w\.csv: missing column 'sentence'"):
        read_cs224n(wrong, "sst")
    # test-student files need no label column; labelled files do
    test = _write(tmp_path, "t.csv", "0\t\tid\tsentence\n1\t0.0\tx\thello\n")
    frame, _ = read_cs224n(test, "sst", labelled=False)
    assert frame.to_dict("records") == [{"id": "x", "sentence": "hello", "label": None}]
    with pytest.raises(MinBertError, match="missing column 'sentiment'"):
        read_cs224n(test, "sst")


def test_nli_bad_rows(tmp_path):
    good = {"captionID": "c1", "pairID": "p1", "sentence1": "A man.", "sentence2": "A person.",
            "gold_label": "entailment"}
    rows = [good, {**good, "pairID": "p2", "gold_label": "-"}, "{not json",
            {**good, "pairID": "p3", "gold_label": "maybe"}, {**good, "pairID": "p4", "sentence2": ""},
            {k: v for k, v in good.items() if k != "captionID"} | {"pairID": "p5"},
            {**good, "pairID": "p1"}, {**good, "captionID": None, "promptID": "m7", "pairID": "p6"}]
    text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    path = _write(tmp_path, "nli.jsonl", text)
    frame, rep = read_nli(path, on_bad_rows="drop")
    assert rep.dropped == {"no_gold_label": 1, "invalid_json": 1, "bad_label": 1, "empty_text": 1,
                           "missing_group": 1, "duplicate_id": 1}
    assert list(frame["id"]) == ["p1", "p6"] and rep.read == 8
    with pytest.raises(MinBertError, match=r"nli\.jsonl line 3: not valid JSON"):
        read_nli(path)


# ---------------------------------------------------------------- prepared splits


TRICKY_TEXTS = ['He said "null" twice', '"', '""', '"quoted whole"', 'a \\t backslash \\n', "NA", "null",
                "None", "nan", "#comment", "  leading and trailing  ", "caf\u00e9 \u6771\u4eac \U0001F600",
                "C1 \x96 and NEL \x85 and LS \u2028 kept", "=1+1", "'single'", "1e5", "-"]


def test_write_read_split_round_trip(tmp_path):
    n = len(TRICKY_TEXTS)
    frame = pd.DataFrame({"id": ["007", "NA"] + [f"i{i}" for i in range(n - 2)], "sentence": TRICKY_TEXTS,
                          "label": [i % 5 for i in range(n)]})
    write_split(frame, tmp_path / "sst-train.tsv")
    back = read_split(tmp_path / "sst-train.tsv")
    assert back["id"].tolist() == frame["id"].tolist() and back["sentence"].tolist() == TRICKY_TEXTS
    assert back["label"].dtype == np.int64 and back["label"].tolist() == frame["label"].tolist()
    # the readers never produce a tab or line break in a text; the writer refuses one
    for text in ("a\tb", "a\nb", "a\rb"):
        with pytest.raises(ValueError, match="tab or line break"):
            write_split(frame.assign(sentence=text), tmp_path / "sst-dev.tsv")
        assert not (tmp_path / "sst-dev.tsv").exists()
    pair = pd.DataFrame({"id": ["1", "2"], "sentence1": ['"a"', "NA"], "sentence2": ["null", "b\\"],
                         "label": [3.2, 0.1 + 0.2]})
    write_split(pair, tmp_path / "sts-train.tsv")
    back = read_split(tmp_path / "sts-train.tsv")
    assert back.equals(pair)                                   # floats exactly, texts as written
    write_split(frame.assign(label=None), tmp_path / "sst-test.tsv")
    assert read_split(tmp_path / "sst-test.tsv")["label"].isna().all()
    write_split(pd.DataFrame({"id": ["1"], "sentence1": ["a"], "sentence2": ["b"], "label": [3.2]}),
                tmp_path / "sts-dev.tsv")
    assert read_split(tmp_path / "sts-dev.tsv")["label"].tolist() == [3.2]
    with pytest.raises(MinBertError, match=r"sst-dev\.tsv: prepared split not found while other sst splits"):
        load_splits(tmp_path, "sst")
    assert set(load_splits(tmp_path, "sst", ("train", "test"))) == {"train", "test"}
    with pytest.raises(MinBertError, match="run the prepare stage first"):
        load_splits(tmp_path, "para")
    with pytest.raises(MinBertError, match="unknown task"):
        load_splits(tmp_path, "imdb")
    (tmp_path / "para-train.tsv").write_text("id\tx\n1\t2\n")
    with pytest.raises(MinBertError, match="re-run the prepare stage"):
        read_split(tmp_path / "para-train.tsv")


# ---------------------------------------------------------------- downsampling


def _frames(sizes):
    return {t: pd.DataFrame({"id": [f"{t}{i}" for i in range(n)], "label": range(n)}) for t, n in sizes.items()}


def test_target_sizes():
    sizes = {"sst": 8544, "para": 14212, "sts": 6040}
    assert target_sizes(sizes, Downsample()) == sizes
    assert target_sizes(sizes, Downsample(mode="smallest")) == {t: 6040 for t in sizes}
    assert target_sizes(sizes, Downsample(mode="fixed", size=7000)) == {"sst": 7000, "para": 7000, "sts": 6040}
    assert target_sizes(sizes, Downsample(caps={"para": 10000})) == {**sizes, "para": 10000}
    assert target_sizes(sizes, Downsample(mode="smallest", caps={"sst": 100})) == \
        {"sst": 100, "para": 6040, "sts": 6040}


def test_an_experiment_lifts_a_cap_of_its_base_with_null(tmp_path):
    from minbert.params import load_params

    params = {"base": {"model": "m", "finetune": {"downsample": {"mode": "none", "caps": {"para": 6040, "sst": 9}}}},
              "experiments": {"capped": {}, "all": {"finetune": {"downsample": {"caps": {"para": None}}}}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    exps = load_params(tmp_path / "params.yaml").experiments
    sizes = {"sst": 8544, "para": 14212, "sts": 6040}
    assert target_sizes(sizes, exps["capped"].finetune.downsample) == {"sst": 9, "para": 6040, "sts": 6040}
    assert target_sizes(sizes, exps["all"].finetune.downsample) == {"sst": 9, "para": 14212, "sts": 6040}


def test_downsample_is_seeded_stable_and_independent():
    frames = _frames({"sst": 500, "para": 900, "sts": 300})
    spec = Downsample(mode="smallest")
    a = downsample(frames, spec, seed=3)
    b = downsample(dict(reversed(list(frames.items()))), spec, seed=3)
    assert all(len(a[t]) == 300 for t in frames)
    assert all(a[t].equals(b[t]) for t in frames)                     # same seed, same rows, any dict order
    assert a["sts"] is frames["sts"]                                    # the smallest task is untouched
    assert not a["sst"].equals(downsample(frames, spec, seed=4)["sst"])  # another seed, other rows
    assert a["sst"]["label"].is_monotonic_increasing                    # original order kept
    # other tasks' content (not their sizes) does not matter
    shuffled = {**frames, "para": frames["para"].sample(frac=1, random_state=0)}
    assert downsample(shuffled, spec, seed=3)["sst"].equals(a["sst"])
    # a smaller sample is a subset of a larger one
    small = downsample(frames, Downsample(mode="fixed", size=100), seed=3)
    assert set(small["sst"]["id"]) <= set(a["sst"]["id"])
    assert downsample(frames, Downsample(), seed=3)["para"] is frames["para"]
