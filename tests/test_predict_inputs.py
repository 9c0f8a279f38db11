"""One contract for `minbert predict` and `minbert.api` (issues 37 and 40): the API refuses what the
command refuses, with the same message (minbert.scoring.inputs checks both: the command names the
file and line, the API the task and row), and answers an empty input with an empty frame; a blank
row is an error in every input format, as in a .txt; a command's options go anywhere among its
arguments."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import error_line, minbert_in_process as minbert

from minbert.core.errors import MinBertError

LONG = "x" * 131073


@pytest.fixture(scope="module")
def model(lone_model):
    from minbert.api import load_model

    return load_model(lone_model, device="cpu", precision="fp32")


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# what `minbert predict` reads (a file, its name, the line at fault, extra arguments), what the API is
# given (a method and its argument, the row at fault: None where the header is at fault), and the
# message both must give after the place they name
CASES = {
    "blank text": ("in.csv", "sentence\nfine\n   \n", 3, [], ("sentiment", ["fine", "   "]), 1,
                   "empty text in column 'sentence'; fill it or remove the row"),
    "null text": ("in.jsonl", _jsonl([{"sentence": "fine"}, {"sentence": None}]), 2, [],
                  ("sentiment", ["fine", None]), 1, "empty text in column 'sentence'; fill it or remove the row"),
    "NaN text": ("in.jsonl", _jsonl([{"sentence": "fine"}, {"id": "2"}]), 2, [],
                 ("sentiment", ["fine", float("nan")]), 1,
                 "empty text in column 'sentence'; fill it or remove the row"),
    "a number as text": ("in.jsonl", _jsonl([{"sentence": 3}]), 1, [], ("sentiment", [3]), 0,
                         "the text in column 'sentence' is an int ('3'), not a string; give every text as a string"),
    "an empty pair text": ("in.tsv", "sentence1\tsentence2\na\tb\nc\t\n", 3, ["--task", "sts"],
                           ("similarity", [("a", "b"), ("c", "")]), 1,
                           "empty text in column 'sentence2'; fill it or remove the row"),
    "a text too long": ("in.csv", f"sentence\nfine\n{LONG}\n", 3, [], ("sentiment", ["fine", LONG]), 1,
                        ("the text in column 'sentence' has 131,073 characters, more than 131,072 (a broken line?); "
                         "the model reads only its first few hundred word pieces: shorten it or split it into rows")),
    "a pair column missing": ("in.csv", "sentence1,other\na,b\n", None, ["--task", "para"],
                              ("predict", pd.DataFrame({"sentence1": ["a"], "other": ["b"]})), None,
                              ("para reads sentence pairs but the input has no column 'sentence2' (columns: "
                               "sentence1, other); name the columns sentence1 and sentence2")),
    "a pair file for sst": ("in.csv", "sentence1,sentence2\na,b\n", None, ["--task", "sst"],
                            ("predict", pd.DataFrame({"sentence1": ["a"], "sentence2": ["b"]})), None,
                            ("sst reads one sentence per row, but this is a pair file (sentence1, sentence2); give a "
                             "'sentence' column, or ask for a pair task (para, sts)")),
    "a column twice": ("in.csv", "sentence,sentence\na,b\n", None, [],
                       ("predict", pd.DataFrame([["a", "b"]], columns=["sentence", "sentence"])), None,
                       "column 'sentence' appears twice in the header; keep one"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_api_refuses_what_the_command_refuses_with_the_same_message(lone_model, model, tmp_path, capsys, case):
    name, text, line, args, (method, given), row, message = CASES[case]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, out, err = minbert(["predict", lone_model, path, *args], capsys)
    assert code == 2 and out == ""
    assert error_line(err) == f"error: {path}:{line or 1}: {message}"
    task = {"sentiment": "sst", "similarity": "sts"}.get(method) or (args[1] if args else "sst")
    call = (lambda: model.predict(task, given)) if method == "predict" else (lambda: getattr(model, method)(given))
    with pytest.raises(MinBertError) as e:
        call()
    assert str(e.value) == (f"{task}: row {row}: {message}" if row is not None else f"{task}: {message}")


def test_the_api_refuses_what_is_no_list_of_texts_or_pairs(model):
    for call, pattern in [(lambda: model.sentiment(None), r"^sst: expected a text or a list of texts, not NoneType$"),
                          (lambda: model.paraphrase([("a", "b"), ("c",)]),
                           r"^para: row 1: expected a pair \(sentence1, sentence2\), got 1 items; give sentence pairs"),
                          (lambda: model.similarity(["a", "b"]), r"^sts: row 0: expected a pair .*, got a str;"),
                          (lambda: model.similarity(7), r"^sts: expected a list of \(sentence1, .* pairs, not int$"),
                          (lambda: model.predict("sst", 7), r"^sst: expected a pandas DataFrame with the task's "
                                                            r"columns or a list of texts, not int$"),
                          (lambda: model.predict("para", ["a"]), r"^para: row 0: expected a pair .*, got a str;"),
                          (lambda: model.embed(["fine", ""]), r"^embed: row 1: empty text in column 'sentence'"),
                          (lambda: model.embed([b"bytes"]), r"^embed: row 0: the text in column 'sentence' is a byt")]:
        with pytest.raises(MinBertError, match=pattern) as e:
            call()
        assert "\n" not in str(e.value)


def test_the_api_answers_an_empty_input_with_an_empty_frame(model):
    for method, one in (("sentiment", ["A gripping film."]), ("paraphrase", [("a b", "a c")]),
                        ("similarity", [("a b", "a c")])):
        full = getattr(model, method)(one)
        for empty in ([], (), pd.Series([], dtype=object)):
            got = getattr(model, method)(empty)
            assert len(got) == 0 and list(got.columns) == list(full.columns), method
            assert dict(got.dtypes) == dict(full.dtypes), method
    got = model.predict("sst", pd.DataFrame({"sentence": []}))
    assert list(got.columns) == ["prediction", "class"] + [f"prob_{k}" for k in range(5)] and len(got) == 0
    assert model.embed([]).shape == (0, model.embed(["a"]).shape[1])


@pytest.mark.parametrize("fmt", ["csv one column", "csv quoted", "csv two columns", "tsv", "jsonl", "jsonl value",
                                 "txt"])
def test_a_blank_row_is_an_error_in_every_format(lone_model, tmp_path, capsys, fmt):
    """An empty `""` row of a one-column CSV was dropped silently where a blank line of a .txt is an
    error (issue 40): one rule for every format, the file and the line named."""
    name, text, line, column = {
        "csv one column": ("in.csv", "sentence\nfine\n\ngood\n", 3, "sentence"),
        "csv quoted": ("in.csv", 'sentence\nfine\n""\ngood\n', 3, "sentence"),
        "csv two columns": ("in.csv", "id,sentence\n1,fine\n\n3,good\n", 3, "sentence"),
        "tsv": ("in.tsv", "sentence1\tsentence2\na\tb\n\nc\td\n", 3, "sentence1"),
        "jsonl": ("in.jsonl", '{"sentence": "fine"}\n\n{"sentence": "good"}\n', 2, "sentence"),
        "jsonl value": ("in.jsonl", '{"sentence": "fine"}\n{"sentence": ""}\n', 2, "sentence"),
        "txt": ("in.txt", "fine\n\ngood\n", 2, "sentence"),
    }[fmt]
    path = tmp_path / name
    path.write_text(text)
    code, out, err = minbert(["predict", lone_model, path], capsys)
    assert code == 2 and out == ""
    assert error_line(err) == f"error: {path}:{line}: empty text in column '{column}'; fill it or remove the row"


def test_options_go_anywhere_among_the_arguments(lone_model, tmp_path, capsys):
    """`minbert predict MODEL --task sst pairs.csv` (issue 40): argparse alone stops at an option
    between two positional arguments when the second is optional."""
    path = tmp_path / "single.csv"
    path.write_text("sentence\nA gripping film.\nDull.\n")
    outputs = []
    for args in (["--task", "sst", lone_model, path], [lone_model, "--task", "sst", path],
                 [lone_model, path, "--task", "sst"], [lone_model, "-q", path, "--task", "sst"]):
        code, out, err = minbert(["predict", *args], capsys)
        assert code == 0, err
        outputs.append(out)
    assert len(set(outputs)) == 1 and outputs[0].startswith("sentence\tsst_label\tsst_class\tsst_prob_0")
    out_file = tmp_path / "o.tsv"
    code, _, err = minbert(["predict", lone_model, "--out", out_file, path, "--task", "sst"], capsys)
    assert code == 0 and out_file.read_text() == outputs[0], err
    code, _, err = minbert(["predict", lone_model, path, "--bogus"], capsys)      # still one line for a typo
    assert code == 2 and re.fullmatch(r"error: minbert predict: unrecognized arguments: --bogus; see minbert predict "
                                      r"--help", err.strip()), err


@pytest.mark.numbers
@pytest.mark.parametrize("precision", [None, "fp32"])
def test_the_api_predicts_what_the_command_predicts(lone_model, tmp_path, capsys, precision):
    """The checks changed the API's input handling, not its numbers: the same rows give the same
    columns and values through the command and the API, with their defaults (`auto`: bf16 where it
    is native) and with a precision given to both. The same batches in the same precision: the same
    numbers, but for the six decimals a JSON Lines output keeps."""
    from minbert.api import load_model

    path = tmp_path / "pairs.jsonl"
    pairs = [("A man plays a guitar.", "A man is playing music."), ("a b c", "d e f"), ("x", "x y z")]
    path.write_text(_jsonl([{"id": i, "sentence1": a, "sentence2": b} for i, (a, b) in enumerate(pairs)]))
    given = ["--precision", precision] if precision else []
    code, out, err = minbert(["predict", lone_model, path, "--task", "para", "--task", "sts", *given], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == ["0", "1", "2"]
    api = load_model(lone_model, precision=precision)
    para, sts = api.paraphrase(pairs), api.similarity(pairs)
    assert [r["para_label"] for r in rows] == para["prediction"].tolist()
    np.testing.assert_allclose([r["para_prob_1"] for r in rows], para["prob_1"], rtol=0, atol=5e-7 + 1e-9)
    np.testing.assert_allclose([r["sts_score"] for r in rows], sts["prediction"], rtol=0, atol=5e-7 + 1e-9)
