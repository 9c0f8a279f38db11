"""Shared fixtures: the real data beside the repository, the packaged MiniLM, a tiny random BERT."""
from __future__ import annotations

import inspect
import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- what `precision: auto` means here
# `auto` is bf16 on a CPU with avx512_bf16 / amx_bf16 (and on a recent GPU), float32 on others. The
# session fixes it once (MINBERT_AUTO_PRECISION, which every stage, engine and command a test starts
# inherits): what this machine resolves, unless the environment already says. .ci/run then runs the
# tests marked `numbers` a second time with the other one (bf16 emulated where the CPU has no native
# bf16), so every machine checks the numbers under both and a test that compares with a float32
# tolerance fails on any CPU, while the rest of the suite runs at the machine's own speed. A test
# holds under both, or says the precision it needs (`precision: fp32` in its settings, or the
# `machine_auto` fixture where what it checks is how the machine resolves `auto`).
if not os.environ.get("MINBERT_AUTO_PRECISION", "").strip():
    from minbert.core.runtime import precision_on

    os.environ["MINBERT_AUTO_PRECISION"] = precision_on("auto", torch.device("cpu"))
AUTO_PRECISION = os.environ["MINBERT_AUTO_PRECISION"]


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


def minbert_in_process(args, capsys, cwd: str | os.PathLike | None = None) -> tuple[int, str, str]:
    """`minbert ARGS` in this process (quicker than a new Python for each call), run in the project
    folder `cwd` when given: (status, stdout, stderr)."""
    from contextlib import nullcontext

    from minbert import cli
    from workflow.repo import in_repo

    code = 0
    with in_repo(cwd) if cwd is not None else nullcontext():
        try:
            cli.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def shared_data_dir() -> Path | None:
    env = os.environ.get("MINBERT_SHARED_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if (cand / "cs224n").is_dir():
            return cand
    return None


@pytest.fixture()
def machine_auto(monkeypatch) -> None:
    """`auto` as this machine resolves it, for the test that checks that: the session's fixed meaning
    (AUTO_PRECISION) lifted."""
    monkeypatch.delenv("MINBERT_AUTO_PRECISION", raising=False)


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


@pytest.fixture(scope="session")
def lone_model(tmp_path_factory, tiny_model_dir) -> Path:
    """An untrained tiny multi-task model.pt with the sst, para and sts heads, outside any results
    folder: for what `minbert predict` and the API do with their input and output, not its numbers."""
    from minbert.model.checkpoint import save_checkpoint
    from minbert.model.multitask import MultitaskModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder
    from minbert.params.finetune import HeadsParams

    encoder, _, _ = load_encoder(tiny_model_dir)
    path = tmp_path_factory.mktemp("lone") / "model.pt"
    save_checkpoint(path, MultitaskModel(encoder, HeadsParams(), ["sst", "para", "sts"]), Tokenizer(tiny_model_dir, 32))
    return path


# the machine's device paths an output may name, as they are when the tests start: a test that wrote
# over one (run as root) would break every program on the machine that writes there
DEVICE_PATHS = ("/dev/null", "/dev/stdout", "/dev/stderr")


def _device_state(path: str):
    """What a device path is: (file type, device numbers, link target); None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), st.st_rdev if stat.S_ISCHR(st.st_mode) else None, link


DEVICES_AT_START = {path: _device_state(path) for path in DEVICE_PATHS}


def _restore(path: str, state) -> None:
    """Put back a device path as it was (as root): made beside it, then renamed over its replacement."""
    kind, rdev, link = state
    spare = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.restored")
    if os.path.lexists(spare):
        os.unlink(spare)
    if link is not None:
        os.symlink(link, spare)
    else:
        os.mknod(spare, kind | 0o666, rdev)
        os.chmod(spare, 0o666)
    os.replace(spare, path)


@pytest.fixture(autouse=True)
def devices_intact():
    """After every test, /dev/null, /dev/stdout and /dev/stderr are what they were when the tests
    started (the null device, the links to the process's streams); one a test replaced is put back
    (where the tests run as root) and the test fails."""
    yield
    broken = [p for p, state in DEVICES_AT_START.items() if state is not None and _device_state(p) != state]
    for path in broken:
        if os.geteuid() == 0:
            _restore(path, DEVICES_AT_START[path])
    if broken:
        pytest.fail(f"{', '.join(broken)} replaced (put back where the tests run as root): a test wrote over it")


def default_signals() -> None:
    """`preexec_fn` of a child a test interrupts with SIGINT: the signal's default disposition, so
    Python in the child turns it into KeyboardInterrupt even when the test run itself was started
    as a shell's background job (which starts with SIGINT ignored, inherited by every child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---------------------------------------------------------------- the longest files first
# Under `-n auto --dist loadfile` pytest-xdist hands whole files to its workers in the order of the
# collection (its own reordering, by number of tests, is switched off here): the files that took
# longest in the last recorded run go first and the short ones fill in behind them (longest
# processing time first), so no worker is left with one long file at the end while the others idle.
# tests/durations.json holds each file's seconds (setup, call and teardown of its tests), written by
# a run with MINBERT_RECORD_DURATIONS=tests/durations.json; a file it does not list goes after the
# listed ones, in collection order. Stale figures only cost balance, never a test.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# A test that compares floats with a tolerance is a test of numbers whether or not it says so: it is
# marked `numbers` here (before `-m` selects), so .ci/run's second pass runs it with the other precision
# as `auto` and a float32-only tolerance fails on every machine, not only on the CPU whose `auto` is bf16
_TOLERANCE = re.compile(r"approx\(|allclose\(|isclose\(|assert_close\(")


def _compares_with_tolerance(item) -> bool:
    try:
        return bool(_TOLERANCE.search(inspect.getsource(item.function)))
    except (AttributeError, OSError, TypeError):
        return False


def pytest_itemcollected(item):
    if item.get_closest_marker("numbers") is None and _compares_with_tolerance(item):
        item.add_marker(pytest.mark.numbers)


def pytest_collection_modifyitems(session, config, items):
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -float(seconds.get(Path(str(item.fspath)).name, 0)))   # stable: ties keep order


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if os.environ.get("MINBERT_RECORD_DURATIONS"):
        name = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
        _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("MINBERT_RECORD_DURATIONS")
    if out and not hasattr(session.config, "workerinput") and _FILE_SECONDS:    # the controller, under xdist
        ranked = dict(sorted(((k, round(v)) for k, v in _FILE_SECONDS.items()), key=lambda kv: -kv[1]))
        Path(out).write_text(json.dumps(ranked, indent=1) + "\n")
