"""The prepare stage end to end: demo data, real data, bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import error_line

from minbert.data.read import load_splits
from stages.prepare import main

FILES = [f"{t}-{s}.tsv" for t in ("sst", "para", "sts") for s in ("train", "dev", "test")]


def _params(tmp_path, **data):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"experiments": {"a": {}}, "data": data}))
    return str(path)


def test_prepare_demo_data(tmp_path, repo_root, capsys):
    params = _params(tmp_path, dir=str(repo_root / "data/demo"),
                     nli_file=str(repo_root / "data/demo/nli-sample.jsonl"))
    out = tmp_path / "results" / "data"
    main(["--params", params, "--results", str(tmp_path / "results")])
    table = capsys.readouterr().out
    assert "sst-train.tsv" in table and "kept" in table
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["files"]) == set(FILES) | {"nli-train.tsv", "nli-dev.tsv"}
    assert summary["files"]["sst-train.tsv"] == {
        "source": str(repo_root / "data/demo/ids-sst-train.csv"), "rows_read": 600, "rows_kept": 600,
        "rows_dropped": 0, "dropped_by_reason": {}}
    nli = load_splits(out, "nli")
    assert len(nli["train"]) + len(nli["dev"]) == 600
    assert not set(nli["train"]["group"]) & set(nli["dev"]["group"])
    sts = load_splits(out, "sts")
    assert [len(sts[s]) for s in ("train", "dev", "test")] == [600, 200, 200]
    assert sts["test"]["label"].isna().all() and sts["train"]["label"].between(0, 5).all()
    assert (tmp_path / "results" / "runs" / "prepare.json").is_file()


def test_prepare_real_data_drop_and_error(tmp_path, shared_data):
    params = _params(tmp_path, dir=str(shared_data / "cs224n"), nli_file=None, on_bad_rows="drop",
                     include_cfimdb=True)
    out = tmp_path / "results" / "data"
    main(["--params", params, "--results", str(tmp_path / "results")])
    summary = json.loads((out / "summary.json").read_text())["files"]
    assert summary["para-train.tsv"]["rows_read"] == 14214
    assert summary["para-train.tsv"]["rows_dropped"] == 2
    assert summary["cfimdb-test.tsv"]["rows_kept"] == 488
    assert len(load_splits(out, "para")["train"]) == 14212
    # the default (error) names file, line and column, one line, exit status 2
    params = _params(tmp_path, dir=str(shared_data / "cs224n"), nli_file=None)
    proc = subprocess.run([sys.executable, "-m", "stages.prepare", "--params", params, "--results",
                           str(tmp_path / "strict")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "quora-train.csv line 9624: column 'is_duplicate' is empty" in proc.stderr
    assert not (tmp_path / "strict" / "data").exists()


@pytest.mark.parametrize("data,message", [
    ({"dir": "/nonexistent/folder"}, "data.dir: folder '/nonexistent/folder' not found"),
    ({"nli_dev_fraction": 1.5}, "data.nli_dev_fraction"),
    ({"on_bad_rows": "skip"}, "data.on_bad_rows"),
])
def test_prepare_bad_params(tmp_path, data, message, capsys):
    from minbert.entry import run

    with pytest.raises(SystemExit) as exit_:
        run(main, ["--params", _params(tmp_path, **data), "--results", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in error_line(err), err


def test_prepare_missing_file(tmp_path, repo_root):
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in (repo_root / "data/demo").glob("*.csv"):
        if not f.name.startswith("sts-dev"):
            (raw / f.name).write_bytes(f.read_bytes())
    params = _params(tmp_path, dir=str(raw), nli_file=None)
    from minbert.core.errors import MinBertError
    with pytest.raises(MinBertError, match=r"sts-dev\.csv: file not found"):
        main(["--params", params, "--results", str(tmp_path / "out")])
    params = _params(tmp_path, dir=str(repo_root / "data/demo"), nli_file=None, include_cfimdb=True)
    with pytest.raises(MinBertError, match="include_cfimdb: false"):
        main(["--params", params, "--results", str(tmp_path / "out")])
