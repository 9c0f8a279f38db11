"""The trust boundary of what a model carries (docs/sharing.md, "The user's code in an export"):
whatever a model names as code (a module's path or its importable name, files it carries) runs only
with the user's `trust_remote_code`, on every route (minbert predict, the API run from the export's
own folder, a checkpoint as well as an export), and is refused before in one line naming the modules;
trusted, a module named by its name comes from the environment, never from the working folder or
the export's own. A damaged export is one line. Loading models and params is safe from threads."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import test_export_command
import torch
from conftest import REPO, child_env, error_line
from conftest import minbert_in_process as minbert_here

from minbert.core.errors import MinBertError

project, exported = test_export_command.project, test_export_command.exported     # its fixtures: a trained project
TRUST = "read it, and load it only if you trust it: load_model(..., trust_remote_code=True) or minbert predict " \
        "--trust-remote-code"
PAYLOAD = "from pathlib import Path\n\nPath(__file__).with_name('RAN').write_text('payload ran')\n"


@pytest.fixture(scope="module")
def plain_export(lone_model, tmp_path_factory) -> Path:
    """An export of an untrained model with the built-in heads alone (no code of the user's)."""
    from minbert.model.checkpoint import load_checkpoint
    from minbert.share.export import export_model

    model, tokenizer, _ = load_checkpoint(lone_model)
    folder = tmp_path_factory.mktemp("plain") / "export"
    folder.mkdir()
    export_model(model, tokenizer, folder)
    return folder


def planted(plain_export: Path, where: Path, modules: list[str]) -> Path:
    """A copy of the export whose manifest names `modules` (no code of its own) and which holds a
    payload.py at its top: it writes RAN beside itself if it is ever imported."""
    shutil.copytree(plain_export, where)
    manifest = json.loads((where / "minbert.json").read_text())
    manifest["declared"] = {"modules": modules}
    (where / "minbert.json").write_text(json.dumps(manifest))
    (where / "payload.py").write_text(PAYLOAD)
    return where


def run_in(folder: Path, *args: str, stdin: str = "A fine film.\n") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, cwd=folder, check=False,
                          timeout=300, env=child_env(REPO, OMP_NUM_THREADS="1"))


def test_an_export_naming_a_module_by_name_is_refused_from_its_own_folder_untrusted(plain_export, tmp_path, capsys,
                                                                                       monkeypatch):
    """`minbert predict .` and load_model(".") in a script run in the export's folder imported its
    payload.py (a module the manifest names, found on the working folder), then predicted normally."""
    export = planted(plain_export, tmp_path / "export", ["payload"])
    said = f"the model runs code it names (module 'payload'); {TRUST}"
    (export / "script.py").write_text("from minbert.api import load_model\nload_model('.')\n")
    (export / "in.txt").write_text("A fine film.\n")
    r = run_in(export, "script.py")
    assert r.returncode == 1 and r.stderr.strip().endswith(f"MinBertError: .: {said}")
    monkeypatch.syspath_prepend("")                  # as `python -m minbert.cli` run in the folder has it
    code, _, err = minbert_here(["predict", ".", "in.txt"], capsys, export)
    assert code == 2 and error_line(err) == f"error: .: {said}"
    assert not (export / "RAN").exists()
    # trusted, a name is imported from the environment: the file lying in the export's folder is not it
    code, _, err = minbert_here(["predict", ".", "in.txt", "--trust-remote-code"], capsys, export)
    assert code == 2 and error_line(err) == (
        "error: .: the model's modules: module 'payload' cannot be imported (ModuleNotFoundError: No module named "
        "'payload'); fix it or remove it from modules")
    assert not (export / "RAN").exists() and "payload" not in sys.modules


def test_a_manifest_naming_an_installed_module_is_code_to_trust_too(plain_export, tmp_path, capsys):
    from minbert.api import load_model

    export = planted(plain_export, tmp_path / "export", ["this"])
    sys.modules.pop("this", None)
    with pytest.raises(MinBertError) as e:
        load_model(export, device="cpu")
    assert str(e.value) == f"{export}: the model runs code it names (module 'this'); {TRUST}"
    assert "this" not in sys.modules and capsys.readouterr().out == ""
    m = load_model(export, device="cpu", trust_remote_code=True)            # trusted: imported, as asked
    assert "this" in sys.modules and len(m.sentiment(["fine"])) == 1


def test_a_checkpoint_naming_modules_is_refused_untrusted_on_every_route(lone_model, tmp_path, capsys, monkeypatch):
    """A lone model.pt and an experiment's folder: the API and minbert predict; with trust, a module
    named by its name is not taken from the working folder."""
    from minbert.api import load_model

    ckpt = torch.load(lone_model, weights_only=True)
    ckpt["declared"] = {"modules": ["payload"]}
    experiment = tmp_path / "experiments" / "e"
    (experiment / "finetune").mkdir(parents=True)
    torch.save(ckpt, experiment / "finetune" / "model.pt")
    (tmp_path / "payload.py").write_text(PAYLOAD)
    (tmp_path / "in.txt").write_text("A fine film.\n")
    monkeypatch.syspath_prepend("")
    monkeypatch.chdir(tmp_path)
    for model in ("experiments/e/finetune/model.pt", "experiments/e"):
        with pytest.raises(MinBertError) as e:
            load_model(model, device="cpu")
        assert str(e.value) == f"experiments/e/finetune/model.pt: the model runs code it names (module 'payload'); {TRUST}"
        code, _, err = minbert_here(["predict", model, "in.txt"], capsys)
        assert code == 2 and "the model runs code it names (module 'payload')" in error_line(err)
        code, _, err = minbert_here(["predict", model, "in.txt", "--trust-remote-code"], capsys)
        assert code == 2 and "module 'payload' cannot be imported (ModuleNotFoundError" in error_line(err)
    assert not (tmp_path / "RAN").exists() and "payload" not in sys.modules


def test_a_checkpoint_of_the_users_own_code_loads_trusted_from_any_folder(project, tmp_path, monkeypatch):
    """The experiment's model.pt names its module by its path in the project: from another folder it
    is imported from where the checkpoint's record says it lay (checked by content first)."""
    from minbert.api import load_model

    model = project / "results/experiments/own/finetune/model.pt"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MinBertError, match=r"the model runs code it names \(module 'own_ext_export/heads.py'\)"):
        load_model(model, device="cpu")
    m = load_model(model, device="cpu", trust_remote_code=True)
    assert type(m.model.heads["sst"]).__name__ == "GeluHead" and len(m.sentiment(["fine"])) == 1


# ---------------------------------------------------------------- a damaged export: one line each

@pytest.mark.parametrize("damage,said", [
    (lambda f: _edit(f, max_length="abc"), "minbert.json: 'max_length' is \"abc\", not a whole number of word pieces"),
    (lambda f: _edit(f, max_length=0), "minbert.json: 'max_length' is 0, not a length a model reads"),
    (lambda f: _edit(f, max_length=True), "minbert.json: 'max_length' is true, not a whole number of word pieces"),
    (lambda f: _edit(f, tasks="sst"), "minbert.json: 'tasks' is \"sst\", not a list of task names"),
    (lambda f: _edit(f, tasks=[1]), "minbert.json: 'tasks' must name the model's tasks"),
    (lambda f: _edit(f, heads=None), "minbert.json: 'heads' is null, not an object of heads settings"),
    (lambda f: _edit(f, calibration=[1]), "minbert.json: 'calibration' is [1], not an object"),
    (lambda f: _edit(f, declared=[]), "minbert.json: its declared modules and code are not what this version writes"),
    (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json: cannot be read (FileNotFoundError)"),
    (lambda f: (f / "tokenizer.json").write_text("{}"), "its tokenizer cannot be read by the tokenizers library"),
    (lambda f: (f / "heads.safetensors").unlink(), "heads.safetensors: cannot be read"),
    (lambda f: (f / "minbert.json").write_text("[1"), "minbert.json: cannot be read (JSONDecodeError)"),
    (lambda f: _edit(f, max_length=1000), "its max_length 1000 is not a number of word pieces from 1 to 512"),
])
def test_a_damaged_export_is_one_line(plain_export, tmp_path, damage, said):
    from minbert.api import load_model

    copy = tmp_path / "copy"
    shutil.copytree(plain_export, copy)
    damage(copy)
    with pytest.raises(MinBertError) as e:
        load_model(copy, device="cpu")
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)


def _edit(folder: Path, **entries) -> None:
    manifest = json.loads((folder / "minbert.json").read_text())
    (folder / "minbert.json").write_text(json.dumps({**manifest, **entries}))


# ---------------------------------------------------------------- loading from threads

BILINEAR = '''import time

from torch import nn

from minbert.core.register import register_head

time.sleep(0.2)         # a slow import: another thread's runs meanwhile


@register_head
class Bilinear(nn.Module):
    name, view = "bilinear", "bi"

    def __init__(self, in_dim, outputs, hidden_layers, dropout):
        super().__init__()
        self.bilinear = nn.Bilinear(in_dim, in_dim, outputs)

    def forward(self, u, v):
        return self.bilinear(u, v).squeeze(-1)
'''


def test_models_and_params_load_from_several_threads_at_once(exported, tmp_path):
    """Two exports and two params files (each naming its own module that registers 'bilinear'), from
    eight threads at once: a false "the head name 'bilinear' is registered twice" or KeyError: 'ext'."""
    import yaml
    from test_extending import demo_params

    from minbert.api import load_model
    from minbert.params import load_params

    exports = [tmp_path / f"export{k}" for k in range(2)]
    for folder in exports:
        shutil.copytree(exported, folder)
    params = []
    for k in range(2):
        (tmp_path / f"ext{k}").mkdir()
        (tmp_path / f"ext{k}" / "heads.py").write_text(BILINEAR)
        params.append(tmp_path / f"params{k}.yaml")
        params[-1].write_text(yaml.safe_dump(demo_params(modules=[str(tmp_path / f"ext{k}" / "heads.py")], experiments={
            "a": {"finetune": {"heads": {"sts": "bilinear"}}}})))
    jobs = [lambda f=f: load_model(f, device="cpu", trust_remote_code=True) for f in exports] + \
        [lambda p=p: load_params(p) for p in params]
    start, results = threading.Barrier(8), {}

    def run(k: int) -> None:
        start.wait()
        try:
            results[k] = jobs[k % 4]()
        except Exception as e:  # noqa: BLE001  (what a thread raised is the finding)
            results[k] = e

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    problems = [repr(r) for r in results.values() if isinstance(r, Exception)]
    assert not problems, problems
    for k in (0, 1, 4, 5):
        assert type(results[k].model.heads["sst"]).__name__ == "GeluHead"
        assert len(results[k].sentiment(["fine"])) == 1
    for k in (2, 3, 6, 7):
        head = results[k].registry.heads["bilinear"]
        assert Path(head.module) == tmp_path / f"ext{k % 2}" / "heads.py" and head.cls.__name__ == "Bilinear"
