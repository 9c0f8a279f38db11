"""Output paths that are not plain files (issue 37): an output is written to a temporary sibling and
renamed over its target, which must never replace what the target is. A FIFO or a character device
(/dev/null, /dev/stdout) is written through, a symlink's target gets the content and the link stays,
a block device or a socket is refused in one line; a folder output refuses anything but a folder; no
command writes over a file it reads. Every command that writes a path the user names is checked:
`minbert predict --out`, `minbert submission --out/--zip`, the report's `--out`, `fetch_data --out`.

/dev/null itself is written only where the tests run as root (where the bug would have replaced it);
a private character device made with mknod stands for it there, a FIFO and a symlink everywhere.
conftest's `devices_intact` checks after every test that the machine's /dev/null, /dev/stdout and
/dev/stderr are what they were."""
from __future__ import annotations

import io
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, child_env, error_line, minbert_in_process as minbert
from test_evaluate import write_predictions

from minbert.core.errors import MinBertError
from minbert.core.io import torch_save, write_text
from minbert.entry import run

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="only root can replace a device node (the bug needs root)")


def private_null(folder: Path) -> Path:
    """A character device of our own with /dev/null's numbers (mknod: root only)."""
    path = folder / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


class Reader:
    """A thread reading a FIFO to its end, as `cat fifo` would."""

    def __init__(self, fifo: Path):
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(fifo,), daemon=True)
        self.thread.start()

    def _read(self, fifo):
        with open(fifo, "rb") as f:
            self.data = f.read()

    def result(self) -> bytes:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        return self.data


def fifo(tmp_path, name="out.fifo") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def the_kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return next(k for k, test in (("link", stat.S_ISLNK), ("fifo", stat.S_ISFIFO), ("char", stat.S_ISCHR),
                                  ("file", stat.S_ISREG), ("folder", stat.S_ISDIR), ("socket", stat.S_ISSOCK))
                if test(mode))


# ---------------------------------------------------------------- the atomic writer itself

def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    path = fifo(tmp_path)
    reader = Reader(path)
    write_text(path, "one\ntwo\n")
    assert reader.result() == b"one\ntwo\n" and the_kind(path) == "fifo"
    reader = Reader(path)
    torch_save({"x": 1}, path)                         # a binary writer too
    assert reader.result()[:2] == b"PK" and the_kind(path) == "fifo"
    assert not list(tmp_path.glob(".*.tmp"))


@as_root
def test_a_character_device_is_written_through_never_replaced(tmp_path):
    null = private_null(tmp_path)
    write_text(null, "predictions\n")
    assert the_kind(null) == "char" and os.stat(null).st_rdev == os.makedev(1, 3)
    write_text("/dev/null", "predictions\n")
    assert the_kind(Path("/dev/null")) == "char"


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "real" / "out.tsv"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.tsv"
    link.symlink_to(target)
    write_text(link, "new\n")
    assert the_kind(link) == "link" and os.readlink(link) == str(target) and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.tsv"
    dangling.symlink_to(tmp_path / "real" / "made.tsv")      # as a shell's `>` does: the target is created
    write_text(dangling, "made\n")
    assert the_kind(dangling) == "link" and (tmp_path / "real" / "made.tsv").read_text() == "made\n"
    if ROOT:                                                # a link to a device: the device gets it
        null_link = tmp_path / "null.tsv"
        null_link.symlink_to(private_null(tmp_path))
        write_text(null_link, "x")
        assert the_kind(null_link) == "link" and the_kind(tmp_path / "null") == "char"
    assert not list(tmp_path.rglob(".*.tmp"))


def test_a_link_to_this_process_stdout_writes_to_stdout(tmp_path):
    """/dev/stdout names the process's own stdout: a file the shell opened (`> out.txt`) gets the
    output at its place (appended with `>>`), never a file put over it."""
    log = tmp_path / "log.txt"
    log.write_text("before\n")
    code = "from minbert.core.io import write_text; print('first', flush=True); write_text('/dev/stdout', 'out\\n')"
    with open(log, "a") as f:
        r = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE, text=True,
                           env=child_env(REPO), timeout=60)
    assert r.returncode == 0, r.stderr
    assert log.read_text() == "before\nfirst\nout\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(REPO), timeout=60)
    assert r.stdout == "first\nout\n"


def test_a_socket_a_symlink_loop_and_a_folder_are_refused(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s"))
    try:
        with pytest.raises(MinBertError, match=r"s: is a socket; an output goes to a regular file, a FIFO or a "
                                               r"character device such as /dev/null: give another path$"):
            write_text(tmp_path / "s", "x")
    finally:
        sock.close()
    assert the_kind(tmp_path / "s") == "socket"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(MinBertError, match=r"loop: symlink loop; point the link at a file or remove it$"):
        write_text(tmp_path / "loop", "x")
    folder = tmp_path / "mine"                       # a user's folder named as a file output: kept whole
    folder.mkdir()
    (folder / "keep.txt").write_text("keep")
    with pytest.raises(IsADirectoryError):
        write_text(folder, "x")
    assert (folder / "keep.txt").read_text() == "keep"


# ---------------------------------------------------------------- minbert predict --out

def sentences(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("A gripping film.\nDull.\n")
    return path


def test_predict_out_a_fifo_a_link_and_a_device(lone_model, tmp_path, capsys):
    inp = sentences(tmp_path)
    code, expected, err = minbert(["predict", lone_model, inp, "-q"], capsys)     # the same rows on stdout
    assert code == 0, err
    assert expected.count("\n") == 3
    path = fifo(tmp_path, "out.tsv")
    reader = Reader(path)
    code, out, err = minbert(["predict", lone_model, inp, "-q", "--out", path], capsys)
    assert code == 0 and out == "", err
    assert reader.result().decode() == expected and the_kind(path) == "fifo"
    target = tmp_path / "kept" / "predictions.tsv"
    target.parent.mkdir()
    (tmp_path / "link.tsv").symlink_to(target)
    code, _, err = minbert(["predict", lone_model, inp, "-q", "--out", tmp_path / "link.tsv"], capsys)
    assert code == 0, err
    assert the_kind(tmp_path / "link.tsv") == "link" and target.read_text() == expected
    if ROOT:
        for device in (private_null(tmp_path), Path("/dev/null")):
            code, out, err = minbert(["predict", lone_model, inp, "-q", "--out", device], capsys)
            assert code == 0 and out == "", err
            assert the_kind(device) == "char"
    code, out, err = minbert(["predict", lone_model, inp, "-q", "--out", "/dev/stdout"], capsys)
    assert code == 0, err
    assert not list(tmp_path.rglob(".*.tmp"))


@as_root
def test_predict_out_dev_null_as_a_separate_process(lone_model, tmp_path):
    """The issue's command, as a user runs it as root: /dev/null stays the system's device."""
    r = subprocess.run([sys.executable, "-m", "minbert.cli", "predict", str(lone_model), str(sentences(tmp_path)),
                        "-q", "--out", "/dev/null"], capture_output=True, text=True, env=child_env(REPO), timeout=300)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert the_kind(Path("/dev/null")) == "char" and os.stat("/dev/null").st_rdev == os.makedev(1, 3)


def test_predict_refuses_to_write_over_what_it_reads(lone_model, tmp_path, capsys):
    inp = sentences(tmp_path)
    before = inp.read_bytes()
    (tmp_path / "alias.txt").symlink_to(inp)
    os.link(inp, tmp_path / "hard.txt")
    cases = [(inp, f"{inp}: is the file {inp}, which the command reads; give --out another file"),
             (tmp_path / "alias.txt", f"{tmp_path / 'alias.txt'}: is the file {inp}, which the command reads"),
             (tmp_path / "hard.txt", f"{tmp_path / 'hard.txt'}: is the file {inp}, which the command reads"),
             (lone_model, f"{lone_model}: is the file {lone_model}, which the command reads")]
    for out, message in cases:
        code, stdout, err = minbert(["predict", lone_model, inp, "--out", out], capsys)
        assert code == 2 and stdout == ""
        assert error_line(err).startswith("error: " + message), err
    assert inp.read_bytes() == before
    # an experiment's folder: nothing inside it (its model, its predictions, a new file)
    experiment = tmp_path / "results" / "experiments" / "e"
    (experiment / "finetune").mkdir(parents=True)
    os.link(lone_model, experiment / "finetune" / "model.pt")
    for model in (experiment, experiment / "finetune" / "model.pt"):
        for out in (experiment / "finetune" / "model.pt", experiment / "mine.tsv", experiment):
            code, _, err = minbert(["predict", model, inp, "--out", out], capsys)
            assert code == 2, err
            line = error_line(err)
            assert line.startswith(f"error: {out}: ") and ("which the command reads" in line or "is a folder" in line)
    assert (experiment / "finetune" / "model.pt").read_bytes() == lone_model.read_bytes()
    assert sorted(p.name for p in experiment.rglob("*")) == ["finetune", "model.pt"]


def test_predict_out_that_cannot_be_written_is_one_line(lone_model, tmp_path, capsys):
    inp = sentences(tmp_path)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s"))
    try:
        code, _, err = minbert(["predict", lone_model, inp, "--out", tmp_path / "s"], capsys)
    finally:
        sock.close()
    assert code == 2 and error_line(err) == (f"error: {tmp_path / 's'}: is a socket; an output goes to a regular "
                                             f"file, a FIFO or a character device such as /dev/null: give another path")


# ---------------------------------------------------------------- minbert submission --out / --zip

@pytest.fixture()
def predictions(tmp_path) -> Path:
    results = tmp_path / "results"
    write_predictions(results / "experiments" / "a" / "predictions", splits=results / "data")
    return results / "experiments" / "a"


def test_submission_out_and_zip_that_are_not_plain_files(predictions, tmp_path, capsys):
    out = tmp_path / "sub" / "predictions"
    code, _, err = minbert(["submission", predictions, "--out", out], capsys)
    assert code == 0, err
    zip_bytes = (tmp_path / "sub" / "cs224n_default_final_project_submission.zip").read_bytes()
    path = fifo(tmp_path, "s.zip")
    reader = Reader(path)
    code, _, err = minbert(["submission", predictions, "--out", out, "--zip", path], capsys)
    assert code == 0, err
    assert reader.result() == zip_bytes and the_kind(path) == "fifo"
    assert zipfile.ZipFile(io.BytesIO(zip_bytes)).namelist()
    # a file of --out that is a link: written through
    target = tmp_path / "elsewhere.csv"
    (out / "sst-dev-output.csv").unlink()
    (out / "sst-dev-output.csv").symlink_to(target)
    code, _, err = minbert(["submission", predictions, "--out", out], capsys)
    assert code == 0, err
    assert the_kind(out / "sst-dev-output.csv") == "link" and target.read_text().startswith("id \t Predicted_Sentiment")
    if ROOT:
        code, _, err = minbert(["submission", predictions, "--out", out, "--zip", "/dev/null"], capsys)
        assert code == 0, err
    # --out a FIFO or a device: a folder is wanted; nothing is written
    for bad, kind in [(fifo(tmp_path, "f"), "a FIFO (named pipe)")] + ([(Path("/dev/null"), "a character device")]
                                                                        if ROOT else []):
        code, _, err = minbert(["submission", predictions, "--out", bad], capsys)
        assert code == 2 and error_line(err) == (f"error: --out: {bad} is {kind}; give a folder (it is created "
                                                 f"when missing)")
        assert the_kind(bad) in ("fifo", "char")


def test_submission_refuses_to_write_into_what_it_reads(predictions, tmp_path, capsys):
    folder = predictions / "predictions"
    before = sorted(p.name for p in folder.iterdir())
    for args, message in [(["--out", folder], f"{folder}: is the folder {folder}, which the command reads"),
                          (["--out", tmp_path / "sub", "--zip", folder / "s.zip"],
                           (f"{folder / 's.zip'}: lies inside {folder}, which the command reads; give --zip a path "
                            f"outside it")),
                          (["--out", tmp_path / "sub", "--zip", tmp_path / "results" / "data" / "sst-dev.tsv"],
                           f"{tmp_path / 'results' / 'data' / 'sst-dev.tsv'}: is the file ")]:
        code, _, err = minbert(["submission", predictions, *args], capsys)
        assert code == 2 and error_line(err).startswith("error: " + message), err
    assert sorted(p.name for p in folder.iterdir()) == before and not (tmp_path / "sub").exists()
    link = tmp_path / "sub2"                          # a file of --out linked to a split the command reads
    link.mkdir()
    split = tmp_path / "results" / "data" / "sts-test.tsv"
    (link / "sts-test-output.csv").symlink_to(split)
    text = split.read_text()
    code, _, err = minbert(["submission", predictions, "--out", link], capsys)
    assert code == 2 and error_line(err).startswith(f"error: {link / 'sts-test-output.csv'}: is the file {split}")
    assert split.read_text() == text


# ---------------------------------------------------------------- the report's --out, fetch_data --out

def _report(tmp_path, out, capsys) -> tuple[int, str]:
    from stages import report

    (tmp_path / "params.yaml").write_text("experiments:\n  a: {}\n")
    try:
        run(report.main, ["--params", str(tmp_path / "params.yaml"), "--results", str(tmp_path / "results"),
                          "--out", str(out)])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_the_report_out_folder_refuses_what_it_would_replace(tmp_path, capsys):
    reports = tmp_path / "reports"
    reports.mkdir()
    page = tmp_path / "mine.html"
    page.write_text("mine")
    (reports / "final.html").symlink_to(page)
    code, err = _report(tmp_path, reports, capsys)
    assert code == 2 and error_line(err) == (f"error: {reports / 'final.html'}: is a symlink (to {page}), where the "
                                             f"stage writes its own file; it would be replaced: remove it (rm "
                                             f"{reports / 'final.html'}) or give --out another folder")
    assert the_kind(reports / "final.html") == "link" and page.read_text() == "mine"
    (reports / "final.html").unlink()
    os.mkfifo(reports / "experiments")
    code, err = _report(tmp_path, reports, capsys)
    assert code == 2 and "experiments: is a FIFO (named pipe), where the stage writes its own file" in error_line(err)
    assert the_kind(reports / "experiments") == "fifo"
    for out, kind in [(fifo(tmp_path, "f"), "a FIFO (named pipe)"), (page, "a file")] + \
            ([(Path("/dev/null"), "a character device")] if ROOT else []):
        code, err = _report(tmp_path, out, capsys)
        assert code == 2
        assert error_line(err) == f"error: --out: {out} is {kind}; give a folder (it is created when missing)"
    assert page.read_text() == "mine"
    inside = tmp_path / "results" / "experiments" / "a"     # among the outputs it reads: refused, nothing written
    code, err = _report(tmp_path, inside, capsys)
    assert code == 2 and re.fullmatch(rf"error: {re.escape(str(inside))}: (lies inside|is the folder) \S+, which the "
                                      rf"command reads; give --out a path outside it", error_line(err)), err
    assert not inside.exists()


def test_fetch_data_out_that_is_not_a_folder_and_files_in_it_that_are_links(tmp_path, monkeypatch):
    import stages.fetch_data as fetch

    hub = tmp_path / "hub" / "SetFit" / "sst5"
    hub.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        pd.DataFrame({"text": ["a film", "another"], "label": [0, 1]}).to_json(hub / f"{split}.jsonl", orient="records",
                                                                            lines=True)
    monkeypatch.setattr(fetch, "download", lambda repo_id, patterns, cache_dir=None: tmp_path / "hub" / repo_id)
    for out, kind in [(fifo(tmp_path, "f"), "a FIFO (named pipe)")] + \
            ([(Path("/dev/null"), "a character device")] if ROOT else []):
        with pytest.raises(MinBertError, match=rf"^--out: {re.escape(str(out))} is {re.escape(kind)}; give a folder"):
            fetch.main(["--out", str(out), "--datasets", "sst"])
        assert the_kind(out) in ("fifo", "char")
    out = tmp_path / "raw"
    out.mkdir()
    target = tmp_path / "kept.csv"
    (out / "ids-sst-train.csv").symlink_to(target)
    fetch.main(["--out", str(out), "--datasets", "sst"])
    assert the_kind(out / "ids-sst-train.csv") == "link" and "a film" in target.read_text()
