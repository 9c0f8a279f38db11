"""Shared fixtures: the real data beside the repository, the packaged MiniLM, a tiny random BERT."""
from __future__ import annotations

import os
import re
import signal
import stat
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def child_env(first: str | os.PathLike = REPO, **extra: str) -> dict:
    """The environment of a child process that imports this checkout: `first` ahead of what
    PYTHONPATH already holds (an environment may provide packages through it, as cluster modules
    do), plus `extra` variables."""
    inherited = os.environ.get("PYTHONPATH")
    path = str(first) + (os.pathsep + inherited if inherited else "")
    return {**os.environ, "PYTHONPATH": path, **extra}


# a log record as minbert.core.runtime.setup_logging writes it: a stage may log a warning before its
# error line on one machine and not on another (bf16 emulated on a CPU without native bf16)
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \S+ (DEBUG|INFO|WARNING) ")


def error_line(stderr: str) -> str:
    """The one error line of a command's stderr: every other line must be a log record (no
    traceback, no second error, no stray output). Tests compare this line, never the whole stderr,
    so a machine's warnings do not fail them."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error: ")]
    others = [x for x in lines if not x.startswith("error: ") and not LOG_RECORD.match(x)]
    assert len(errors) == 1 and not others and "Traceback" not in stderr, stderr
    return errors[0]


def shared_data_dir() -> Path | None:
    env = os.environ.get("MINBERT_SHARED_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if (cand / "cs224n").is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (CS224N files and the SNLI sample); the test skips when it is absent."""
    d = shared_data_dir()
    if d is None:
        pytest.skip("../shared/data is not present")
    return d


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from minbert.model.weights import packaged_minilm_folder

    return packaged_minilm_folder()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and the real bert-base-uncased vocabulary,
    saved in the Hugging Face layout: fast enough for training tests."""
    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.weights import save_hf_folder

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=512)
    folder = tmp_path_factory.mktemp("tiny-bert")
    save_hf_folder(folder, BertModel(cfg), tokenizer_folder=minilm_dir)
    return folder


@pytest.fixture(autouse=True)
def dev_null_intact():
    """After every test, the machine's /dev/null is still the null device: an output written over it
    (a test run as root) would break every program on the machine. Put back, then failed."""
    yield
    st = os.lstat("/dev/null") if os.path.lexists("/dev/null") else None
    if st is not None and stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        os.mknod("/dev/.null.restored", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod("/dev/.null.restored", 0o666)
        os.replace("/dev/.null.restored", "/dev/null")
    pytest.fail("/dev/null is no longer the null device (character device 1, 3); a test wrote over it")


def default_signals() -> None:
    """`preexec_fn` of a child a test interrupts with SIGINT: the signal's default disposition, so
    Python in the child turns it into KeyboardInterrupt even when the test run itself was started
    as a shell's background job (which starts with SIGINT ignored, inherited by every child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
