"""The report stage: rendered from small fixed inputs, then parsed back and checked against the
metrics files, the predictions (confusion matrices counted by hand), escaping and self-containment."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from minbert.metrics import accuracy, pearson, summarise
from minbert.report import best_experiment, fmt_delta, fmt_metric, load_report_data, render_reports, report_inputs
from minbert.params import load_params

REPO = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script> & friends"

PARAMS = """\
base:
  finetune: {epochs: 2}
experiments:
  cls: {description: "CLS pooling & cross-encoder heads"}
  sbert: {finetune: {lr: 1.0e-4, heads: {para: concat, sts: cosine}}}
  sst_only: {finetune: {tasks: [sst]}, pretrain: mlm}
pretrainings:
  mlm: {kind: mlm}
ensembles:
  ens: {members: [cls, sbert]}
studies:
  - name: heads
    title: Prediction heads
    experiments: [cls, sbert, sst_only, ens]
    baseline: cls
    source: Table 1 of the further-pretraining report
  - name: lr
    title: Learning rate
    experiments: [sbert, cls]
    splits: [dev]
report: {title: Test report, worst_k: 3}
"""

# How good each run is: probability of predicting the true class / noise on similarity.
QUALITY = {"cls": (0.55, 1.2), "sbert": (0.75, 0.6), "sst_only": (0.5, None), "ens": (0.7, 0.7)}


def _sst(rng, n, skill, labelled=True):
    labels = rng.integers(0, 5, n)
    pred = np.where(rng.random(n) < skill, labels, rng.integers(0, 5, n))
    probs = rng.dirichlet(np.ones(5), n) * 0.4
    probs[np.arange(n), pred] += 0.6
    sentences = [f"sentence {i} is {'NA' if i == 3 else 'fine'}" for i in range(n)]
    # Row 0: the most confident mistake of class 0, carrying markup and an ampersand.
    labels[0], pred[0] = 0, 4
    probs[0] = [0.0, 0.0, 0.01, 0.0, 0.99]
    sentences[0] = EVIL
    frame = pd.DataFrame({"id": [f"s{i:03d}" for i in range(n)], "sentence": sentences,
                          "label": labels if labelled else [None] * n, "prediction": pred})
    for k in range(5):
        frame[f"prob_{k}"] = probs[:, k].round(4)
    return frame


def _para(rng, n, skill):
    labels = rng.integers(0, 2, n)
    pred = np.where(rng.random(n) < skill, labels, 1 - labels)
    prob1 = np.where(pred == 1, 0.5 + 0.5 * rng.random(n), 0.5 * rng.random(n)).round(4)
    return pd.DataFrame({"id": [f"p{i:03d}" for i in range(n)],
                         "sentence1": [f"question {i} & more" for i in range(n)],
                         "sentence2": [f"other question {i}" for i in range(n)],
                         "label": labels, "prediction": pred, "prob_1": prob1})


def _sts(rng, n, noise):
    labels = rng.uniform(0, 5, n).round(1)
    pred = np.clip(labels + rng.normal(0, noise, n), 0, 5).round(3)
    labels[0], pred[0] = 0.0, 5.0                          # the worst pair
    s1 = [f"pair {i} left" for i in range(n)]
    s1[0] = EVIL
    return pd.DataFrame({"id": [f"t{i:03d}" for i in range(n)], "sentence1": s1,
                         "sentence2": [f"pair {i} right" for i in range(n)], "label": labels, "prediction": pred})


def _write_run(results: Path, rel: str, stage: str, name, seconds: float):
    path = results / rel / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": stage, "name": name, "git_revision": "abc1234",
                                "started": "2024-01-01T00:00:00+00:00", "wall_seconds": seconds,
                                "peak_rss_mib": 812.4, "platform": "Linux-x86_64", "torch": "2.13.0",
                                "cpu_count": 2, "threads": 2, "device": "cpu"}))


def build_inputs(root: Path) -> tuple[Path, Path]:
    """params.yaml and a results/ folder as the pipeline would leave them; returns both paths."""
    params_path = root / "params.yaml"
    params_path.write_text(PARAMS)
    results = root / "results"
    rng = np.random.default_rng(0)
    (results / "data").mkdir(parents=True)
    (results / "data" / "summary.json").write_text(json.dumps([
        {"source": "data/demo/ids-sst-train.csv", "rows_read": 120, "rows_kept": 118, "rows_dropped": 2,
         "dropped_by_reason": {"empty_sentence": 2}},
        {"source": "data/demo/ids-sts-dev.csv", "rows_read": 30, "rows_kept": 30, "rows_dropped": 0,
         "dropped_by_reason": {}}]))
    _write_run(results, "data", "prepare", None, 3.2)
    (results / "pretrain" / "mlm").mkdir(parents=True)
    pd.DataFrame({"epoch": [1, 2], "train_loss": [3.1, 2.4], "dev_loss": [3.3, 2.9]}).to_csv(
        results / "pretrain" / "mlm" / "history.csv", index=False)
    for name, (skill, noise) in QUALITY.items():
        kind = "ensembles" if name == "ens" else "experiments"
        folder = results / kind / name
        (folder / "predictions").mkdir(parents=True)
        frames = {("sst", "dev"): _sst(rng, 40, skill), ("sst", "test"): _sst(rng, 10, skill, labelled=False)}
        if noise is not None:
            frames[("para", "dev")] = _para(rng, 30, skill)
            frames[("sts", "dev")] = _sts(rng, 30, noise)
        if name == "sbert":                                 # test labels exist for sbert's SST only
            frames[("sst", "test")] = _sst(rng, 20, skill)
        for (task, split), frame in frames.items():
            frame.to_csv(folder / "predictions" / f"{task}-{split}.csv", index=False)
        dev, n = {}, {}
        for task, key in (("sst", "sst_acc"), ("para", "para_acc"), ("sts", "sts_pearson")):
            f = frames.get((task, "dev"))
            if f is not None:
                dev[key] = pearson(f.prediction, f.label) if task == "sts" else accuracy(f.prediction, f.label)
                n[task] = len(f)
        test = None
        if name == "sbert":
            f = frames[("sst", "test")]
            test = summarise({"sst_acc": accuracy(f.prediction, f.label)}) | {"n": {"sst": len(f)}}
        (folder / "metrics.json").write_text(json.dumps({"dev": summarise(dev) | {"n": n}, "test": test}))
        if kind == "experiments":
            tasks = ["sst"] if noise is None else ["sst", "para", "sts"]
            hist = {"epoch": [1, 2], "stage": ["+".join(tasks)] * 2, "lr": [2e-5, 1e-5], "seconds": [61.0, 59.5]}
            for t in tasks:
                m = "pearson" if t == "sts" else "acc"
                hist |= {f"train_{t}_loss": [1.2, 0.8], f"train_{t}_{m}": [0.4, 0.6],
                         f"dev_{t}_loss": [1.3, 1.1], f"dev_{t}_{m}": [0.35, 0.5]}
            (folder / "finetune").mkdir()
            pd.DataFrame(hist).to_csv(folder / "finetune" / "history.csv", index=False)
            _write_run(results, f"experiments/{name}/finetune", "finetune", name, 125.0)
            _write_run(results, f"experiments/{name}/predictions", "predict", name, 4.5)
        else:
            _write_run(results, f"ensembles/{name}", "ensemble", name, 1.0)
    return params_path, results


# ------------------------------------------------------------------ a tiny DOM from html.parser

class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self, tag=None, **attrs):
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and all(c.attrs.get(k.replace("_", "-")) == v
                                                         for k, v in attrs.items()):
                    yield c
                yield from c.iter(tag, **attrs)

    def find(self, tag=None, **attrs):
        return next(self.iter(tag, **attrs), None)


class TreeBuilder(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input", "source"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("root", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_endtag(self, tag):
        node = self.cur
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(path: Path) -> Node:
    builder = TreeBuilder()
    builder.feed(path.read_text(encoding="utf-8"))
    return builder.root


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    params_path, results = build_inputs(root)
    out = root / "reports"
    written = render_reports(params_path, results, out, progress=False)
    return {"params": params_path, "results": results, "out": out, "written": written,
            "final": parse(out / "final.html")}


def _metrics(results, name):
    kind = "ensembles" if name == "ens" else "experiments"
    return json.loads((results / kind / name / "metrics.json").read_text())


def test_pages_exist_for_every_experiment_and_ensemble(rendered):
    out = rendered["out"]
    assert sorted(p.name for p in (out / "experiments").iterdir()) == ["cls.html", "ens.html", "sbert.html",
                                                                       "sst_only.html"]
    assert (out / "final.html") in rendered["written"]


def test_study_table_numbers_best_cells_and_deltas(rendered):
    table = rendered["final"].find("table", id="table-heads")
    rows = {tr.attrs["data-row"]: tr for tr in table.iter("tr") if "data-row" in tr.attrs}
    assert list(rows) == ["cls", "sbert", "sst_only", "ens"]
    metrics = {name: _metrics(rendered["results"], name) for name in rows}
    headers = [(th.attrs["data-split"], th.attrs["data-key"]) for th in table.iter("th") if "data-key" in th.attrs]
    # dev: all five metrics; test: only SST accuracy has labels (sbert), the empty test columns are dropped
    assert headers == [("dev", k) for k in ("overall", "sst_acc", "para_acc", "sts_pearson", "mean")] + [("test", "sst_acc")]
    for split, key in headers:
        values = {n: (metrics[n][split] or {}).get(key) for n in rows}
        shown = [round(v, 3) for v in values.values() if v is not None]
        for name, tr in rows.items():
            td = tr.find("td", data_split=split, data_key=key)
            v = values[name]
            assert td.find("span", **{"class": "value"}).text() == (fmt_metric(v) if v is not None else "\u2014")
            assert ("best" in td.attrs["class"].split()) == (v is not None and len(shown) > 1 and round(v, 3) == max(shown))
            base = values["cls"]
            spans = [s for s in td.iter("span") if "delta" in s.attrs.get("class", "")]
            if name == "cls" or v is None or base is None:
                assert spans == []
            else:
                assert spans[0].text() == fmt_delta(v - base)
    # the SST-only row has no overall score: an em dash, never 0
    assert rows["sst_only"].find("td", data_split="dev", data_key="overall").text().strip() == "\u2014"
    assert fmt_delta(0.0123) == "+0.012" and fmt_delta(-0.0043) == "\u22120.004" and fmt_delta(1e-5) == "\u00b10.000"


def test_dev_only_study_has_no_test_columns(rendered):
    table = rendered["final"].find("table", id="table-lr")
    splits = {th.attrs["data-split"] for th in table.iter("th") if "data-split" in th.attrs}
    assert splits == {"dev"}


def test_ensemble_table_against_best_member(rendered):
    table = rendered["final"].find("table", id="table-ens")
    rows = [tr.attrs["data-row"] for tr in table.iter("tr") if "data-row" in tr.attrs]
    assert rows == ["cls", "sbert", "ens"]
    m = {n: _metrics(rendered["results"], n)["dev"]["overall"] for n in rows}
    best_member = max(["cls", "sbert"], key=m.get)
    base_tr = next(tr for tr in table.iter("tr") if tr.attrs.get("data-row") == best_member)
    assert "baseline" in base_tr.attrs.get("class", "")
    ens_td = next(tr for tr in table.iter("tr") if tr.attrs.get("data-row") == "ens").find(
        "td", data_split="dev", data_key="overall")
    assert fmt_delta(m["ens"] - m[best_member]) in ens_td.text()


def test_best_model_is_the_best_experiment_and_its_analysis_is_in_final(rendered):
    data = load_report_data(load_params(rendered["params"]), rendered["results"])
    overall = {n: _metrics(rendered["results"], n)["dev"].get("overall") for n in ("cls", "sbert", "sst_only")}
    expected = max((n for n in overall if overall[n] is not None), key=overall.get)
    assert best_experiment(data) == expected
    final = rendered["final"]
    assert expected in final.find("h2", id="best").text()
    for section in ("sst-analysis", "para-analysis", "sts-analysis"):
        assert final.find(id=section) is not None


def test_confusion_matrices_match_a_hand_count(rendered):
    page = parse(rendered["out"] / "experiments" / "sbert.html")
    frame = pd.read_csv(rendered["results"] / "experiments" / "sbert" / "predictions" / "sst-dev.csv")
    counts = Counter(zip(frame.label, frame.prediction))
    table = page.find("table", data_matrix="sst-counts")
    body = [tr for tr in table.find("tbody").iter("tr")][:5]
    for i, tr in enumerate(body):
        cells = [td.text() for td in tr.iter("td")][:5]
        assert cells == [str(counts.get((i, j), 0)) for j in range(5)]
    row_total = sum(counts.get((0, j), 0) for j in range(5))
    first_rate = page.find("table", data_matrix="sst-rates").find("tbody").find("td").text()
    assert first_rate == fmt_metric(counts.get((0, 0), 0) / row_total)
    para = pd.read_csv(rendered["results"] / "experiments" / "sbert" / "predictions" / "para-dev.csv")
    tp = int(((para.label == 1) & (para.prediction == 1)).sum())
    scores = [td.text() for td in page.find("table", data_matrix="para-scores").iter("td")]
    assert scores[1] == fmt_metric(tp / (para.prediction == 1).sum())      # precision
    assert scores[3] == fmt_metric(tp / (para.label == 1).sum())           # recall


def test_data_text_is_escaped(rendered):
    for path in [rendered["out"] / "final.html", rendered["out"] / "experiments" / "sbert.html"]:
        html = path.read_text(encoding="utf-8")
        assert "<script" not in html.lower()
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; friends" in html
        assert EVIL in parse(path).text()          # shown to the reader as text
    assert "CLS pooling &amp; cross-encoder heads" in (rendered["out"] / "final.html").read_text()


def test_pages_are_self_contained(rendered):
    out = rendered["out"]
    for path in [out / "final.html", *sorted((out / "experiments").iterdir())]:
        html = path.read_text(encoding="utf-8")
        assert "url(" not in html and "@import" not in html
        for node in parse(path).iter():
            for attr in ("src", "href"):
                ref = node.attrs.get(attr)
                if ref is None:
                    continue
                assert not ref.startswith(("http:", "https:", "//")), f"{path.name}: external {ref}"
                if attr == "src":
                    assert ref.startswith("data:image/png;base64,")
                elif not ref.startswith("#"):
                    assert (path.parent / ref.split("#")[0]).is_file(), f"{path.name}: broken link {ref}"


def test_partial_tasks_render_without_similarity_sections(rendered):
    page = parse(rendered["out"] / "experiments" / "sst_only.html")
    assert page.find(id="sst-analysis") is not None
    assert page.find(id="sts-analysis") is None and page.find(id="para-analysis") is None
    scores = page.find("table", **{"class": "scores"}).find("tr", data_split="dev")
    cells = [td.text() for td in scores.iter("td")]
    assert cells[1] == "\u2014" and cells[2] == fmt_metric(_metrics(rendered["results"], "sst_only")["dev"]["sst_acc"])
    params = page.find("table", **{"class": "kv params"})
    assert [td.text() for td in params.iter("td")] == ["finetune.tasks", '["sst"]', "pretrain", "mlm"]
    # its pretraining's loss curve comes before the fine-tuning curves
    curves = [h.text() for h in page.iter("h3")][:2]
    assert curves == ["pretrain", "finetune"] and "Further pretraining mlm" in page.text()


def test_worst_pairs_and_confident_mistakes_lead_with_the_planted_errors(rendered):
    page = parse(rendered["out"] / "experiments" / "cls.html")
    tables = list(page.iter("table", **{"class": "examples"}))
    first_rows = [t.find("tbody").find("tr") for t in tables]
    # SST class 0 (first group) and the STS worst pair both start with the planted row
    assert first_rows[0].find("code").text() == "s000"
    assert "0.990" in first_rows[0].text()
    sts_first = first_rows[-1]
    assert sts_first.find("code").text() == "t000" and "5.00" in sts_first.text()
    assert len(list(tables[-1].find("tbody").iter("tr"))) == 3                 # worst_k


def test_report_inputs_lists_what_the_report_reads(rendered, tmp_path):
    results = rendered["results"]
    inputs = set(report_inputs(rendered["params"], results))
    for rel in ["data/summary.json", "data/run.json", "experiments/cls/metrics.json",
                "experiments/sbert/predictions/sst-test.csv", "experiments/sst_only/predictions/sst-dev.csv",
                "experiments/cls/finetune/history.csv", "experiments/cls/finetune/run.json",
                "ensembles/ens/metrics.json", "ensembles/ens/predictions/sts-dev.csv",
                "pretrain/mlm/history.csv"]:
        assert results / rel in inputs
    assert rendered["params"] in inputs
    assert results / "experiments/sst_only/predictions/sts-dev.csv" not in inputs   # not trained
    # before anything ran, the files the pipeline will produce are listed all the same
    fresh = set(report_inputs(rendered["params"], tmp_path / "nothing"))
    assert tmp_path / "nothing/experiments/cls/predictions/sts-dev.csv" in fresh
    assert tmp_path / "nothing/ensembles/ens/metrics.json" in fresh


def test_list_inputs_flag_prints_them(rendered, capsys):
    from stages.report import main

    main(["--params", str(rendered["params"]), "--results", str(rendered["results"]), "--list-inputs"])
    printed = capsys.readouterr().out.splitlines()
    assert printed == [str(p) for p in report_inputs(rendered["params"], rendered["results"])]


@pytest.mark.slow
def test_cli_renders_and_reports_bad_input(rendered, tmp_path):
    cmd = [sys.executable, "-m", "stages.report", "--params", str(rendered["params"]),
           "--results", str(rendered["results"]), "--out", str(tmp_path / "r")]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    # deterministic: a second rendering of the same inputs is byte-identical, images included
    for page in ["final.html", "experiments/cls.html", "experiments/ens.html"]:
        assert (tmp_path / "r" / page).read_bytes() == (rendered["out"] / page).read_bytes()

    broken = tmp_path / "broken"
    shutil.copytree(rendered["results"], broken)
    (broken / "experiments" / "cls" / "metrics.json").write_text("{not json")
    bad = subprocess.run(cmd[:6] + [str(broken), "--out", str(tmp_path / "b")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ") and "cls/metrics.json" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_missing_prediction_column_is_a_one_line_error(rendered, tmp_path):
    from minbert.errors import MinBertError

    broken = tmp_path / "broken"
    shutil.copytree(rendered["results"], broken)
    path = broken / "experiments" / "sbert" / "predictions" / "sts-dev.csv"
    pd.read_csv(path).drop(columns=["prediction"]).to_csv(path, index=False)
    with pytest.raises(MinBertError, match=r"sts-dev.csv: missing column\(s\) prediction"):
        render_reports(rendered["params"], broken, tmp_path / "out", progress=False)


def test_missing_results_render_as_dashes(tmp_path):
    params_path = tmp_path / "params.yaml"
    params_path.write_text("experiments: {a: {}, b: {seed: 2}}\nstudies: [{name: s, title: S, experiments: [a, b]}]\n")
    stale = tmp_path / "reports" / "experiments" / "removed_experiment.html"
    stale.parent.mkdir(parents=True)
    stale.write_text("old page")
    render_reports(params_path, tmp_path / "results", tmp_path / "reports", progress=False)
    assert sorted(p.name for p in stale.parent.iterdir()) == ["a.html", "b.html"]
    page = parse(tmp_path / "reports" / "final.html")
    assert "No results yet for a, b" in page.text()
    assert page.find(id="best").text().startswith("Error analysis of the best model")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="headless chromium is not installed (apt-get install chromium)")
def test_screenshots_in_headless_chromium(rendered, tmp_path):
    out = tmp_path / "shots"
    run = subprocess.run([sys.executable, "scripts/screenshot_reports.py", "--reports", str(rendered["out"]),
                          "--out", str(out), "--experiment", "sbert"],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    shots = sorted(out.glob("*.png"))
    assert [p.name for p in shots] == ["experiment-sbert.png", "final.png"]
    for p in shots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000


def test_best_model_without_overall_uses_the_mean_of_its_task_scores(tmp_path):
    params_path = tmp_path / "params.yaml"
    params_path.write_text("experiments: {a: {finetune: {tasks: [sst]}}, b: {finetune: {tasks: [sst, para]}},"
                           " c: {}}\nensembles: {e: {members: [a, b]}}\n")
    for name, dev in {"a": {"sst_acc": 0.6}, "b": {"sst_acc": 0.5, "para_acc": 0.8}}.items():
        (tmp_path / "results" / "experiments" / name).mkdir(parents=True)
        (tmp_path / "results" / "experiments" / name / "metrics.json").write_text(json.dumps({"dev": dev, "test": None}))
    (tmp_path / "results" / "ensembles" / "e").mkdir(parents=True)      # an ensemble never counts
    (tmp_path / "results" / "ensembles" / "e" / "metrics.json").write_text(json.dumps({"dev": {"sst_acc": 0.99}}))
    data = load_report_data(load_params(params_path), tmp_path / "results")
    assert best_experiment(data) == "b"                                  # (0.5 + 0.8) / 2 > 0.6
    render_reports(params_path, tmp_path / "results", tmp_path / "reports", progress=False)
    callout = parse(tmp_path / "reports" / "final.html").find("div", **{"class": "callout"}).text()
    assert "b" in callout and "mean of its task scores 0.650" in callout


def test_history_table_shows_epochs_text_and_scores(rendered):
    page = parse(rendered["out"] / "experiments" / "cls.html")
    table = page.find("table", **{"class": "history"})
    assert [th.text() for th in table.iter("th")][:5] == ["epoch", "stage", "lr", "seconds", "train_sst_loss"]
    first = [td.text() for td in table.find("tbody").find("tr").iter("td")][:5]
    assert first == ["1", "sst+para+sts", "2.00e-05", "1 min 01 s", "1.200"]


def test_shipped_params_render_before_anything_ran(tmp_path):
    """The project's own params.yaml: every study and experiment gets its table row and page."""
    params = load_params(REPO / "params.yaml")
    render_reports(params, tmp_path / "results", tmp_path / "reports", progress=False)
    final = parse(tmp_path / "reports" / "final.html")
    for study in params.params.studies:
        rows = [tr.attrs["data-row"] for tr in final.find("table", id=f"table-{study.name}").iter("tr")
                if "data-row" in tr.attrs]
        assert rows == study.experiments
    pages = {p.stem for p in (tmp_path / "reports" / "experiments").iterdir()}
    assert pages == set(params.experiments) | set(params.params.ensembles)
