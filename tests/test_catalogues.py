"""The catalogue smoke run: every experiment, pretraining, ensemble and study of every catalogue
(the demo params.yaml, params/minilm.yaml, params/papers.yaml at the scale that runs every table) runs end to
end through Snakemake on
tiny data with a tiny random BERT of the real vocabulary, each training stage for at most two
epochs of one update, and the report renders every study (a paper's table with its rows, and every
claim of the scorecard with a verdict). The stages run inside Snakemake's own
process (`--config in_process=true --force-use-threads`): the real stage code, without a Python
start-up per job."""
from __future__ import annotations

import json
import re
import shutil
from html import escape as html_escape
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_workflow import SNAKEMAKE, dag, make_copy, run

from minbert.data.raw import raw_path, read_cs224n, write_cs224n
from minbert.params import load_params

CATALOGUES = {"demo": "params.yaml", "minilm": "params/minilm.yaml", "papers": "params/papers.yaml"}
ROWS = {"train": 40, "dev": 16, "test": 8}


def tiny_data(demo: Path, out: Path) -> Path:
    """A CS224N-layout folder with a few rows per split of every task (CFIMDB made from SST:
    positive for labels 3-4), every SST label present, and a slice of the NLI sample."""
    from minbert.core.tasks import TASKS

    out.mkdir(parents=True)

    def write(frame: pd.DataFrame, task: str, split: str) -> None:
        raw = frame.rename(columns={"label": TASKS[task].raw_label_column})
        if split == "test":
            raw = raw.drop(columns=[TASKS[task].raw_label_column])
        write_cs224n(raw, raw_path(out, task, split))

    for task in ("sst", "para", "sts"):
        for split, n in ROWS.items():
            frame, _ = read_cs224n(raw_path(demo, task, split), task, labelled=split != "test")
            if task == "sst" and split == "train":       # every label, for the prototypes head
                frame = pd.concat([frame.groupby("label").head(n // 5), frame]).drop_duplicates("id")
            frame = frame.head(n).reset_index(drop=True)
            write(frame, task, split)
            if task == "sst":
                binary = frame.assign(label=(frame["label"] >= 3).astype(int)) if split != "test" else frame
                write(binary, "cfimdb", split)
    lines = (demo / "nli-sample.jsonl").read_text().splitlines()[:150]
    (out / "nli.jsonl").write_text("\n".join(lines) + "\n")
    return out


def _cap(d: dict, key: str, most: int) -> None:
    if isinstance(d.get(key), int) and d[key] > most:
        d[key] = most


def tiny_catalogue(raw: dict, data: Path, model: str) -> dict:
    """The catalogue with the tiny data and model, at the scale that runs every table (one that leaves
    none out), one seed a row, and every training stage cut to a few epochs of one update (the settings
    that make each experiment what it is stay, and rows with different epochs keep different ones)."""
    raw = dict(raw)
    # fewer epochs, each row's still distinct from another's (R9's six against R4's ten): rows cut to
    # the same run would make a claim unable to fail, which loading refuses
    stated = sorted({e["finetune"]["epochs"] for e in [raw.get("base") or {}, *(raw.get("experiments") or {}).values()]
                     if isinstance(e, dict) and isinstance(e.get("finetune"), dict)
                     and isinstance(e["finetune"].get("epochs"), int) and e["finetune"]["epochs"] > 2})
    fewer = {v: 3 + k for k, v in enumerate(stated)}
    if raw.get("scales"):               # every table run, each row once: the rows are the same at every scale
        named = {k: ((v or {}).get("named") or {}).get("studies", {}) for k, v in raw["scales"].items()}
        raw["scale"] = next(k for k, studies in named.items() if not any("left_out" in st for st in studies.values()))
        raw["scales"] = {**raw["scales"], raw["scale"]: {**raw["scales"][raw["scale"]], "repeats": 1}}
    raw["data"] = {**(raw.get("data") or {}), "dir": str(data), "nli_file": str(data / "nli.jsonl")}
    base = raw.setdefault("base", {})
    base.update(model=model, device="cpu", threads=1, max_length=32, predict_batch_size=64)
    for exp in [base, *[e for e in (raw.get("experiments") or {}).values() if isinstance(e, dict)]]:
        ft = exp.setdefault("finetune", {})
        ft["max_steps_per_epoch"] = 1
        if isinstance(ft.get("epochs"), int) and ft["epochs"] > 2:
            ft["epochs"] = fewer[ft["epochs"]]
        _cap(exp, "max_length", 32)
        rh = exp.get("retrain_heads")
        if isinstance(rh, dict):
            _cap(rh, "epochs", 1)
    base["finetune"].setdefault("epochs", 2)
    base.setdefault("retrain_heads", {})["epochs"] = 1
    for pre in (raw.get("pretrainings") or {}).values():
        pre.update(epochs=1, max_steps_per_epoch=1, dev_size=8)
    return raw


@pytest.fixture(scope="module")
def four_layer_model(tmp_path_factory, minilm_dir) -> Path:
    """The tiny random BERT with four layers: 003's FREEZE_SST copies the top four into its branch."""
    import torch

    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.weights import save_hf_folder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny4")
    save_hf_folder(folder, BertModel(BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                                intermediate_size=64)), tokenizer_folder=minilm_dir)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
@pytest.mark.parametrize("catalogue", list(CATALOGUES))
def test_every_catalogue_runs_end_to_end(repo_root, tmp_path, four_layer_model, catalogue):
    folder = make_copy(repo_root, tmp_path / "repo", four_layer_model)
    data = tiny_data(repo_root / "data" / "demo", tmp_path / "data")
    raw = yaml.safe_load((repo_root / CATALOGUES[catalogue]).read_text())
    raw.pop("catalogue", None)
    params = folder / "smoke.yaml"
    params.write_text(yaml.safe_dump(tiny_catalogue(raw, data, "models/tiny"), sort_keys=False))
    lp = load_params(params)
    log = run([SNAKEMAKE, "--cores", "1", "--scheduler", "greedy", "--force-use-threads", "--config", "params=smoke.yaml",
               "in_process=true"],
              folder, timeout=1800)
    # every rule is a checkpoint, so Snakemake's step count is of the DAG it first planned; what
    # counts is that every job of the catalogue ran (but the exports, their own targets): each has its run record
    missing = [j.id for j in dag.jobs("smoke.yaml", repo=folder)
               if j.stage != "export" and not (folder / j.run_record).is_file()]
    assert not missing, (missing, log[-3000:])

    results = folder / "results"
    for name in lp.experiments:
        assert (results / "experiments" / name / "metrics.json").is_file(), name
    for name in lp.params.ensembles:
        assert json.loads((results / "ensembles" / name / "metrics.json").read_text())["dev"], name
    used = {e.pretrain for e in lp.experiments.values() if e.pretrain}
    assert {p.name for p in (results / "pretrain").iterdir()} == used if used else True
    html = (folder / "reports" / "final.html").read_text()
    for study in lp.params.studies:
        section = re.search(rf'<section class="study" id="study-{re.escape(study.name)}">(.*?)</section>', html, re.S)
        assert section, f"study {study.name} is not in the report"
        assert "No results yet" not in section.group(1), study.name
        if study.paper is not None:         # the paper's table, every row run, every claim given a verdict
            table = re.search(rf'<table class="results paper" id="paper-{re.escape(study.name)}".*?</table>',
                              section.group(1), re.S)
            assert table, f"study {study.name} has no paper table"
            labels = re.findall(r'<tr data-label="([^"]*)"', table.group(0))
            assert labels == [html_escape(r.label, quote=True) for r in study.paper.rows], study.name
            assert "(no results yet)" not in table.group(0), study.name
    card = re.search(r'<section id="scorecard">(.*?)</section>', html, re.S)
    claims = sum(len(s.paper.claims) for s in lp.params.studies if s.paper)
    if claims:
        rows = re.findall(r'<tr data-verdict="([^"]*)"(.*?)</tr>', card.group(1), re.S)
        assert len(rows) == claims, [v for v, _ in rows]
        for verdict, row in rows:
            if verdict != "not run":
                continue
            # every row ran; a claim has no verdict only where a row's score is undefined (a tiny
            # random model's similarity scores can all clip to one value: metrics.json says why)
            names = re.search(r"here: (\S+) vs (\S+)", re.sub(r"<[^>]+>", " ", row)).groups()
            undefined = [n for n in names for kind in ("experiments", "ensembles")
                         if (results / kind / n / "metrics.json").is_file()
                         and json.loads((results / kind / n / "metrics.json").read_text())["dev"].get("undefined")]
            assert undefined, (names, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)))
    shutil.rmtree(folder / "results" / "cache", ignore_errors=True)
