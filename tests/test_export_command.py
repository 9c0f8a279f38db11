"""`minbert export` and what an export carries: a tiny experiment trained with a head of the user's
(a module in the project that imports a helper file of the project) is exported by the command; the
export holds the module's and the helper's code with their hashes, loads and answers from another
folder and from a copy elsewhere once its code is trusted, and is refused in one line before, or
when a file of its code differs from the one exported. The command refuses a model that is not what
the params describe now, and an --out that would replace a folder it reads or one of the user's."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import child_env, error_line, minbert_in_process as minbert_here
from test_train import restore_threads, write_prepared  # noqa: F401  (tests/ is on sys.path; fixture)

from minbert.core.errors import MinBertError
from minbert.entry import run
from stages import finetune, predict

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "own_ext_export"            # the user's package in the project (a name no other test imports)
HEAD = f'''"""A head of the user's: a hidden layer through the helper's activation."""
from torch import nn

from minbert.core.register import register_head
from {PACKAGE}.helpers import act


@register_head
class GeluHead(nn.Module):
    name = "gelu_head"
    view = "single"

    def __init__(self, in_dim, outputs, hidden_layers, dropout):
        super().__init__()
        self.hidden, self.out = nn.Linear(in_dim, in_dim), nn.Linear(in_dim, outputs)
        self.squeeze = outputs == 1

    def forward(self, emb):
        out = self.out(act(self.hidden(emb)))
        return out.squeeze(-1) if self.squeeze else out
'''
HELPER = "import torch\n\n\ndef act(x):\n    return torch.nn.functional.gelu(x)\n"
TEXT = "A gripping, funny film.\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    """A project whose experiment `own` trains SST with the user's head and STS (not listed in
    export.experiments: the command exports any trained experiment); trained and predicted."""
    root = tmp_path_factory.mktemp("own") / "project"
    (root / PACKAGE).mkdir(parents=True)
    (root / PACKAGE / "heads.py").write_text(HEAD)
    (root / PACKAGE / "helpers.py").write_text(HELPER)
    write_prepared(root / "results" / "data", n_train=16, n_dev=12, n_test=4)
    (root / "params.yaml").write_text(yaml.safe_dump({
        "modules": [f"{PACKAGE}/heads.py"],
        "base": {"model": str(tiny_model_dir), "device": "cpu", "threads": 1, "seed": 3, "max_length": 32,
                 "predict_batch_size": 16, "precision": "fp32",
                 "finetune": {"epochs": 1, "batch_size": 8, "lr": 1e-3, "max_steps_per_epoch": 2}},
        "experiments": {"own": {"finetune": {"tasks": ["sst", "sts"], "heads": {"sst": "gelu_head"}}}}}))
    sys.path.insert(0, str(root))           # as `python -m stages.finetune` run there has it
    try:
        with _in(root):
            for stage in (finetune, predict):
                run(stage.main, ["--experiment", "own"])
    finally:
        sys.path.remove(str(root))
    return root


def _in(folder):
    from workflow.repo import in_repo

    return in_repo(folder)


@pytest.fixture(scope="module")
def exported(project, tmp_path_factory):
    """`minbert export own --out DIR`, DIR outside the project."""
    out = tmp_path_factory.mktemp("shared") / "own-model"
    from minbert import cli

    with _in(project):
        cli.main(["export", "own", "--out", str(out)])
    return out


def test_the_export_carries_the_modules_code_and_its_helpers_with_the_checkpoints_record(project, exported):
    """The checkpoint's record of the code its import ran (each file with its hash), copied: the same
    hashes, the copies' paths in code/, nothing else carried."""
    ckpt = torch.load(project / "results/experiments/own/finetune/model.pt", weights_only=True)
    trained = ckpt["declared"]["code"][f"{PACKAGE}/heads.py"]
    assert sorted(trained) == [str(project / PACKAGE / "heads.py"), str(project / PACKAGE / "helpers.py")]
    manifest = json.loads((exported / "minbert.json").read_text())
    assert manifest["declared"]["modules"] == [f"{PACKAGE}/heads.py"]
    assert manifest["declared"]["code"] == {f"{PACKAGE}/heads.py": {
        f"{PACKAGE}/heads.py": trained[str(project / PACKAGE / "heads.py")],
        f"{PACKAGE}/helpers.py": trained[str(project / PACKAGE / "helpers.py")]}}
    assert "code" not in manifest                     # one record: the declarations' own
    assert (exported / "code" / PACKAGE / "heads.py").read_text() == HEAD
    assert (exported / "code" / PACKAGE / "helpers.py").read_text() == HELPER
    assert sorted(p.relative_to(exported / "code").as_posix() for p in (exported / "code").rglob("*")
                  if p.is_file()) == [f"{PACKAGE}/heads.py", f"{PACKAGE}/helpers.py"]
    card = (exported / "README.md").read_text()
    assert 'm = load_model("path/to/this/folder", trust_remote_code=True)' in card
    assert f"carried in `code/` (`{PACKAGE}/heads.py`)" in card and "--trust-remote-code" in card


def test_a_copy_elsewhere_answers_once_trusted_and_is_refused_in_one_line_before(project, exported, tmp_path):
    """Another folder, a copy of the export, a new Python without the project on its path: refused
    untrusted; trusted, the stage's own prediction for the row."""
    copy = tmp_path / "elsewhere" / "model"
    shutil.copytree(exported, copy)
    other = tmp_path / "work"
    other.mkdir()

    def predict_here(*flags):
        command = [sys.executable, "-m", "minbert.cli", "predict", str(copy), "--precision", "fp32", *flags]
        return subprocess.run(command, input=TEXT, capture_output=True, text=True, cwd=other, timeout=300,
                              env=child_env(REPO, OMP_NUM_THREADS="1"))

    r = predict_here()
    assert r.returncode == 2 and error_line(r.stderr) == (
        f"error: {copy}: the model runs code that came with it (code/{PACKAGE}/heads.py); read it, and load it only if "
        f"you trust it: load_model(..., trust_remote_code=True) or minbert predict --trust-remote-code")
    r = predict_here("--trust-remote-code")
    assert r.returncode == 0, r.stderr
    from minbert.api import load_model

    sys.path.insert(0, str(project))
    try:
        with _in(project):           # the experiment's own model, in the project
            ours = load_model("results/experiments/own", device="cpu", precision="fp32",
                              trust_remote_code=True).sentiment([TEXT.strip()])
    finally:
        sys.path.remove(str(project))
    header, row = r.stdout.splitlines()
    got = dict(zip(header.split("\t"), row.split("\t")))
    assert int(got["sst_label"]) == ours["prediction"][0]
    for k in range(5):
        assert float(got[f"sst_prob_{k}"]) == pytest.approx(ours[f"prob_{k}"][0], abs=2e-6)


def test_the_api_loads_it_from_another_folder_and_refuses_changed_code(exported, tmp_path, monkeypatch):
    from minbert.api import load_model

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MinBertError, match=r"the model runs code that came with it .* trust_remote_code=True"):
        load_model(copy, device="cpu")
    m = load_model(copy, device="cpu", trust_remote_code=True)
    assert type(m.model.heads["sst"]).__name__ == "GeluHead" and len(m.sentiment(["fine"])) == 1
    helper = copy / "code" / PACKAGE / "helpers.py"
    helper.write_text(HELPER.replace("gelu(x)", "relu(x)"))
    said = f"{copy}: the model was trained with the code of module '{PACKAGE}/heads.py', and its file {helper}"
    with pytest.raises(MinBertError) as e:
        load_model(copy, device="cpu", trust_remote_code=True)
    assert str(e.value) == f"{said} has changed since; put back the code it came with, or export the model again"
    helper.write_text(HELPER + "# a comment: what the code does is the same\n")
    load_model(copy, device="cpu", trust_remote_code=True)
    helper.unlink()
    with pytest.raises(MinBertError) as e:           # refused before anything is imported, trusted or not
        load_model(copy, device="cpu")
    assert str(e.value).startswith(f"{said} is gone; ")
    shutil.copyfile(exported / "code" / PACKAGE / "helpers.py", helper)
    manifest = json.loads((copy / "minbert.json").read_text())
    for outside in ("../../outside.py", str(tmp_path / "outside.py")):      # a path out of code/: never read
        bad = json.loads(json.dumps(manifest))
        bad["declared"]["code"][f"{PACKAGE}/heads.py"][outside] = "0" * 16
        (copy / "minbert.json").write_text(json.dumps(bad))
        with pytest.raises(MinBertError, match=r"minbert.json: its declared modules and code are not what this "
                                               r"version writes; export the model again"):
            load_model(copy, device="cpu", trust_remote_code=True)
    del manifest["declared"]["code"]          # an export without the code its modules need
    (copy / "minbert.json").write_text(json.dumps(manifest))
    with pytest.raises(MinBertError, match=rf"needs the modules {PACKAGE}/heads.py, and the folder does not carry "
                                           r"their code .* export it again: minbert export EXPERIMENT"):
        load_model(copy, device="cpu", trust_remote_code=True)


def test_an_export_runs_its_copies_whatever_modules_of_those_names_were_imported_before(project, exported,
                                                                                         monkeypatch):
    """In a process where a module of the helper's name is imported already (a project's own, here
    one whose activation differs), the export imports its copies, and gives the name back after."""
    import types

    from minbert.api import load_model

    ours = load_model(exported, device="cpu", trust_remote_code=True, precision="fp32").sentiment([TEXT.strip()])
    other = types.ModuleType(f"{PACKAGE}.helpers")
    other.act = torch.relu
    monkeypatch.setitem(sys.modules, PACKAGE, types.ModuleType(PACKAGE))
    monkeypatch.setitem(sys.modules, f"{PACKAGE}.helpers", other)
    copy = exported.parent / "copy-for-names"
    shutil.copytree(exported, copy)
    theirs = load_model(copy, device="cpu", trust_remote_code=True, precision="fp32")
    assert sys.modules[f"{PACKAGE}.helpers"] is other
    assert {f for fs in theirs.model.registry.code.values() for f, _ in fs} == \
        {str((copy / "code" / PACKAGE / n).resolve()) for n in ("heads.py", "helpers.py")}
    got = theirs.sentiment([TEXT.strip()])
    assert [got[f"prob_{k}"][0] for k in range(5)] == pytest.approx([ours[f"prob_{k}"][0] for k in range(5)], abs=1e-6)


# ---------------------------------------------------------------- the command

def test_the_command_exports_into_the_pipelines_folder_and_then_has_nothing_to_do(project, capsys):
    code, out, err = minbert_here(["export", "own"], capsys, project)
    assert code == 0, err
    # 15 files and its sts head's cross-encoder (CLS pooling: sentence-transformers modules), 12 more
    assert out == "results/exports/own: 27 files (README.md: its model card)\n"
    record = json.loads((project / "results" / "runs" / "export" / "own.json").read_text())
    assert f"export fingerprint: `{record['fingerprint']}`" in (project / "results/exports/own/README.md").read_text()
    code, out, err = minbert_here(["export", "own"], capsys, project)
    assert code == 0 and out == "" and "export@own: up to date" in err and "--force" in err
    code, out, err = minbert_here(["export", "own", "--force"], capsys, project)
    assert code == 0 and out.startswith("results/exports/own: ")


def test_the_command_refuses_a_stale_model_an_unknown_name_and_a_folder_it_would_destroy(project, tmp_path, capsys):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["base"]["finetune"]["lr"] = 2e-3
    (project / "edited.yaml").write_text(yaml.safe_dump(params))
    code, _, err = minbert_here(["export", "own", "--params", "edited.yaml"], capsys, project)
    assert code == 2 and error_line(err) == (
        "error: finetune@own: its last run had other settings, inputs or code than the params give it now; run the "
        "pipeline first: snakemake --cores all results/experiments/own/metrics.json (or dvc repro)")
    code, _, err = minbert_here(["export", "onw"], capsys, project)
    assert code == 2 and error_line(err) == "error: params.yaml: unknown experiment 'onw' (did you mean 'own'?)"
    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for out, says in ((mine, f"{mine}: a folder that is not an export of this version (no minbert.json listing the "
                             f"files it wrote); the export replaces its folder whole: give --out a new folder, or "
                             f"move your files out of it"),
                      ("results/experiments/own/x", "results/experiments/own/x: lies inside "),
                      ("results/data", "results/data: a folder that is not an export")):
        code, _, err = minbert_here(["export", "own", "--out", out], capsys, project)
        assert code == 2 and error_line(err).startswith(f"error: {says}"), err
    assert (mine / "notes.txt").read_text() == "mine" and (project / "results/data/sst-train.tsv").is_file()


def test_an_export_elsewhere_runs_in_the_jobs_registry(tmp_path, monkeypatch):
    """Into --out (no run record, so not under `running`), the export still works from its job's
    registry: a task the params declare is one the card can name (it was the built-in tasks alone).
    The export makes it active itself (its settings' registry), whoever calls it."""
    from minbert.core.tasks import TASKS
    from minbert.pipeline import exporting
    from minbert.pipeline.plan import job_for
    from minbert.share import export as share_export

    class Seen(Exception):
        pass

    demo = REPO / "data" / "demo"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "tasks": {"sst_score": {"range": [0, 4], "files": {
            "format": "tsv", "train": str(demo / "ids-sst-train.csv"), "dev": str(demo / "ids-sst-dev.csv"),
            "texts": ["sentence"], "label": "sentiment", "id": "id"}}},
        "base": {"model": "models/tiny"},
        "experiments": {"e": {"finetune": {"tasks": ["sst", "sst_score"]}}}}))
    seen = []
    def load_checkpoint(*args, **kwargs):         # the export's first step: what is the registry in use there?
        seen.append(sorted(set(TASKS)))
        raise Seen

    monkeypatch.setattr(share_export, "load_checkpoint", load_checkpoint)
    with _in(tmp_path), pytest.raises(Seen):
        exporting.export(job_for("params.yaml", "export", "e"), out=str(tmp_path / "out"))
    assert seen and "sst_score" in seen[0] and "sst_score" not in TASKS


@pytest.mark.parametrize("change,said", [
    (lambda f: (f / "thesis.tex").write_text("mine"), "thesis.tex is not a file the export wrote"),
    (lambda f: (f / "code" / "notes.md").write_text("mine"), "code/notes.md is not a file the export wrote"),
    (lambda f: (f / "README.md").write_text("my notes on the model"), "README.md has changed since it was exported"),
    (lambda f: (f / "link").symlink_to(f / "README.md"), "link is not a file the export wrote"),
    (lambda f: (f / "code" / "drafts").mkdir(), "code/drafts/ is not a folder the export wrote"),
    (lambda f: (f / "minbert.json").write_text("{}"), "a folder that is not an export of this version"),
    (lambda f: (f / "minbert.json").write_text("not json"), "a folder that is not an export of this version"),
])
def test_out_replaces_only_an_export_that_holds_nothing_but_what_it_wrote(project, exported, tmp_path, capsys,
                                                                            change, said):
    """`--out DIR` deleted a folder that merely held a file named minbert.json, a thesis.tex beside it."""
    out = tmp_path / "out"
    shutil.copytree(exported, out, symlinks=True)
    change(out)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    code, _, err = minbert_here(["export", "own", "--out", out], capsys, project)
    assert code == 2 and error_line(err).startswith(f"error: {out}: {said}"), err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before


def test_out_replaces_its_own_export_and_another_experiments_only_with_force(project, exported, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    code, _, err = minbert_here(["export", "own", "--out", out], capsys, project)     # the same experiment's
    assert code == 0, err
    manifest = json.loads((out / "minbert.json").read_text())
    assert manifest["experiment"] == "own" and sorted(manifest["files"]) == sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "minbert.json"
        or p.parent != out and p.is_file())
    (out / "minbert.json").write_text(json.dumps({**manifest, "experiment": "other"}))
    code, _, err = minbert_here(["export", "own", "--out", out], capsys, project)
    assert code == 2 and error_line(err) == (f"error: {out}: holds the export of experiment 'other', not 'own'; give "
                                             f"--force to replace it, or --out another folder")
    code, _, err = minbert_here(["export", "own", "--out", out, "--force"], capsys, project)
    assert code == 0 and json.loads((out / "minbert.json").read_text())["experiment"] == "own"
