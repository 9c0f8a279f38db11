"""Fault injection: every kind of broken input a user can meet, reproduced exactly.

Each case ends either in one line naming the file (and line or key) and what to do (a MinBertError;
exit status 2 through a stage CLI), or in a counted drop (data.on_bad_rows: drop); never a
traceback, never a silently wrong result, never a half-written or stale output.

Sections: CS224N reader, NLI reader, prepared splits, the prepare stage (outputs, full disk,
signals), params, model folders, training state, fetch_data, and the readers and writers of the
other stages (predictions, ensembles, the report, output paths).
"""
from __future__ import annotations

import csv
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, child_env, default_signals, error_line

from minbert.core.errors import MinBertError
from minbert.core.layout import Layout
from minbert.data.downsample import target_sizes
from minbert.data.raw import raw_path, read_cs224n, read_nli, unquote_field
from minbert.data.read import MAX_FIELD_CHARS, load_splits, read_split, write_split
from minbert.params import Downsample

DEMO = REPO / "data" / "demo"
SST_HEADER = "\tid\tsentence\tsentiment\n"
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
    return path


def _sst(tmp_path, rows: list[str], name="ids-sst-train.csv", header=SST_HEADER) -> Path:
    return _write(tmp_path / name, header + "".join(r if r.endswith("\n") else r + "\n" for r in rows))


def _one_line_error(fn, *args, pattern: str, **kwargs) -> str:
    with pytest.raises(MinBertError) as err:
        fn(*args, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert re.search(pattern, msg), msg
    return msg


def _demo_lines(name: str) -> list[str]:
    return (DEMO / name).read_text(encoding="utf-8").split("\n")


def _demo_copy(tmp_path, edit=None, folder="raw") -> Path:
    """A copy of the demo CS224N files; `edit(folder)` damages it."""
    raw = tmp_path / folder
    raw.mkdir(parents=True, exist_ok=True)
    for f in DEMO.glob("*.csv"):
        (raw / f.name).write_bytes(f.read_bytes())
    if edit is not None:
        edit(raw)
    return raw


def _params(tmp_path, name="params.yaml", **data) -> str:
    data = {"nli_file": None, "on_bad_rows": "error", **data}
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"data": data, "experiments": {"a": {}}}))
    return str(path)


def _cli(main, argv, capsys) -> tuple[int, str]:
    """Run a stage CLI as its __main__ does (minbert.entry.run); return (exit status, stderr)."""
    from minbert.entry import run

    old = signal.getsignal(signal.SIGTERM)
    try:
        run(main, argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        signal.signal(signal.SIGTERM, old)
    err = capsys.readouterr().err
    return code, err


def _assert_one_error_line(err: str, pattern: str) -> None:
    line = error_line(err)
    assert re.search(pattern, line), line


def _no_temporaries(folder: Path) -> None:
    left = [p for p in folder.rglob(".*.tmp")] if folder.exists() else []
    assert not left, left


# ================================================================ CS224N reader


def _stray_quote_file(tmp_path, close=True) -> Path:
    """The issue's case: a quote opened in the sentence on line 5 and (optionally) one closing it on line 10."""
    lines = _demo_lines("ids-sst-train.csv")
    f = lines[4].split("\t")
    f[2] = '"' + f[2]
    lines[4] = "\t".join(f)
    if close:
        f = lines[9].split("\t")
        f[2] = f[2] + '"'
        lines[9] = "\t".join(f)
    return _write(tmp_path / "ids-sst-train.csv", "\n".join(lines))


@pytest.mark.parametrize("mode", ["error", "drop"])
@pytest.mark.parametrize("close", [True, False], ids=["closed-on-line-10", "never-closed"])
def test_stray_quote_never_merges_rows(tmp_path, mode, close):
    path = _stray_quote_file(tmp_path, close)
    frame, report = read_cs224n(path, "sst", on_bad_rows=mode)
    assert (report.read, report.kept, report.dropped) == (600, 600, {})
    demo, _ = read_cs224n(DEMO / "ids-sst-train.csv", "sst")
    assert frame["id"].tolist() == demo["id"].tolist() and frame["label"].tolist() == demo["label"].tolist()
    assert frame["sentence"][3] == '"' + demo["sentence"][3]            # line 5: the quote is text
    if close:
        assert frame["sentence"][8] == demo["sentence"][8] + '"'
    assert not frame["sentence"].str.contains("\t").any()
    changed = (frame["sentence"] != demo["sentence"]).sum()
    assert changed == (2 if close else 1)


@pytest.mark.parametrize("field,text", [
    ('"a ""b"" c"', 'a "b" c'),            # csv-quoted text (how the CS224N files store quotes)
    ('"""Hi"""', '"Hi"'),
    ('""""', '"'),
    ('""', ""),
    ('"plain"', "plain"),
    ('"abc"def', '"abc"def'),              # not a well-formed quoted field: the quotes are text
    ('"abc', '"abc'),
    ('abc"', 'abc"'),
    ('a "b" c', 'a "b" c'),
    ('"a"b"', '"a"b"'),
    ('"""', '"""'),
    ('"', '"'),
])
def test_unquote_field(field, text):
    assert unquote_field(field) == text


def test_tab_inside_quotes_is_a_field_count_error(tmp_path):
    path = _sst(tmp_path, ["0\ta\tgood\t3", '1\tb\t"tab\tinside"\t2', "2\tc\tfine\t1"])
    _one_line_error(read_cs224n, path, "sst", pattern=r"ids-sst-train\.csv line 3: 5 tab-separated fields, "
                    r"the header has 4 \(a tab inside a quoted text is not allowed\)")
    _, report = read_cs224n(path, "sst", on_bad_rows="drop")
    assert report.dropped == {"field_count": 1} and report.kept == 2


@pytest.mark.parametrize("ending", ["\r", "\r\n", "\n"], ids=["CR-only", "CRLF", "LF"])
def test_line_endings(tmp_path, ending):
    text = (DEMO / "quora-dev.csv").read_text(encoding="utf-8").replace("\n", ending)
    path = _write(tmp_path / "quora-dev.csv", text)
    frame, report = read_cs224n(path, "para")
    reference, _ = read_cs224n(DEMO / "quora-dev.csv", "para")
    assert report.read == report.kept == 200
    assert frame.equals(reference)


def test_carriage_return_inside_a_line_is_a_bad_row(tmp_path):
    path = _sst(tmp_path, ["0\ta\tgood\t3", "1\tb\tmixed\rending\t2", "2\tc\tfine\t1"])
    _one_line_error(read_cs224n, path, "sst", pattern=r"line 3: the line holds a carriage return at character 10 \(mixed line endings\?\)")
    frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
    assert report.dropped == {"control_character": 1} and (report.read, report.kept) == (3, 2)


def test_nul_byte_is_a_bad_row(tmp_path):
    body = (SST_HEADER + "0\ta\tgood\t3\n1\tb\tnul\x00here\t2\n2\tc\tfine\t1\n").encode()
    path = _write(tmp_path / "ids-sst-dev.csv", body)
    _one_line_error(read_cs224n, path, "sst", pattern=r"ids-sst-dev\.csv line 3: the line holds a NUL byte")
    frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
    assert report.dropped == {"control_character": 1} and frame["id"].tolist() == ["a", "c"]
    # NUL in the header: the whole file is unusable
    _write(tmp_path / "h.csv", b"\tid\x00\tsentence\tsentiment\n0\ta\tb\t1\n")
    _one_line_error(read_cs224n, tmp_path / "h.csv", "sst", on_bad_rows="drop", pattern=r"line 1: the header holds a NUL")


@pytest.mark.parametrize("mode", ["error", "drop"])
def test_field_over_128_kb(tmp_path, mode):
    big = "x" * (MAX_FIELD_CHARS + 1)
    path = _sst(tmp_path, ["0\ta\tgood\t3", f"1\tb\t{big}\t2", "2\tc\tfine\t1"])
    if mode == "error":
        _one_line_error(read_cs224n, path, "sst", pattern=r"line 3: field 3 has 131,073 characters, more than 131,072")
    else:
        frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
        assert report.dropped == {"field_too_long": 1} and frame["id"].tolist() == ["a", "c"]
    # exactly at the limit is a text
    ok = _sst(tmp_path, ["0\ta\t" + "y" * MAX_FIELD_CHARS + "\t3"], name="ok.csv")
    assert len(read_cs224n(ok, "sst")[0]["sentence"][0]) == MAX_FIELD_CHARS


def test_encodings(tmp_path):
    text = (DEMO / "ids-sst-dev.csv").read_text(encoding="utf-8")
    reference, _ = read_cs224n(DEMO / "ids-sst-dev.csv", "sst")
    bom = _write(tmp_path / "bom.csv", b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert read_cs224n(bom, "sst")[0].equals(reference)
    for enc in ("utf-16", "utf-16-be"):
        p = _write(tmp_path / f"{enc}.csv", text.encode(enc) if enc == "utf-16" else b"\xfe\xff" + text.encode(enc))
        _one_line_error(read_cs224n, p, "sst", on_bad_rows="drop", pattern=r"the file is UTF-16 text; save it as UTF-8")
    latin = _write(tmp_path / "latin.csv", text.encode("utf-8") + "9\tz\tcaf\xe9\t1\n".encode("latin-1"))
    _one_line_error(read_cs224n, latin, "sst", pattern=r"latin\.csv line 202: not UTF-8 text at byte 7")
    assert read_cs224n(latin, "sst", on_bad_rows="drop")[1].dropped == {"encoding": 1}


def test_binary_junk_is_one_line(tmp_path):
    junk = _write(tmp_path / "sts-train.csv", bytes(range(256)) * 20)
    _one_line_error(read_cs224n, junk, "sts", on_bad_rows="drop", pattern=r"sts-train\.csv line 1: the header")
    safetensors = _write(tmp_path / "quora-train.csv", b"\x08\x00\x00\x00\x00\x00\x00\x00{}\n" + b"\x00" * 64)
    _one_line_error(read_cs224n, safetensors, "para", on_bad_rows="drop", pattern=r"quora-train\.csv line 1: the header")


def test_file_shapes(tmp_path):
    _one_line_error(read_cs224n, _write(tmp_path / "e.csv", ""), "sst", pattern=r"e\.csv: the file is empty")
    _one_line_error(read_cs224n, _write(tmp_path / "blank.csv", "\n\n  \n"), "sst", pattern=r"the file is empty")
    _one_line_error(read_cs224n, _write(tmp_path / "h.csv", SST_HEADER), "sst", on_bad_rows="drop",
                    pattern=r"h\.csv: the file has a header row but no data rows")
    comma = tmp_path / "comma.csv"
    pd.read_csv(DEMO / "ids-sst-dev.csv", sep="\t", index_col=0).to_csv(comma)
    _one_line_error(read_cs224n, comma, "sst", pattern=r"comma\.csv: missing column 'id' .*not tab-separated "
                    r"\(it looks comma-separated\)")
    dup = _write(tmp_path / "dup.csv", "\tid\tsentence\tsentiment\tsentence\n0\ta\tb\t1\tc\n")
    _one_line_error(read_cs224n, dup, "sst", pattern=r"dup\.csv line 1: column 'sentence' appears twice in the header")


def test_blank_lines_are_not_rows(tmp_path):
    path = _sst(tmp_path, ["0\ta\tgood\t3", "", "   ", "1\tb\tfine\t1", "", ""])
    frame, report = read_cs224n(path, "sst")
    assert (report.read, report.kept) == (2, 2) and frame["id"].tolist() == ["a", "b"]


def test_rows_need_exactly_the_header_fields(tmp_path):
    path = _sst(tmp_path, ["0\ta\tgood\t3", "1\tb\tfine", "2\tc\tok\t1\textra", "3\td\tyes\t2"])
    _one_line_error(read_cs224n, path, "sst", pattern=r"line 3: 3 tab-separated fields, the header has 4")
    frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
    assert report.dropped == {"field_count": 2} and frame["id"].tolist() == ["a", "d"]


@pytest.mark.parametrize("label,ok", [
    ("3", 3), ("3.0", 3), (" 2 ", 2), ("+1", 1), ("1e0", 1), ("-0", 0),
    ("1_0", None), ("\u0663", None), ("\uff13", None), ("nan", None), ("inf", None), ("-inf", None),
    ("0x1", None), ("True", None), ("3.5", None), ("5", None), ("-1", None), ("1e400", None),
])
def test_sst_label_parsing(tmp_path, label, ok):
    path = _sst(tmp_path, [f"0\ta\tgood\t{label}"])
    frame, report = read_cs224n(path, "sst", on_bad_rows="drop")
    if ok is None:
        assert report.dropped == {"bad_label": 1}
    else:
        assert frame["label"].tolist() == [ok] and frame["label"].dtype == "int64"


def test_sts_labels_are_finite_and_in_range(tmp_path):
    rows = [f"{i}\tid{i}\ts1\ts2\t{v}" for i, v in enumerate(["0", "5", "2.75", "5.0001", "-0.01", "nan", "inf", "1e-3"])]
    path = _write(tmp_path / "sts-dev.csv", "\tid\tsentence1\tsentence2\tsimilarity\n" + "\n".join(rows) + "\n")
    frame, report = read_cs224n(path, "sts", on_bad_rows="drop")
    assert frame["label"].tolist() == [0.0, 5.0, 2.75, 0.001] and report.dropped == {"bad_label": 4}


def test_duplicate_ids_name_both_lines(tmp_path):
    path = _sst(tmp_path, ["0\ta\tgood\t3", "1\tb\tfine\t1", "2\ta\tagain\t2"])
    _one_line_error(read_cs224n, path, "sst", pattern=r"line 4: column 'id': a already appears on line 2")


@pytest.mark.parametrize("kind", ["folder", "symlink loop", "dangling symlink", "permission denied", "missing"])
def test_unreadable_files(tmp_path, monkeypatch, kind):
    path = tmp_path / "ids-sst-dev.csv"
    expected = {"folder": r"is a folder; expected a file", "symlink loop": r"symlink loop",
                "dangling symlink": r"is a symlink to a missing file", "permission denied": r"permission denied",
                "missing": r"file not found"}[kind]
    if kind == "folder":
        path.mkdir()
    elif kind == "symlink loop":
        path.symlink_to(path.name)
    elif kind == "dangling symlink":
        path.symlink_to("nowhere.csv")
    elif kind == "permission denied":
        _write(path, SST_HEADER + "0\ta\tb\t1\n")
        path.chmod(0)
        if ROOT:   # root reads anything: make the read fail as it would for a user
            real = os.open

            def denied(name, *args, **kwargs):
                if Path(name) == path:
                    raise PermissionError(errno.EACCES, "Permission denied", str(name))
                return real(name, *args, **kwargs)

            monkeypatch.setattr(os, "open", denied)
    _one_line_error(read_cs224n, path, "sst", pattern=re.escape(str(path)) + ": " + expected)


def test_real_files_read_exactly_as_csv_quoting_does(shared_data):
    """The new reader keeps the same rows, ids, texts and labels as Python's csv module reading each
    line of the real files (none of their records spans lines); 2,103 of their rows hold a
    csv-quoted text, which a reader that treated every quote as text would have changed."""
    quoted = 0
    for task, prefix in (("sst", "ids-sst"), ("cfimdb", "ids-cfimdb"), ("para", "quora"), ("sts", "sts")):
        for split in ("train", "dev", "test"):
            path = raw_path(shared_data / "cs224n", task, split)
            frame, report = read_cs224n(path, task, labelled=split != "test", on_bad_rows="drop")
            header, *lines = path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")[:-1]
            assert report.read == len(lines)
            header = header.split("\t")
            raw_texts = ["sentence"] if task in ("sst", "cfimdb") else ["sentence1", "sentence2"]
            parsed = {r[header.index("id")]: r for r in csv.reader(lines, delimiter="\t")}
            assert len(parsed) == len(lines)          # one record per line, ids unique
            for row in frame.itertuples(index=False):
                ref = parsed[row.id]
                assert [getattr(row, c) for c in raw_texts] == [ref[header.index(c)].strip() for c in raw_texts]
            quoted += sum(any(unquote_field(f) != f for f in line.split("\t")) for line in lines)
            expected_drop = {"missing_label": 1, "empty_text": 1} if (task, split) == ("para", "train") else {}
            assert report.dropped == expected_drop
    assert quoted == 2103


def test_real_test_student_files_with_extra_column(shared_data):
    """ids-sst/cfimdb-test-student.csv: header `0<TAB><TAB>id<TAB>sentence` (an extra unnamed column);
    columns are found by name, so it does no harm."""
    for prefix, n in (("ids-sst", 2210), ("ids-cfimdb", 488)):
        path = shared_data / "cs224n" / f"{prefix}-test-student.csv"
        assert path.read_text(encoding="utf-8").split("\n")[0].split("\t") == ["0", "", "id", "sentence"]
        frame, report = read_cs224n(path, prefix.split("-")[1], labelled=False)
        assert report.kept == n and frame["label"].isna().all() and not frame["sentence"].str.match(r"^\s").any()


# ================================================================ NLI reader

NLI_GOOD = {"captionID": "c1", "pairID": "p1", "sentence1": "A man.", "sentence2": "A person.", "gold_label": "entailment"}


def _nli(tmp_path, rows, name="nli.jsonl") -> Path:
    return _write(tmp_path / name, "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")


@pytest.mark.parametrize("row,reason,message", [
    ({**NLI_GOOD, "pairID": "p2", "sentence1": 5}, "not_text", r"'sentence1' is int 5, not a string"),
    ({**NLI_GOOD, "pairID": "p2", "sentence2": ["a"]}, "not_text", r"'sentence2' is list"),
    ({**NLI_GOOD, "pairID": "p2", "sentence2": None}, "empty_text", r"'sentence2' is missing or empty"),
    ({**NLI_GOOD, "pairID": "p2", "sentence1": "nul\u0000"}, "control_character", r"'sentence1' holds a NUL"),
    ({**NLI_GOOD, "pairID": "p2", "sentence1": "x" * (MAX_FIELD_CHARS + 1)}, "field_too_long", r"'sentence1' has 131,073 characters, more than 131,072"),
    ({**NLI_GOOD, "pairID": "p2", "captionID": ["c"]}, "missing_group", r"no 'captionID' \(SNLI\) or 'promptID'"),
    ({**NLI_GOOD, "pairID": "p2", "captionID": True}, "missing_group", r"no 'captionID'"),
    ({**NLI_GOOD, "pairID": "p2", "gold_label": 1}, "bad_label", r"'gold_label' is 1"),
    ({**NLI_GOOD, "pairID": "p2", "gold_label": ["neutral"]}, "bad_label", r"'gold_label' is \['neutral'\]"),
    ({**NLI_GOOD, "pairID": 2.5}, "missing_id", r"'pairID' is 2.5"),
    ({**NLI_GOOD, "pairID": ""}, "missing_id", r"'pairID' is ''"),
    ("[" * 100000, "invalid_json", r"not valid JSON \(nested too deeply\)"),
    ("NaN", "invalid_json", r"expected a JSON object per line"),
    ('{"a": 1', "invalid_json", r"not valid JSON"),
])
def test_nli_bad_rows(tmp_path, row, reason, message):
    path = _nli(tmp_path, [NLI_GOOD, row, {**NLI_GOOD, "pairID": "p3"}])
    _one_line_error(read_nli, path, pattern=r"nli\.jsonl line 2: " + message)
    frame, report = read_nli(path, on_bad_rows="drop")
    assert report.dropped == {reason: 1} and frame["id"].tolist() == ["p1", "p3"]


def test_nli_text_whitespace_and_ids(tmp_path):
    rows = [{**NLI_GOOD, "sentence1": "A\tman\non a\r\nbike.", "captionID": 0, "pairID": 7},
            {**NLI_GOOD, "captionID": None, "promptID": 12, "pairID": "p2"}, "", "   "]
    frame, report = read_nli(_nli(tmp_path, rows))
    assert frame["sentence1"][0] == "A man on a  bike." and frame["group"].tolist() == ["0", "12"]
    assert frame["id"].tolist() == ["7", "p2"] and report.read == 2
    # the prepared split round-trips what the reader returns
    write_split(frame, tmp_path / "nli-train.tsv")
    assert read_split(tmp_path / "nli-train.tsv").equals(frame)


def test_nli_has_no_header_line(tmp_path):
    """A bad first line of a jsonl file is a bad row like any other (there is no header)."""
    path = _write(tmp_path / "nli.jsonl", b"\xff not utf-8\n\x00{}\n" + json.dumps(NLI_GOOD).encode() + b"\n")
    _one_line_error(read_nli, path, pattern=r"nli\.jsonl line 1: not UTF-8 text at byte 0")
    frame, report = read_nli(path, on_bad_rows="drop")
    assert report.dropped == {"encoding": 1, "control_character": 1} and (report.read, report.kept) == (3, 1)


def test_nli_file_shapes(tmp_path):
    _one_line_error(read_nli, _write(tmp_path / "e.jsonl", ""), pattern=r"e\.jsonl: the file is empty")
    _one_line_error(read_nli, tmp_path, pattern=r"is a folder; expected a file")
    _one_line_error(read_nli, _write(tmp_path / "u.jsonl", "\ufeff".encode("utf-16")), on_bad_rows="drop",
                    pattern=r"UTF-16")


# ================================================================ prepared splits (results/data)


def _prepared(tmp_path, name="sst-train.tsv", body="id\tsentence\tlabel\na\tgood\t3\nb\tbad\t0\n") -> Path:
    return _write(tmp_path / name, body)


@pytest.mark.parametrize("body,pattern", [
    ("", r"the file is empty"),
    ("id\ttext\tlabel\na\tb\t1\n", r"columns \['id', 'text', 'label'\], expected \['id', 'sentence', 'label'\]"),
    ("id\tsentence\tlabel\na\tgood\n", r"line 2: 2 tab-separated fields, expected 3"),
    ("id\tsentence\tlabel\na\tgo\tod\t3\n", r"line 2: 4 tab-separated fields, expected 3"),
    ("id\tsentence\tlabel\r\na\tgood\t3\r\n", r"columns \['id', 'sentence', 'label\\r'\]"),
    ("id\tsentence\tlabel\na\tgood\tx\n", r"line 2: label 'x' is not an integer in \{0, 1, 2, 3, 4\}"),
    ("id\tsentence\tlabel\na\tgood\tnan\n", r"line 2: label 'nan' is not"),
    ("id\tsentence\tlabel\na\tgood\t7\n", r"line 2: label '7' is not"),
    ("id\tsentence\tlabel\na\tgood\t3\nb\tbad\t\n", r"line 3: no label while other rows have one"),
    ("id\tsentence\tlabel\na\tgood\t3\na\tbad\t1\n", r"line 3: id a appears twice"),
    ("id\tsentence\tlabel\n\tgood\t3\n", r"line 2: column 'id' is empty"),
    ("id\tsentence\tlabel\na\t \t3\n", r"line 2: column 'sentence' is empty"),
])
def test_broken_prepared_split(tmp_path, body, pattern):
    path = _prepared(tmp_path, body=body)
    msg = _one_line_error(read_split, path, pattern=pattern)
    assert "re-run the prepare stage" in msg


def test_prepared_split_bytes_and_paths(tmp_path):
    _one_line_error(read_split, _prepared(tmp_path, body=b"id\tsentence\tlabel\na\t\xff\t1\n"),
                    pattern=r"sst-train\.tsv line 2: not UTF-8 text \(byte 20 of the file\); re-run the prepare stage")
    (tmp_path / "sts-dev.tsv").mkdir()
    _one_line_error(read_split, tmp_path / "sts-dev.tsv", pattern=r"sts-dev\.tsv: is a folder")
    _one_line_error(read_split, tmp_path / "para-dev.tsv", pattern=r"prepared split not found; run the prepare stage")
    _one_line_error(read_split, _prepared(tmp_path, "imdb-train.tsv"), pattern=r"cannot tell the task")
    labels = _prepared(tmp_path, "sts-train.tsv", "id\tsentence1\tsentence2\tlabel\na\tx\ty\t5.5\n")
    _one_line_error(read_split, labels, pattern=r"label '5.5' is not a number from 0 to 5")
    nli = _prepared(tmp_path, "nli-dev.tsv", "id\tgroup\tsentence1\tsentence2\tlabel\na\tg\tx\ty\tmaybe\n")
    _one_line_error(read_split, nli, pattern=r"label 'maybe' is not one of entailment, neutral, contradiction")


def test_partly_prepared_folder_is_an_error(tmp_path):
    for split in ("train", "test"):
        write_split(pd.DataFrame({"id": ["a"], "sentence1": ["x"], "sentence2": ["y"], "label": [1]}),
                    tmp_path / f"para-{split}.tsv")
    _one_line_error(load_splits, tmp_path, "para", ("train", "dev"),
                    pattern=r"para-dev\.tsv: prepared split not found while other para splits are there")
    assert list(load_splits(tmp_path, "para", ("train",))) == ["train"]


def test_negative_cap_is_refused_not_applied():
    # validation refuses a negative cap (test_params_negative_cap); downsampling, given one anyway,
    # must not quietly keep all but the last rows
    spec = Downsample.model_construct(mode="none", size=None, caps={"sst": -5})
    with pytest.raises(MinBertError, match=r"downsample\.caps\.sst: -5 is not a number of rows"):
        target_sizes({"sst": 100}, spec)


@pytest.mark.parametrize("damage", ["truncated", "cut-end", "garbage", "empty", "zip-junk", "negative-lengths"])
def test_corrupt_token_cache_is_tokenised_again(tmp_path, minilm_dir, damage):
    import numpy as np

    from minbert.data.encode import encode_cached
    from minbert.model.tokenizer import Tokenizer

    tok = Tokenizer(minilm_dir, 32)
    texts = [f"sentence number {i}" for i in range(50)]
    first = encode_cached(tok, texts, cache_dir=tmp_path)
    (cache,) = tmp_path.glob("*.npz")
    data = cache.read_bytes()
    if damage == "negative-lengths":
        with open(cache, "wb") as f:
            np.savez(f, lengths=-np.ones(50, dtype=np.int64), ids=np.zeros(0, np.int32), types=np.zeros(0, np.int8))
    else:
        cache.write_bytes({"truncated": data[:len(data) // 2], "cut-end": data[:-10], "garbage": os.urandom(200),
                           "empty": b"", "zip-junk": b"PK\x03\x04" + os.urandom(100)}[damage])
    assert encode_cached(tok, texts, cache_dir=tmp_path) == first
    assert encode_cached(tok, texts, cache_dir=tmp_path) == first     # and the cache was rewritten


# ================================================================ the prepare stage


def _prepare_main():
    from stages.prepare import main

    return main


def test_prepare_stray_quote_exits_0_and_keeps_every_row(tmp_path, capsys):
    raw = _demo_copy(tmp_path, lambda d: _stray_quote_file(d))
    code, _ = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(raw)), "--results",
                                     str(tmp_path / "results")], capsys)
    assert code == 0
    summary = json.loads((tmp_path / "results" / "data" / "summary.json").read_text())
    assert summary["files"]["sst-train.tsv"]["rows_kept"] == 600
    assert len(read_split(tmp_path / "results" / "data" / "sst-train.tsv")) == 600


@pytest.mark.parametrize("damage,pattern", [
    (lambda d: (d / "ids-sst-train.csv").write_bytes((d / "ids-sst-train.csv").read_bytes().replace(b"\n", b"\r")),
     None),
    (lambda d: (d / "sts-dev.csv").write_text(
        (d / "sts-dev.csv").read_text().replace("\t4.", "\t4." + "9" * (MAX_FIELD_CHARS + 10), 1)),
     r"sts-dev\.csv line \d+: field 5 has 131,0\d\d characters"),
    (lambda d: (d / "quora-train.csv").write_text((d / "quora-train.csv").read_text().replace("\t1.0\n", "\t1.0\x00\n", 1)),
     r"quora-train\.csv line \d+: the line holds a NUL byte"),
    (lambda d: (d / "sts-test-student.csv").write_bytes(b""), r"sts-test-student\.csv: the file is empty"),
    (lambda d: (d / "ids-sst-dev.csv").write_text(SST_HEADER), r"ids-sst-dev\.csv: the file has a header row but no data"),
    (lambda d: (d / "quora-dev.csv").write_text((d / "quora-dev.csv").read_text().replace("\t0.0\n", "\tmaybe\n", 1)),
     r"quora-dev\.csv line \d+: column 'is_duplicate' is 'maybe'"),
], ids=["CR-only", "field-over-128KB", "NUL", "empty", "header-only", "bad-label"])
def test_prepare_bad_data_is_one_line_and_leaves_no_output(tmp_path, capsys, damage, pattern):
    raw = _demo_copy(tmp_path, damage)
    results = tmp_path / "results"
    # a previous successful run's output must not survive next to a failed run's
    _write(results / "data" / "summary.json", "{}")
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(raw)), "--results", str(results)], capsys)
    if pattern is None:   # CR-only line endings are read like any other
        assert code == 0, err
        assert len(read_split(results / "data" / "sst-train.tsv")) == 600
        return
    assert code == 2
    _assert_one_error_line(err, pattern + r".*on_bad_rows: drop" if "line" in pattern else pattern)
    assert not (results / "data").exists()
    _no_temporaries(results)


def test_prepare_drop_mode_counts_what_it_drops(tmp_path, capsys):
    def damage(d):
        lines = (d / "ids-sst-train.csv").read_text().split("\n")
        lines[3] = lines[3] + "\x00"
        lines[4] = lines[4].rsplit("\t", 1)[0] + "\t" + "x" * (MAX_FIELD_CHARS + 1)
        lines[5] = lines[5].rsplit("\t", 1)[0]
        (d / "ids-sst-train.csv").write_text("\n".join(lines))
    raw = _demo_copy(tmp_path, damage)
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(raw), on_bad_rows="drop"), "--results",
                                       str(tmp_path / "r")], capsys)
    assert code == 0, err
    files = json.loads((tmp_path / "r" / "data" / "summary.json").read_text())["files"]
    assert files["sst-train.tsv"]["dropped_by_reason"] == {"control_character": 1, "field_too_long": 1,
                                                          "field_count": 1}
    assert files["sst-train.tsv"]["rows_read"] == 600 and files["sst-train.tsv"]["rows_kept"] == 597


def test_prepare_full_disk_names_the_path(tmp_path, capsys, monkeypatch):
    """A write that fails with ENOSPC (which names no file) says where the space ran out."""
    import minbert.data.prepare as prepare_module

    real = prepare_module.write_split
    calls = []

    def full_disk(frame, path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(frame, path)

    monkeypatch.setattr(prepare_module, "write_split", full_disk)
    results = tmp_path / "results"
    _write(results / "data" / "old.tsv", "stale")
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(DEMO)), "--results", str(results)], capsys)
    assert code == 2
    _assert_one_error_line(err, r"^error: no space left on " + re.escape(str(results / "data")) +
                           r"; free some space \(or point --results elsewhere\) and run again$")
    assert not (results / "data").exists()
    _no_temporaries(results)


def test_full_disk_at_rename_and_in_a_nested_temporary(tmp_path, capsys, monkeypatch):
    from minbert.core.io import atomic_path

    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(
        OSError(errno.EDQUOT, "Disk quota exceeded", str(src))))
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(DEMO)), "--results",
                                       str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"no space left on " + re.escape(str(tmp_path / "r" / "data" / "sst-train.tsv")))
    monkeypatch.undo()
    # a file inside a temporary folder is named by its final path
    with pytest.raises(OSError) as e:
        with atomic_path(tmp_path / "out") as tmp:
            tmp.mkdir()
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "inner.tsv"))
    assert e.value.filename == str(tmp_path / "out" / "inner.tsv")
    _no_temporaries(tmp_path)


def _slow_prepare(tmp_path):
    """A prepare run caught in the middle of its work: after writing the CS224N splits into its
    temporary folder it reads and parses a large NLI file (180,000 pairs, the demo's repeated under
    new ids), so a signal sent then arrives while it reads, every time. (A FIFO would block it
    forever, but prepare refuses one: it is not a regular file.)"""
    nli = tmp_path / "nli.jsonl"
    lines = (DEMO / "nli-sample.jsonl").read_text(encoding="utf-8").splitlines()
    with open(nli, "w", encoding="utf-8") as f:
        for copy in range(300):
            f.write("".join(ln.replace('ID": "demo', f'ID": "c{copy}demo') + "\n" for ln in lines))
    results = tmp_path / "results"
    _write(results / "data" / "summary.json", "{}")       # a previous run's output
    params = _params(tmp_path, dir=str(DEMO), nli_file=str(nli))
    proc = subprocess.Popen([sys.executable, "-m", "stages.prepare", "--params", params, "--results", str(results)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    deadline = time.time() + 120
    while not list(results.glob(".data.*.tmp/sts-test.tsv")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "prepare never got to the NLI file"
        time.sleep(0.05)
    return proc, results, nli


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,line", [(signal.SIGTERM, 128 + signal.SIGTERM, None),
                                           (signal.SIGINT, 130, "interrupted")])
def test_prepare_interrupted_by_a_signal(tmp_path, sig, code, line):
    proc, results, nli = _slow_prepare(tmp_path)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert [x for x in err.splitlines() if x.strip()] == ([line] if line else [])
    assert not (results / "data").exists()             # neither the old output nor a half-written new one
    _no_temporaries(results)


@pytest.mark.slow
def test_killed_prepare_leaves_a_temporary_that_the_next_run_removes(tmp_path, capsys):
    """SIGKILL cannot be caught: the temporary folder stays, never the output; the next run of the job
    deletes it before it starts (minbert.pipeline.runinfo.running -> minbert.core.io.clean_stale_temporaries)."""
    proc, results, nli = _slow_prepare(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert list(results.glob(".data.*.tmp")) and not (results / "data").exists()
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, "again.yaml", dir=str(DEMO)), "--results",
                                       str(results)], capsys)
    assert code == 0, err
    _no_temporaries(results)
    assert len(read_split(results / "data" / "sst-train.tsv")) == 600


# ================================================================ params (validated before anything runs)


@pytest.mark.parametrize("text,pattern", [
    ("data: {dir: x\nexperiments: {a: {}}\n", r"params\.yaml line 2, column \d+: not valid YAML"),
    ("experiments:\n  a: {}\n  a: {}\n", r"params\.yaml line 3: key 'a' is given twice in one mapping \(first on line 2\)"),
    ("experiments: {a: {seed: 9223372036854775808}}\n", r"key 'experiments\.a\.seed': .*less than or equal to 4294967295"),
    ("experiments: {a: {seed: -1}}\n", r"key 'experiments\.a\.seed'"),
    (f"experiments: {{{'x' * 300}: {{}}}}\n", r"experiment name 'x{40}\.\.\.' has 300 characters; .*keep them to 100"),
    ("experiments: {a: {max_length: 100000}}\n", r"key 'experiments\.a\.max_length'"),
    ("- a\n", r"expected a mapping at the top level"),
    ("", r"expected a mapping at the top level"),
    ("experiments: {a: {finetune: {lr: .nan}}}\n", r"key 'experiments\.a\.finetune\.lr'"),
    ("data: {dir: " + str(DEMO) + ", on_bad_rows: skip}\nexperiments: {a: {}}\n", r"key 'data\.on_bad_rows'"),
    ("experiments: {a: {finetune: {epoch: 3}}}\n", r"unknown key 'experiments\.a\.finetune\.epoch' \(did you mean 'epochs'\?\)"),
], ids=["yaml-syntax", "duplicate-key", "seed-beyond-2**63", "seed-negative", "300-char-name", "max_length",
        "a-list", "empty", "lr-nan", "on_bad_rows", "typo"])
def test_bad_params_are_one_line(tmp_path, capsys, text, pattern):
    params = _write(tmp_path / "params.yaml", text)
    code, err = _cli(_prepare_main(), ["--params", str(params), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, pattern)
    assert not (tmp_path / "r").exists()


def test_params_file_problems(tmp_path, capsys):
    code, err = _cli(_prepare_main(), ["--params", str(tmp_path / "none.yaml"), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"none\.yaml: parameter file not found")
    bad = _write(tmp_path / "bin.yaml", b"\xff\xfe\x00junk")
    code, err = _cli(_prepare_main(), ["--params", str(bad), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"bin\.yaml: not UTF-8 text")
    (tmp_path / "dir.yaml").mkdir()
    code, err = _cli(_prepare_main(), ["--params", str(tmp_path / "dir.yaml"), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"dir\.yaml: ")


@pytest.mark.parametrize("data,pattern", [
    ({"dir": "__FILE__"}, r"data\.dir: folder '.*params\.yaml' not found"),
    ({"dir": str(DEMO), "nli_file": "__DIR__"}, r": is a folder; expected a file"),
    ({"dir": str(DEMO), "nli_file": "/nonexistent/nli.jsonl"}, r"/nonexistent/nli\.jsonl: file not found"),
])
def test_prepare_bad_data_paths(tmp_path, capsys, data, pattern):
    data = {k: (str(tmp_path / "params.yaml") if v == "__FILE__" else str(tmp_path) if v == "__DIR__" else v)
            for k, v in data.items()}
    params = _params(tmp_path, **data)
    code, err = _cli(_prepare_main(), ["--params", params, "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, pattern)


def test_nli_with_one_premise_group(tmp_path, capsys):
    rows = [{**NLI_GOOD, "pairID": f"p{i}"} for i in range(3)]
    params = _params(tmp_path, dir=str(DEMO), nli_file=str(_nli(tmp_path, rows)))
    code, err = _cli(_prepare_main(), ["--params", params, "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"data\.nli_file: the NLI data has 1 premise group\(s\)")


# ================================================================ model folders


def _model(tmp_path, tiny_model_dir, name="model", config: dict | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _load(folder):
    from minbert.model.weights import load_encoder

    return load_encoder(folder)


@pytest.mark.parametrize("change,pattern", [
    ({"num_attention_heads": 5}, r"num_attention_heads 5 does not divide hidden_size 32"),
    ({"num_attention_heads": 0}, r"num_attention_heads is 0, expected a positive integer"),
    ({"hidden_size": "32"}, r"hidden_size is '32', expected a positive integer"),
    ({"hidden_size": 32.0}, r"hidden_size is 32\.0, expected a positive integer"),
    ({"num_hidden_layers": True}, r"num_hidden_layers is True"),
    ({"intermediate_size": -64}, r"intermediate_size is -64"),
    ({"vocab_size": None}, r"vocab_size is None"),
    ({"max_position_embeddings": 0}, r"max_position_embeddings is 0"),
    ({"type_vocab_size": -1}, r"type_vocab_size is -1"),
    ({"layer_norm_eps": 0}, r"layer_norm_eps is 0, expected a number in \(0, 1\)"),
    ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob is 1\.5"),
    ({"attention_probs_dropout_prob": "0.1"}, r"attention_probs_dropout_prob is '0\.1'"),
    ({"pad_token_id": 99999}, r"pad_token_id is 99999, expected an integer from 0 to vocab_size - 1"),
    ({"hidden_act": "swish"}, r"hidden_act 'swish' is not supported"),
    ({"model_type": "roberta"}, r"model_type 'roberta' is not supported"),
    ({"vocab_size": 10**12}, r"config\.json: vocab_size is 1000000000000, more than any BERT has \(at most 1048576\)"),
    ({"vocab_size": 1000}, r"model\.safetensors: tensor 'embeddings\.word\.weight' has shape \(30522, 32\), config\.json "
                           r"implies \(1000, 32\)"),
])
def test_bad_config_json(tmp_path, tiny_model_dir, change, pattern):
    folder = _model(tmp_path, tiny_model_dir, config=change)
    msg = _one_line_error(_load, folder, pattern=pattern)
    assert str(folder) in msg


@pytest.mark.parametrize("content,pattern", [
    ("[1, 2]", r"config\.json: expected a JSON object of settings, found list"),
    ("{", r"config\.json: not valid JSON"),
    (b"\xff\xfe{}", r"config\.json: not UTF-8 text"),
    ("[" * 100000, r"config\.json: not valid JSON"),
    ("__DIR__", r"config\.json: is a folder; expected a config file"),
])
def test_unreadable_config_json(tmp_path, tiny_model_dir, content, pattern):
    folder = _model(tmp_path, tiny_model_dir)
    (folder / "config.json").unlink()
    if content == "__DIR__":
        (folder / "config.json").mkdir()
    else:
        _write(folder / "config.json", content)
    _one_line_error(_load, folder, pattern=pattern)


def test_weights_files(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file, save_file

    folder = _model(tmp_path, tiny_model_dir, "truncated")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    _one_line_error(_load, folder, pattern=r"model\.safetensors: cannot be read as safetensors .*download it again")
    (folder / "model.safetensors").write_bytes(b"")
    _one_line_error(_load, folder, pattern=r"model\.safetensors: cannot be read as safetensors")

    for name, edit, pattern in [
        ("nan", lambda t: t.index_fill_(1, torch.tensor([0]), float("nan")), r"holds NaN or infinite values"),
        ("inf", lambda t: t.index_fill_(1, torch.tensor([0]), float("inf")), r"holds NaN or infinite values"),
        ("int", lambda t: t.to(torch.int32), r"has dtype torch\.int32, expected floating point"),
    ]:
        folder = _model(tmp_path, tiny_model_dir, name)
        sd = load_file(str(folder / "model.safetensors"))
        key = "encoder.layer.0.output.dense.weight"
        sd[key] = edit(sd[key].clone())
        save_file(sd, str(folder / "model.safetensors"))
        _one_line_error(_load, folder, pattern=r"model\.safetensors: tensor '" + re.escape(key) + "' " + pattern)
    # half-precision weights are fine (cast on load)
    folder = _model(tmp_path, tiny_model_dir, "half")
    sd = {k: v.half() for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file(sd, str(folder / "model.safetensors"))
    assert _load(folder)[0].embeddings.word.weight.dtype == torch.float32


def test_bin_checkpoints(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    folder = _model(tmp_path, tiny_model_dir, "bin")
    sd = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({**sd, "extra": 3}, folder / "pytorch_model.bin")
    _one_line_error(_load, folder, pattern=r"pytorch_model\.bin: 'extra' is a int, not a tensor")
    torch.save({**sd, 7: torch.zeros(1)}, folder / "pytorch_model.bin")
    _one_line_error(_load, folder, pattern=r"pytorch_model\.bin: key 7 is not a tensor name")
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 truncated zip")
    _one_line_error(_load, folder, pattern=r"pytorch_model\.bin: cannot be loaded safely")
    (folder / "pytorch_model.bin").unlink()
    (folder / "model.safetensors.index.json").write_text("{}")
    _one_line_error(_load, folder, pattern=r"holds a sharded checkpoint \(model\.safetensors\.index\.json\)")


def test_model_paths(tmp_path, tiny_model_dir):
    from minbert.model.weights import model_folder

    _one_line_error(model_folder, str(tiny_model_dir / "config.json"), pattern=r"is a file; give the folder")
    folder = _model(tmp_path, tiny_model_dir)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("model.safetensors")
    _one_line_error(_load, folder, pattern=r"model\.safetensors: symlink loop")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    _one_line_error(_load, folder, pattern=r"model\.safetensors: is a folder")


def test_tokenizer_larger_than_the_embedding(tmp_path, tiny_model_dir):
    from minbert.model.tokenizer import Tokenizer

    folder = _model(tmp_path, tiny_model_dir)
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["model"]["vocab"]["zzznewtoken"] = 30522                 # one id past the 30,522-row embedding
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    _one_line_error(Tokenizer, folder, 32, pattern=re.escape(str(folder)) + r": the tokenizer has token ids up to "
                    r"30522, but config\.json says vocab_size 30522: .*use the tokenizer files that came with these weights")
    # vocab.txt only: 30,523 lines
    (folder / "tokenizer.json").unlink()
    with open(folder / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("zzznewtoken\n")
    _one_line_error(Tokenizer, folder, 32, pattern=r"token ids up to 30522")
    # a smaller vocabulary than the embedding is fine (padded embedding matrices are common)
    small = _model(tmp_path, tiny_model_dir, "bigger-embedding", config={"vocab_size": 40000})
    assert Tokenizer(small, 32).vocab_size == 30522


def test_max_length_beyond_position_embeddings(tmp_path):
    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import packaged_minilm_folder, save_hf_folder

    folder = tmp_path / "short"
    cfg = BertConfig(vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16)
    save_hf_folder(folder, BertModel(cfg), tokenizer_folder=packaged_minilm_folder())
    assert Tokenizer(folder, 16).max_length == 16
    _one_line_error(Tokenizer, folder, 32, pattern=r"max_length 32 is more than the model's max_position_embeddings 16 "
                    r"\(config\.json\); set max_length to at most 16")


def test_type_vocab_size_1_cannot_read_pairs(tmp_path):
    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import packaged_minilm_folder, save_hf_folder

    folder = tmp_path / "single"
    cfg = BertConfig(vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, type_vocab_size=1)
    save_hf_folder(folder, BertModel(cfg), tokenizer_folder=packaged_minilm_folder())
    tok = Tokenizer(folder, 32)
    assert tok.encode(["one sentence"])
    _one_line_error(tok.encode, ["a"], ["b"], pattern=r"type_vocab_size is 1, so the model cannot read sentence pairs")


@pytest.mark.parametrize("files,pattern", [
    ({"vocab.txt": b"\x89PNG\r\n\x1a\n\x00\x00"}, r"vocab\.txt: not UTF-8 text"),
    ({"vocab.txt": "\n\n"}, r"vocab\.txt: the vocabulary is empty"),
    ({"vocab.txt": "__COPY__", "tokenizer_config.json": '{"do_lower_case": "false"}'},
     r"tokenizer_config\.json: do_lower_case is 'false', expected true or false"),
    ({"vocab.txt": "__COPY__", "tokenizer_config.json": "[]"}, r"tokenizer_config\.json: expected a JSON object"),
    ({"tokenizer.json": '{"version": "1.0"}'}, r"tokenizer\.json: cannot be read by the tokenizers library"),
    ({"tokenizer.json": b"\xff\xfe"}, r"tokenizer\.json: not UTF-8 text"),
    ({"tokenizer.json": "__DIR__"}, r"tokenizer\.json: is a folder"),
])
def test_broken_tokenizer_files(tmp_path, minilm_dir, files, pattern):
    from minbert.model.tokenizer import Tokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    for name, content in files.items():
        if content == "__COPY__":
            (folder / name).write_bytes((minilm_dir / name).read_bytes())
        elif content == "__DIR__":
            (folder / name).mkdir()
        else:
            _write(folder / name, content)
    _one_line_error(Tokenizer, folder, 32, pattern=pattern)


# ================================================================ training state (slow: real CLI runs)


def _finetune_params(tmp_path, tiny_model_dir, epochs=1) -> str:
    params = {"data": {"dir": str(DEMO), "nli_file": None},
              "base": {"model": str(tiny_model_dir), "device": "cpu", "max_length": 32, "threads": 1,
                       "finetune": {"epochs": epochs, "batch_size": 8, "max_steps_per_epoch": 2,
                                    "downsample": {"mode": "fixed", "size": 32}}},
              "experiments": {"a": {}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)


@pytest.mark.slow
def test_corrupt_or_foreign_last_pt_starts_fresh(tmp_path, tiny_model_dir):
    params = _finetune_params(tmp_path, tiny_model_dir)
    results = tmp_path / "results"
    env = child_env()
    run = [sys.executable, "-m", "stages.prepare", "--params", params, "--results", str(results)]
    assert subprocess.run(run, cwd=REPO, capture_output=True, env=env).returncode == 0
    state = results / "state" / "finetune" / "a"
    for content in (os.urandom(200), None):
        state.mkdir(parents=True, exist_ok=True)
        if content is None:
            torch.save({"format": "something else"}, state / "last.pt")
        else:
            (state / "last.pt").write_bytes(content)
        # --force: the finished outputs of the first round would otherwise be kept, and nothing run
        proc = subprocess.run([sys.executable, "-m", "stages.finetune", "--experiment", "a", "--params", params,
                               "--results", str(results), "--force"], cwd=REPO, capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert re.search(r"last\.pt cannot be resumed \(.*\); starting fresh", proc.stderr), proc.stderr
        assert (results / "experiments" / "a" / "finetune" / "model.pt").is_file()
        assert not state.exists()


@pytest.mark.slow
def test_sigterm_during_finetune_keeps_the_state_and_resumes(tmp_path, tiny_model_dir):
    """SIGTERM (what Slurm and the engines send) stops training like Ctrl-C: exit 143, no traceback, no
    model.pt, the last finished epoch's state kept; the next run resumes from it."""
    params = _finetune_params(tmp_path, tiny_model_dir, epochs=6)
    results = tmp_path / "results"
    env = child_env()
    prep = [sys.executable, "-m", "stages.prepare", "--params", params, "--results", str(results)]
    assert subprocess.run(prep, cwd=REPO, capture_output=True, env=env).returncode == 0
    cmd = [sys.executable, "-m", "stages.finetune", "--experiment", "a", "--params", params, "--results", str(results)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    last = results / "state" / "finetune" / "a" / "last.pt"
    deadline = time.time() + 300
    while not last.is_file():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("training finished before the signal arrived")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert last.is_file() and not (results / "experiments" / "a" / "finetune" / "model.pt").exists()
    _no_temporaries(results)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    assert re.search(r"resuming from .*last\.pt at phase 0 epoch [1-5]", again.stderr), again.stderr
    assert (results / "experiments" / "a" / "finetune" / "model.pt").is_file() and not last.exists()


# ================================================================ fetch_data


def test_fetch_data_texts_with_tabs_and_newlines(tmp_path, monkeypatch):
    import stages.fetch_data as fetch

    hub = tmp_path / "hub" / "SetFit" / "sst5"
    hub.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        pd.DataFrame({"text": ["a\tb", 'he said "hi"\nthen left', '"quoted whole"', None],
                      "label": [0, 1, 2, 3]}).to_json(hub / f"{split}.jsonl", orient="records", lines=True)
    monkeypatch.setattr(fetch, "download", lambda repo_id, patterns, cache_dir=None: tmp_path / "hub" / repo_id)
    out = tmp_path / "out"
    fetch.main(["--out", str(out), "--datasets", "sst"])
    frame, report = read_cs224n(raw_path(out, "sst", "train"), "sst", on_bad_rows="drop")
    assert frame["sentence"].tolist() == ["a b", 'he said "hi" then left', '"quoted whole"']
    assert report.dropped == {"empty_text": 1}


def test_fetch_data_bad_downloads_and_out(tmp_path, monkeypatch):
    import stages.fetch_data as fetch

    hub = tmp_path / "hub" / "nyu-mll" / "glue" / "stsb"
    hub.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        (hub / f"{split}-00000-of-00001.parquet").write_bytes(b"<html>rate limited</html>")
    monkeypatch.setattr(fetch, "download", lambda repo_id, patterns, cache_dir=None: tmp_path / "hub" / repo_id)
    _one_line_error(fetch.main, ["--out", str(tmp_path / "o"), "--datasets", "stsb"],
                    pattern=r"train-00000-of-00001\.parquet: the downloaded file cannot be read .*run fetch_data again")
    _one_line_error(fetch.main, ["--out", str(tmp_path / "hub" / "nyu-mll" / "glue" / "stsb" /
                                              "train-00000-of-00001.parquet"), "--datasets", "stsb"],
                    pattern=r"--out: .* is a file; give a folder")


# ================================================================ the other stages' readers and writers


def _predictions(tmp_path, task="sst", edit=None, name=None) -> Path:
    """A predictions folder with one valid <task>-dev.csv (as the predict stage writes it)."""
    folder = tmp_path / "predictions"
    folder.mkdir(exist_ok=True)
    rows = [{"id": f"i{i}", "sentence": f"s{i}", "label": i % 5, "prediction": (i + 1) % 5,
             **{f"prob_{k}": 0.2 for k in range(5)}} for i in range(20)]
    frame = pd.DataFrame(rows).astype(str)
    if edit is not None:
        frame = edit(frame)
    path = folder / (name or f"{task}-dev.csv")
    if isinstance(frame, bytes):
        path.write_bytes(frame)
    else:
        frame.to_csv(path, index=False)
    return folder


def _evaluate(folder):
    from minbert.scoring.evaluate import evaluate_folder

    return evaluate_folder(folder)


def test_predictions_binary_junk(tmp_path):
    folder = _predictions(tmp_path, edit=lambda f: bytes(range(128, 256)) * 4)
    _one_line_error(_evaluate, folder, pattern=r"sst-dev\.csv: ")


def test_predictions_header_only(tmp_path):
    folder = _predictions(tmp_path, edit=lambda f: f.head(0))
    _one_line_error(_evaluate, folder, pattern=r"sst-dev\.csv: .*no rows")


@pytest.mark.parametrize("value", ["inf", "2.5", "7"])
def test_predictions_out_of_range(tmp_path, value):
    def edit(f):
        f.loc[3, "prediction"] = value
        return f
    _one_line_error(_evaluate, _predictions(tmp_path, edit=edit), pattern=r"sst-dev\.csv: (line|row) 5")


@pytest.mark.parametrize("value", ["1e9", "-1.15", "5.01"])
def test_similarity_predictions_outside_the_label_range_are_refused(tmp_path, value):
    """The model clips its scores to 0-5 where it writes them (minbert.model.outputs); a score outside
    was not written by the pipeline, and is never scored as it is (issue 33, case 9)."""
    folder = tmp_path / "predictions"
    folder.mkdir()
    frame = pd.DataFrame({"id": [f"t{i}" for i in range(20)], "sentence1": "a", "sentence2": "b",
                          "label": [i / 4 for i in range(20)], "prediction": [i / 4 for i in range(20)]}).astype(str)
    frame.loc[3, "prediction"] = value
    frame.to_csv(folder / "sts-dev.csv", index=False)
    _one_line_error(_evaluate, folder, pattern=rf"sts-dev\.csv: line 5: prediction '{re.escape(value)}' is not a sts "
                                               rf"prediction \(from 0 to 5\); re-run the stage that wrote it")


@pytest.mark.parametrize("value", ["x", "9"])
def test_predictions_bad_label(tmp_path, value):
    def edit(f):
        f.loc[3, "label"] = value
        return f
    _one_line_error(_evaluate, _predictions(tmp_path, edit=edit), pattern=rf"sst-dev\.csv: (line|row) 5.*'{value}'")


def test_predictions_id_na_stays_text(tmp_path):
    from minbert.scoring.evaluate import read_predictions

    def edit(f):
        f.loc[3, "id"] = "NA"
        return f
    folder = _predictions(tmp_path, edit=edit)
    assert read_predictions(folder / "sst-dev.csv", "sst")["id"][3] == "NA"


def test_predictions_file_is_a_folder(tmp_path):
    folder = _predictions(tmp_path)
    (folder / "para-dev.csv").mkdir()
    _one_line_error(_evaluate, folder, pattern=r"para-dev\.csv: ")


def test_results_is_a_file(tmp_path, capsys):
    results = _write(tmp_path / "results", "not a folder")
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(DEMO)), "--results", str(results)], capsys)
    assert code == 2
    _assert_one_error_line(err, re.escape(str(results)))


def test_params_negative_cap(tmp_path, capsys):
    params = _write(tmp_path / "p.yaml", "experiments: {a: {finetune: {downsample: {caps: {sst: -5}}}}}\n")
    code, err = _cli(_prepare_main(), ["--params", str(params), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"caps")


@pytest.mark.parametrize("override", ["{finetune: {lr: .inf}}", "{finetune: {task_weights: {sst: -1}}}",
                                      "{finetune: {task_weights: {sst: .nan}}}"])
def test_params_non_finite_or_negative_floats(tmp_path, capsys, override):
    params = _write(tmp_path / "p.yaml", f"experiments: {{a: {override}}}\n")
    code, err = _cli(_prepare_main(), ["--params", str(params), "--results", str(tmp_path / "r")], capsys)
    assert code == 2
    _assert_one_error_line(err, r"experiments\.a\.finetune\.")


def test_prepare_raw_file_is_a_folder(tmp_path, capsys):
    raw = _demo_copy(tmp_path, lambda d: ((d / "sts-dev.csv").unlink(), (d / "sts-dev.csv").mkdir()))
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(raw)), "--results", str(tmp_path / "r")],
                     capsys)
    assert code == 2
    _assert_one_error_line(err, r"sts-dev\.csv: is a folder")


def test_report_broken_history(tmp_path):
    from minbert.report.data import load_history

    path = _write(tmp_path / "history.csv", bytes(range(128, 256)))
    _one_line_error(load_history, path, pattern=r"history\.csv")


def test_an_input_inside_a_folder_the_stage_replaces_is_refused_before_anything_is_deleted(tmp_path, capsys):
    """Raw data fetched into results/data (data.dir, data.nli_file there, or a link to it): prepare
    would delete it before reading it; refused, nothing deleted (issue 33, case 2)."""
    results = tmp_path / "results"
    shutil.copytree(DEMO, results / "data")
    before = sorted(p.name for p in (results / "data").iterdir())
    (tmp_path / "link").symlink_to(results / "data")
    cases = [{"dir": str(results / "data")}, {"dir": str(tmp_path / "link")},
             {"dir": str(DEMO), "nli_file": str(results / "data" / "nli-sample.jsonl")}]
    for data in cases:
        code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, **data), "--results", str(results)], capsys)
        assert code == 2
        _assert_one_error_line(err, r"^error: \S+: an input of prepare lies inside " + re.escape(str(results / "data"))
                               + r", which prepare deletes and writes anew; move the input out of ")
        assert sorted(p.name for p in (results / "data").iterdir()) == before
    # the planner refuses too: an engine deletes a job's outputs before the job itself could check
    from minbert.pipeline.plan import pipeline

    with pytest.raises(MinBertError, match=r"an input of prepare lies inside .*, which prepare deletes"):
        pipeline(_params(tmp_path, dir=str(results / "data")), Layout(str(results)))
    assert sorted(p.name for p in (results / "data").iterdir()) == before
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(DEMO)), "--results", str(results)], capsys)
    assert code == 0, err


def test_a_dev_file_that_overlaps_the_train_file_is_warned_about(tmp_path, capsys):
    """The dev file a copy of the train file (or largely overlapping it): the log and summary.json say
    how many rows are shared, and the report repeats it on every page (issue 33, case 3)."""
    def copy_train(d):
        (d / "sts-dev.csv").write_bytes((d / "sts-train.csv").read_bytes())
        lines = (d / "ids-sst-train.csv").read_text().split("\n")
        dev = (d / "ids-sst-dev.csv").read_text().split("\n")
        (d / "ids-sst-dev.csv").write_text("\n".join(dev[:1] + [f"x{k}" + ln[ln.index("\t"):] if ln else ln
                                                                for k, ln in enumerate(lines[1:41])] + dev[41:]))
    raw = _demo_copy(tmp_path, copy_train)
    results = tmp_path / "results"
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(raw)), "--results", str(results)], capsys)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if "WARNING" in ln]
    assert len(warnings) == 2, err
    assert f"{raw / 'sts-dev.csv'}: 600 of 600 dev rows (100%) are also in the train file {raw / 'sts-train.csv'}" \
        in warnings[1]
    assert f"{raw / 'ids-sst-dev.csv'}: 40 of 200 dev rows (20%) are also in the train file" in warnings[0]
    files = json.loads((results / "data" / "summary.json").read_text())["files"]
    assert files["sts-dev.tsv"]["overlap_with_train"]["rows"] == 600 and files["sts-dev.tsv"]["overlap_with_train"]["warn"]
    assert files["para-dev.tsv"]["overlap_with_train"] == {**files["para-dev.tsv"]["overlap_with_train"], "rows": 0,
                                                           "warn": False}
    # the demo files themselves share nothing worth a warning
    code, err = _cli(_prepare_main(), ["--params", _params(tmp_path, dir=str(DEMO)), "--results", str(results)], capsys)
    assert code == 0 and "WARNING" not in err
