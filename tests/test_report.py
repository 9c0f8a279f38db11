"""The report stage: rendered from small fixed inputs, then parsed back and checked against the
metrics files, the predictions (confusion matrices counted by hand, intervals and paired
differences recomputed with minbert.scoring.stats on the same files), escaping, self-containment and
determinism."""
from __future__ import annotations

import functools
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
from conftest import error_line

from minbert.core.layout import Layout
from minbert.core.tasks import TASKS
from minbert.params import load_params
from minbert.report.data import load_report_data
from minbert.report.best import best_model
from minbert.report.formats import fmt_delta, fmt_interval, fmt_metric, fmt_std
from minbert.report.render import render_reports
from minbert.report.scores import ScoreBook, metric_columns
from minbert.scoring import stats
from minbert.scoring.evaluate import evaluate_folder

REPO = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script> & friends"
DASH, PM = "\u2014", "\u00b1"

PARAMS = """\
data: {include_cfimdb: true}
base:
  finetune: {epochs: 2}
experiments:
  cls: {description: "CLS pooling & cross-encoder heads"}
  sbert: {finetune: {lr: 1.0e-4, heads: {para: concat, sts: cosine}}}
  sst_only: {finetune: {tasks: [sst]}, pretrain: mlm}
  twin: {description: same predictions as cls, seed: 5}
  near: {description: cls with one more SST sentence right, seed: 6}
  rr: {description: round-robin over three seeds, repeats: [1, 2, 3]}
  imdb: {finetune: {tasks: [sst, cfimdb]}}
pretrainings:
  mlm: {kind: mlm}
ensembles:
  ens: {members: [cls, sbert]}
  seeds: {members: [rr], classification: mean_prob, similarity: mean}
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
  - name: noise
    title: Differences within the noise
    experiments: [cls, twin, near]
  - name: repeated
    title: Seeds
    experiments: [cls, rr, seeds]
    baseline: rr
  - name: binary
    title: Binary sentiment
    experiments: [sst_only, imdb]
report: {title: Test report, worst_k: 3}
"""
N = {"sst": 300, "para": 240, "sts": 160, "cfimdb": 120}
# How good each run is: probability of predicting the true class / noise on similarity.
QUALITY = {"cls": (0.55, 1.2), "sbert": (0.8, 0.5), "sst_only": (0.5, None), "ens": (0.65, 0.9),
           "rr.seed1": (0.6, 1.0), "rr.seed2": (0.62, 0.95), "rr.seed3": (0.58, 1.05), "seeds": (0.62, 0.9),
           "imdb": (0.6, None)}
ENSEMBLES = ("ens", "seeds")


def _truth(task: str, n: int, seed: int = 0) -> np.ndarray:
    """The labels of a task's dev (or test) examples: the same for every run."""
    rng = np.random.default_rng([seed, n, len(task)])
    if TASKS[task].kind == "regression":
        labels = rng.uniform(0, 5, n).round(1)
    else:
        labels = rng.integers(0, len(TASKS[task].classes), n)
    labels[0] = 0                                              # the planted mistakes below
    return labels


def _classification(rng, task, skill, labels, labelled=True):
    n, k = len(labels), len(TASKS[task].classes)
    prefix = {"sst": "s", "para": "p", "cfimdb": "c"}[task]
    other = (labels + rng.integers(1, k, n)) % k
    pred = np.where(rng.random(n) < skill, labels, other)
    pred[0] = k - 1                                            # row 0: a confident mistake (true class 0)
    frame = pd.DataFrame({"id": [f"{prefix}{i:03d}" for i in range(n)]})
    if TASKS[task].pair:
        frame["sentence1"] = [f"question {i} & more" for i in range(n)]
        frame["sentence2"] = [f"other question {i}" for i in range(n)]
    else:
        texts = [f"sentence {i} is {'NA' if i == 3 else 'fine'}" for i in range(n)]
        texts[0] = EVIL
        frame["sentence"] = texts
    frame["label"] = labels if labelled else [None] * n
    frame["prediction"] = pred
    if TASKS[task].kind == "classification":
        probs = rng.dirichlet(np.ones(k), n) * 0.4
        probs[np.arange(n), pred] += 0.6
        probs[0] = [0.0, 0.0, 0.01, 0.0, 0.99]
        for j in range(k):
            frame[f"prob_{j}"] = probs[:, j].round(4)
    else:
        prob1 = np.where(pred == 1, 0.5 + 0.5 * rng.random(n), 0.5 * rng.random(n)).round(4)
        prob1[0] = 0.99
        frame["prob_1"] = prob1
    return frame


def _sts(rng, noise, labels):
    n = len(labels)
    pred = np.clip(labels + rng.normal(0, noise, n), 0, 5).round(3)
    pred[0] = 5.0                                              # the worst pair (its label is 0)
    s1 = [f"pair {i} left" for i in range(n)]
    s1[0] = EVIL
    return pd.DataFrame({"id": [f"t{i:03d}" for i in range(n)], "sentence1": s1,
                         "sentence2": [f"pair {i} right" for i in range(n)], "label": labels, "prediction": pred})


def _write_run(layout: Layout, stage: str, name, seconds: float):
    path = Path(layout.run_record(stage, name))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": stage, "name": name, "git_revision": "abc1234",
                                "started": "2024-01-01T00:00:00+00:00", "wall_seconds": seconds,
                                "peak_rss_mib": 812.4, "platform": "Linux-x86_64", "torch": "2.13.0",
                                "cpu_count": 2, "threads": 2, "device": "cpu"}))


def _frames(name: str, rng, quality: dict = QUALITY) -> dict:
    skill, noise = quality[name]
    dev = {t: _truth(t, n) for t, n in N.items()}
    frames = {("sst", "dev"): _classification(rng, "sst", skill, dev["sst"]),
              ("sst", "test"): _classification(rng, "sst", skill, _truth("sst", 10, 1), labelled=False)}
    if noise is not None:
        frames[("para", "dev")] = _classification(rng, "para", skill, dev["para"])
        frames[("sts", "dev")] = _sts(rng, noise, dev["sts"])
    if name == "imdb":
        frames[("cfimdb", "dev")] = _classification(rng, "cfimdb", 0.8, dev["cfimdb"])
    if name == "sbert":                                     # test labels exist for sbert's SST only
        frames[("sst", "test")] = _classification(rng, "sst", skill, _truth("sst", 200, 2))
    return frames


def build_inputs(root: Path, params: str = PARAMS, quality: dict = QUALITY) -> tuple[Path, Layout]:
    """params.yaml and a results/ folder as the pipeline would leave them (metrics.json written by
    minbert.scoring.evaluate from the predictions) for the runs of `quality`; returns the params path and
    the layout."""
    params_path = root / "params.yaml"
    params_path.write_text(params)
    layout = Layout(str(root / "results"), str(root / "reports"))
    rng = np.random.default_rng(0)
    Path(layout.data).mkdir(parents=True)
    Path(layout.data_summary).write_text(json.dumps([
        {"source": "data/demo/ids-sst-train.csv", "rows_read": 120, "rows_kept": 118, "rows_dropped": 2,
         "dropped_by_reason": {"empty_sentence": 2}},
        {"source": "data/demo/ids-sts-dev.csv", "rows_read": 30, "rows_kept": 30, "rows_dropped": 0,
         "dropped_by_reason": {}}]))
    _write_run(layout, "prepare", None, 3.2)
    Path(layout.pretrain("mlm")).mkdir(parents=True)
    pd.DataFrame({"epoch": [1, 2], "train_loss": [3.1, 2.4], "dev_loss": [3.3, 2.9]}).to_csv(
        layout.pretrain_history("mlm"), index=False)
    runs = {name: _frames(name, rng, quality) for name in quality}
    if params is PARAMS:
        runs["twin"] = {k: f.copy() for k, f in runs["cls"].items()}
        near = {k: f.copy() for k, f in runs["cls"].items()}
        sst = near[("sst", "dev")]
        fix = sst.index[(sst["prediction"] != sst["label"])][1]          # one more right (not the planted row)
        sst.loc[fix, "prediction"] = sst.loc[fix, "label"]
        runs["near"] = near
    for name, frames in runs.items():
        ensemble = name in ENSEMBLES
        folder = Path(layout.ensemble_predictions(name) if ensemble else layout.predictions(name))
        folder.mkdir(parents=True)
        for (task, split), frame in frames.items():
            frame.to_csv(folder / f"{task}-{split}.csv", index=False)
        metrics = Path(layout.ensemble_metrics(name) if ensemble else layout.metrics(name))
        metrics.write_text(json.dumps(evaluate_folder(folder)))
        if ensemble:
            _write_run(layout, "ensemble", name, 1.0)
            continue
        tasks = sorted({t for t, _ in frames}, key=list(TASKS).index)
        hist = {"epoch": [1, 2], "stage": ["+".join(tasks)] * 2, "lr": [2e-5, 1e-5], "seconds": [61.0, 59.5]}
        for t in tasks:
            m = TASKS[t].metric
            hist |= {f"train_{t}_loss": [1.2, 0.8], f"train_{t}_{m}": [0.4, 0.6],
                     f"dev_{t}_loss": [1.3, 1.1], f"dev_{t}_{m}": [0.35, 0.5]}
        Path(layout.training(name, "finetune")).mkdir(parents=True)
        pd.DataFrame(hist).to_csv(layout.history(name, "finetune"), index=False)
        _write_run(layout, "finetune", name, 125.0)
        _write_run(layout, "predict", name, 4.5)
    return params_path, layout


# ------------------------------------------------------------------ the expected numbers, from the files

def _folder(layout: Layout, name: str) -> Path:
    return Path(layout.ensemble_predictions(name) if name in ENSEMBLES else layout.predictions(name))


def _metrics(layout: Layout, name: str) -> dict:
    return json.loads(Path(layout.ensemble_metrics(name) if name in ENSEMBLES else layout.metrics(name)).read_text())


def _read(layout: Layout, name: str, task: str, split: str) -> pd.DataFrame | None:
    path = _folder(layout, name) / f"{task}-{split}.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, dtype={"id": str})
    return frame if frame["label"].notna().any() else None


@functools.lru_cache(maxsize=None)
def expected(layout: Layout, name: str, split: str, key: str) -> stats.Estimate | None:
    """minbert.scoring.stats on the predictions files, one run (or a group's seeds) at a time."""
    params = load_params(Path(layout.results).parent / "params.yaml")
    if name in params.groups:
        seeds = [expected(layout, s, split, key) for s in params.groups[name]]
        return stats.seed_mean(seeds, name) if all(seeds) else None
    by_task = {}
    for task in TASKS:
        frame = _read(layout, name, task, split)
        if frame is not None:
            by_task[task] = stats.task_estimate(task, stats.Sample.of(frame))
    if key in ("overall", "mean"):
        return stats.overall_estimates(by_task).get(key)
    task = next(t for t in TASKS if TASKS[t].metric_key == key)
    return by_task.get(task)


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
    params_path, layout = build_inputs(root)
    written = render_reports(load_params(params_path), layout, progress=False)
    out = Path(layout.reports)
    return {"params": params_path, "layout": layout, "out": out, "written": written,
            "final": parse(out / "final.html")}


def _rows(table) -> dict:
    return {tr.attrs["data-row"]: tr for tr in table.iter("tr") if "data-row" in tr.attrs}


def _span(td, cls):
    return next((s for s in td.iter("span") if cls in s.attrs.get("class", "").split()), None)


def _headers(table) -> list:
    return [(th.attrs["data-split"], th.attrs["data-key"]) for th in table.iter("th") if "data-key" in th.attrs]


def test_pages_exist_for_every_experiment_seed_and_ensemble(rendered):
    out = rendered["out"]
    assert sorted(p.name for p in (out / "experiments").iterdir()) == [".written.json",
        "cls.html", "ens.html", "imdb.html", "near.html", "rr.seed1.html", "rr.seed2.html", "rr.seed3.html",
        "sbert.html", "seeds.html", "sst_only.html", "twin.html"]
    assert (out / "final.html") in rendered["written"]


def test_summary_metrics_hold_every_run_overall_score(rendered):
    """results/metrics.json, the one file DVC compares: each run's overall dev and test score as its
    own metrics.json has it; a run without an overall score is left out rather than shown as 0."""
    layout = rendered["layout"]
    summary = json.loads(Path(layout.summary_metrics).read_text())
    expected = {}
    for folder in [*Path(layout.results, "experiments").iterdir(), *Path(layout.results, "ensembles").iterdir()]:
        if (folder / "metrics.json").is_file():
            m = json.loads((folder / "metrics.json").read_text())
            scores = {s: m[s]["overall"] for s in ("dev", "test") if (m.get(s) or {}).get("overall") is not None}
            if scores:
                expected[folder.name] = scores
    assert expected and summary == expected
    assert all(set(v) <= {"dev", "test"} for v in summary.values())


def test_study_table_values_intervals_deltas_and_best_marks(rendered):
    """Every cell of every table against minbert.scoring.stats on the same files: the value (metrics.json),
    its interval, the difference from the baseline with its paired interval, the significance mark
    (only when the interval excludes 0) and the best mark (only when the best is significantly
    better than the second best)."""
    layout, final = rendered["layout"], rendered["final"]
    params = load_params(rendered["params"])
    checked_stars = checked_plain = 0
    for study in params.params.studies:
        table = final.find("table", id=f"table-{study.name}")
        rows = _rows(table)
        assert list(rows) == study.experiments
        baseline = study.baseline or study.experiments[0]
        for split, key in _headers(table):
            values, ests = {}, {}
            for name in rows:
                members = params.groups.get(name, [name])
                vals = [v for m in members if (v := (_metrics(layout, m)[split] or {}).get(key)) is not None]
                values[name] = float(np.mean(vals)) if vals else None
                ests[name] = expected(layout, name, split, key) if vals else None
            for name, tr in rows.items():
                td = tr.find("td", data_split=split, data_key=key)
                v = values[name]
                assert _span(td, "value").text() == fmt_metric(v)
                ci = _span(td, "ci")
                if v is None:
                    assert ci is None
                    continue
                assert ci.text() == fmt_interval(ests[name].interval())
                delta = _span(td, "delta")
                if name == baseline or values[baseline] is None:
                    assert delta is None
                    continue
                diff = ests[name].minus(ests[baseline])
                assert delta.text().rstrip("*") == fmt_delta(v - values[baseline])
                assert fmt_interval(diff.interval(), signed=True) in delta.attrs["title"]
                assert delta.text().endswith("*") == diff.significant()
                assert ("sig" in delta.attrs["class"].split()) == diff.significant()
                checked_stars += diff.significant()
                checked_plain += not diff.significant()
            ranked = sorted((n for n in rows if values[n] is not None), key=lambda n: -values[n])
            marked = [n for n in rows if "best" in rows[n].find("td", data_split=split, data_key=key).attrs["class"].split()]
            if len(ranked) < 2 or values[ranked[0]] == values[ranked[1]]:
                assert marked == []
            else:
                significant = ests[ranked[0]].minus(ests[ranked[1]]).interval().low > 0
                assert marked == ([ranked[0]] if significant else [])
    assert checked_stars > 5 and checked_plain > 5                 # both kinds occur in these inputs


def test_differences_within_the_noise_are_not_marked(rendered):
    table = rendered["final"].find("table", id="table-noise")
    text = "".join(td.text() for td in table.iter("td"))
    assert "*" not in text and not any("best" in td.attrs.get("class", "") for td in table.iter("td"))
    twin = _rows(table)["twin"].find("td", data_split="dev", data_key="sst_acc")
    assert _span(twin, "delta").text() == "\u00b10.000"
    assert "[\u00b10.000, \u00b10.000]" in _span(twin, "delta").attrs["title"]     # identical: zero width
    near = _rows(table)["near"].find("td", data_split="dev", data_key="sst_acc")
    assert _span(near, "delta").text() == fmt_delta(1 / N["sst"]) and "not significant" in _span(near, "delta").attrs["title"]
    assert "tied with" not in near.attrs.get("title", "") and "not significantly better than cls" in near.attrs["title"]


def test_a_clearly_better_row_is_marked(rendered):
    rows = _rows(rendered["final"].find("table", id="table-heads"))
    for key in ("overall", "para_acc", "sts_pearson"):
        td = rows["sbert"].find("td", data_split="dev", data_key=key)
        assert "best" in td.attrs["class"].split() and "significantly better than ens" in td.attrs["title"]
        assert _span(td, "delta").text().endswith("*")


def test_repeated_experiment_rows_show_mean_std_and_each_seed(rendered):
    layout = rendered["layout"]
    table = rendered["final"].find("table", id="table-repeated")
    rr = _rows(table)["rr"]
    assert "group" in rr.attrs["class"].split() and "baseline" in rr.attrs["class"].split()
    assert "3 seeds" in rr.find("td").text() and rr.find("td").find("a") is None     # no page of its own
    seeds = ["rr.seed1", "rr.seed2", "rr.seed3"]
    for split, key in _headers(table):
        values = [_metrics(layout, s)["dev"][key] for s in seeds]
        td = rr.find("td", data_split=split, data_key=key)
        assert _span(td, "value").text() == fmt_metric(np.mean(values))
        assert _span(td, "std").text() == fmt_std(np.std(values, ddof=1))
        assert _span(td, "ci").text() == fmt_interval(expected(layout, "rr", split, key).interval())
    subs = [tr for tr in table.iter("tr") if tr.attrs.get("data-group") == "rr"]
    assert [tr.attrs["data-seed-row"] for tr in subs] == seeds
    for tr, seed in zip(subs, seeds):
        assert tr.find("a").attrs["href"] == f"experiments/{seed}.html" and tr.find("a").text() == f"seed {seed[-1]}"
        for split, key in _headers(table):
            td = tr.find("td", data_split=split, data_key=key)
            assert _span(td, "value").text() == fmt_metric(_metrics(layout, seed)["dev"][key])
            assert _span(td, "ci").text() == fmt_interval(expected(layout, seed, split, key).interval())
            assert _span(td, "delta") is None and "best" not in td.attrs["class"]
    assert "mean \u00b1 std over n seeds" in rendered["final"].find("section", id="study-repeated").text()
    # the seed ensemble (members: [rr]) is scored against the group's mean
    ens_td = _rows(table)["seeds"].find("td", data_split="dev", data_key="overall")
    diff = expected(layout, "seeds", "dev", "overall").minus(expected(layout, "rr", "dev", "overall"))
    assert fmt_interval(diff.interval(), signed=True) in _span(ens_td, "delta").attrs["title"]


def test_seed_ensemble_expands_the_group_and_seed_pages_link_back(rendered):
    table = rendered["final"].find("table", id="table-seeds")
    assert list(_rows(table)) == ["rr.seed1", "rr.seed2", "rr.seed3", "seeds"]
    page = parse(rendered["out"] / "experiments" / "rr.seed2.html")
    assert "repeated experiment rr" in page.text() and "Seeds" in page.text()
    assert [a.attrs["href"] for a in page.iter("a") if a.attrs.get("href", "").startswith("rr.")] == [
        "rr.seed1.html", "rr.seed3.html"]


def test_every_table_explains_its_marks(rendered):
    final = rendered["final"]
    for table in final.iter("table", **{"class": "results"}):
        legend = table.parent.parent.find("p", **{"class": "note legend"})
        assert legend is not None and "paired-bootstrap" in legend.text() and "2,000 resamples" in legend.text()


def test_dev_only_study_has_no_test_columns(rendered):
    table = rendered["final"].find("table", id="table-lr")
    splits = {th.attrs["data-split"] for th in table.iter("th") if "data-split" in th.attrs}
    assert splits == {"dev"}


def test_test_split_scores_carry_intervals(rendered):
    layout = rendered["layout"]
    table = rendered["final"].find("table", id="table-heads")
    assert ("test", "sst_acc") in _headers(table)
    td = _rows(table)["sbert"].find("td", data_split="test", data_key="sst_acc")
    assert _span(td, "ci").text() == fmt_interval(expected(layout, "sbert", "test", "sst_acc").interval())
    assert _rows(table)["cls"].find("td", data_split="test", data_key="sst_acc").text().strip() == DASH


def test_cfimdb_column_and_analysis(rendered):
    layout = rendered["layout"]
    table = rendered["final"].find("table", id="table-binary")
    assert ("dev", "cfimdb_acc") in _headers(table)
    assert ("dev", "cfimdb_acc") not in _headers(rendered["final"].find("table", id="table-heads"))
    td = _rows(table)["imdb"].find("td", data_split="dev", data_key="cfimdb_acc")
    assert _span(td, "value").text() == fmt_metric(_metrics(layout, "imdb")["dev"]["cfimdb_acc"])
    assert _span(td, "ci").text() == fmt_interval(expected(layout, "imdb", "dev", "cfimdb_acc").interval())
    page = parse(rendered["out"] / "experiments" / "imdb.html")
    assert page.find(id="cfimdb-analysis") is not None and page.find(id="sst-analysis") is not None
    assert page.find(id="para-analysis") is None and page.find(id="sts-analysis") is None
    frame = pd.read_csv(_folder(layout, "imdb") / "cfimdb-dev.csv")
    counts = Counter(zip(frame.label, frame.prediction))
    body = list(page.find("table", data_matrix="cfimdb-counts").find("tbody").iter("tr"))[:2]
    for i, tr in enumerate(body):
        assert [td.text() for td in tr.iter("td")][:2] == [str(counts.get((i, j), 0)) for j in range(2)]
    summaries = [s.text() for s in page.find(id="cfimdb-analysis").parent.iter("summary")]
    assert any(s.startswith("False positives (true: negative)") for s in summaries)


def test_ensemble_table_against_best_member(rendered):
    layout = rendered["layout"]
    table = rendered["final"].find("table", id="table-ens")
    rows = _rows(table)
    assert list(rows) == ["cls", "sbert", "ens"]
    m = {n: _metrics(layout, n)["dev"]["overall"] for n in rows}
    best_member = max(["cls", "sbert"], key=m.get)
    assert "baseline" in rows[best_member].attrs.get("class", "")
    ens_td = rows["ens"].find("td", data_split="dev", data_key="overall")
    assert fmt_delta(m["ens"] - m[best_member]) in ens_td.text()


def test_experiment_page_scores_carry_intervals(rendered):
    layout = rendered["layout"]
    page = parse(rendered["out"] / "experiments" / "sbert.html")
    table = page.find("table", **{"class": "scores"})
    for split in ("dev", "test"):
        columns = [c for c in metric_columns() if c[0] != "cfimdb_acc"]     # sbert has no CFIMDB
        assert [th.text() for th in table.iter("th")][1:1 + len(columns)] == [h for _, h, _ in columns]
        cells = list(table.find("tr", data_split=split).iter("td"))[1:1 + len(columns)]
        for td, (key, _, _) in zip(cells, columns):
            value = (_metrics(layout, "sbert")[split] or {}).get(key)
            assert _span(td, "value").text() == fmt_metric(value)
            est = expected(layout, "sbert", split, key) if value is not None else None
            assert (_span(td, "ci").text() if est else None) == (fmt_interval(est.interval()) if est else None)


def test_best_model_is_the_best_experiment_and_its_analysis_is_in_final(rendered):
    layout = rendered["layout"]
    data = load_report_data(load_params(rendered["params"]), layout)
    seeds = data.params.groups["rr"]
    overall = {n: _metrics(layout, n)["dev"].get("overall") for n in data.params.experiments if n not in seeds}
    overall["rr"] = float(np.mean([_metrics(layout, n)["dev"]["overall"] for n in seeds]))
    expected_best = max((n for n in overall if overall[n] is not None), key=overall.get)
    assert best_model(data, ScoreBook(data)).name == expected_best
    final = rendered["final"]
    assert expected_best in final.find("h2", id="best").text()
    for section in ("sst-analysis", "para-analysis", "sts-analysis"):
        assert final.find(id=section) is not None
    heading = final.find(id="sst-analysis").text()
    assert fmt_interval(expected(layout, expected_best, "dev", "sst_acc").interval()) in heading


def test_confusion_matrices_match_a_hand_count(rendered):
    layout = rendered["layout"]
    page = parse(rendered["out"] / "experiments" / "sbert.html")
    frame = pd.read_csv(_folder(layout, "sbert") / "sst-dev.csv")
    counts = Counter(zip(frame.label, frame.prediction))
    table = page.find("table", data_matrix="sst-counts")
    body = [tr for tr in table.find("tbody").iter("tr")][:5]
    for i, tr in enumerate(body):
        cells = [td.text() for td in tr.iter("td")][:5]
        assert cells == [str(counts.get((i, j), 0)) for j in range(5)]
    row_total = sum(counts.get((0, j), 0) for j in range(5))
    first_rate = page.find("table", data_matrix="sst-rates").find("tbody").find("td").text()
    assert first_rate == fmt_metric(counts.get((0, 0), 0) / row_total)
    para = pd.read_csv(_folder(layout, "sbert") / "para-dev.csv")
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
    assert cells[1] == DASH and cells[2].startswith(fmt_metric(_metrics(rendered["layout"], "sst_only")["dev"]["sst_acc"]))
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


def test_rendering_is_deterministic(rendered, tmp_path):
    """The same inputs give byte-identical pages (bootstrap seeded, images without timestamps)."""
    layout = rendered["layout"]
    again = Layout(layout.results, str(tmp_path / "again"))
    render_reports(load_params(rendered["params"]), again, progress=False)
    out = rendered["out"]
    for path in [out / "final.html", *sorted((out / "experiments").iterdir())]:
        assert (tmp_path / "again" / path.relative_to(out)).read_bytes() == path.read_bytes(), path.name


def test_report_job_reads_every_seed_and_ensemble(rendered):
    from minbert.pipeline.plan import pipeline

    layout = rendered["layout"]
    reads = next(j for j in pipeline(rendered["params"], layout) if j.stage == "report").read_paths
    for name in ("rr.seed1", "rr.seed2", "rr.seed3", "cls", "imdb"):
        assert f"{layout.predictions(name)}/sst-dev.csv" in reads and layout.metrics(name) in reads
    assert f"{layout.ensemble_predictions('seeds')}/sst-dev.csv" in reads


def test_mismatched_ids_and_stale_metrics_are_reported_not_hidden(rendered, tmp_path):
    from minbert.report.tables import study_tables

    layout = rendered["layout"]
    broken = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    shutil.copytree(layout.results, broken.results)
    path = Path(broken.predictions("twin")) / "sst-dev.csv"          # twin scored on other sentences
    frame = pd.read_csv(path, dtype={"id": str})
    frame.loc[5, "id"] = "other"
    frame.to_csv(path, index=False)
    metrics = json.loads(Path(broken.metrics("near")).read_text())   # near's metrics.json is stale
    metrics["dev"]["sst_acc"] += 0.01
    Path(broken.metrics("near")).write_text(json.dumps(metrics))
    data = load_report_data(load_params(rendered["params"]), broken)
    table = next(t for t in study_tables(data, ScoreBook(data)) if t.name == "noise")
    assert "twin and cls were scored on different examples: their difference is not tested" in " ".join(table.notes)
    assert any(n.startswith("The predictions of near give dev sst_acc") and "re-run its evaluate stage" in n
               for n in table.notes)
    rows = {r.name: r for r in table.rows}
    twin = rows["twin"].cells[("dev", "sst_acc")]
    assert twin.interval is not None and twin.delta == 0 and twin.delta_interval is None and not twin.significant
    near = rows["near"].cells[("dev", "sst_acc")]
    assert near.interval is None and near.value == metrics["dev"]["sst_acc"] and near.delta_interval is None


@pytest.mark.slow
def test_cli_renders_and_reports_bad_input(rendered, tmp_path):
    layout = rendered["layout"]
    cmd = [sys.executable, "-m", "stages.report", "--params", str(rendered["params"]),
           "--results", layout.results, "--out", str(tmp_path / "r")]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    # deterministic: a second rendering of the same inputs is byte-identical, images included
    for page in ["final.html", "experiments/cls.html", "experiments/ens.html", "experiments/rr.seed1.html"]:
        assert (tmp_path / "r" / page).read_bytes() == (rendered["out"] / page).read_bytes()

    broken = tmp_path / "broken"
    shutil.copytree(layout.results, broken)
    (broken / "experiments" / "cls" / "metrics.json").write_text("{not json")
    bad = subprocess.run(cmd[:6] + [str(broken), "--out", str(tmp_path / "b")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert "cls/metrics.json" in error_line(bad.stderr)


def test_missing_prediction_column_is_a_one_line_error(rendered, tmp_path):
    from minbert.core.errors import MinBertError

    broken = Layout(str(tmp_path / "broken"), str(tmp_path / "out"))
    shutil.copytree(rendered["layout"].results, broken.results)
    path = Path(broken.predictions("sbert")) / "sts-dev.csv"
    pd.read_csv(path).drop(columns=["prediction"]).to_csv(path, index=False)
    with pytest.raises(MinBertError, match=r"sts-dev.csv: missing column\(s\) prediction"):
        render_reports(load_params(rendered["params"]), broken, progress=False)


def test_missing_results_render_as_dashes(tmp_path):
    params_path = tmp_path / "params.yaml"
    params_path.write_text("experiments: {a: {}, b: {seed: 2}, c: {repeats: 2}}\n"
                           "studies: [{name: s, title: S, experiments: [a, b, c]}]\n")
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    stale = Path(layout.experiment_report("removed_experiment"))
    stale.parent.mkdir(parents=True)
    stale.write_text("old page")                      # an earlier rendering wrote it (its manifest says so)
    (stale.parent / ".written.json").write_text('["removed_experiment.html"]')
    (stale.parent / "mine.html").write_text("a page of the user's own")
    render_reports(load_params(params_path), layout, progress=False)
    assert sorted(p.name for p in stale.parent.iterdir()) == [".written.json", "a.html", "b.html", "c.seed11711.html",
                                                               "c.seed11712.html", "mine.html"]
    page = parse(Path(layout.final_report))
    assert "No results yet for a, b, c" in page.text()
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
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    for name, dev in {"a": {"sst_acc": 0.6}, "b": {"sst_acc": 0.5, "para_acc": 0.8}}.items():
        Path(layout.experiment(name)).mkdir(parents=True)
        Path(layout.metrics(name)).write_text(json.dumps({"dev": dev, "test": None}))
    Path(layout.ensemble("e")).mkdir(parents=True)                      # an ensemble never counts
    Path(layout.ensemble_metrics("e")).write_text(json.dumps({"dev": {"sst_acc": 0.99}}))
    data = load_report_data(load_params(params_path), layout)
    assert best_model(data, ScoreBook(data)).name == "b"                 # (0.5 + 0.8) / 2 > 0.6
    render_reports(load_params(params_path), layout, progress=False)
    callout = parse(Path(layout.final_report)).find("div", **{"class": "callout best-model"}).text()
    assert "b" in callout and "mean of its task scores 0.650" in callout


BEST_PARAMS = """\
experiments:
  weak: {description: "one seed of a weaker setup"}
  lucky: {description: "three seeds, one of them lucky", repeats: [1, 2, 3]}
ensembles:
  seeds: {members: [lucky], classification: mean_prob, similarity: mean}
studies: [{name: s, title: S, experiments: [weak, lucky]}]
report: {worst_k: 3}
"""
# lucky.seed1 scores far above its siblings: the best of the three seeds on dev is luck, not the setup
BEST_QUALITY = {"weak": (0.6, 1.0), "single": (0.68, 0.8), "lucky.seed1": (0.8, 0.5), "lucky.seed2": (0.55, 1.2),
                "lucky.seed3": (0.56, 1.15), "seeds": (0.65, 0.9)}


def test_best_model_is_a_repeated_experiment_by_its_seeds_mean_and_shows_a_typical_seed(tmp_path):
    """The best model compares a repeated experiment by the mean of its seeds (never its luckiest
    seed), says what it compared and how sure the choice is, and its error analysis shows the seed
    closest to the mean, saying so."""
    params_path, layout = build_inputs(tmp_path, BEST_PARAMS, BEST_QUALITY)
    seeds = ["lucky.seed1", "lucky.seed2", "lucky.seed3"]
    overall = {n: _metrics(layout, n)["dev"]["overall"] for n in [*seeds, "weak", "single"]}
    mean = float(np.mean([overall[s] for s in seeds]))
    assert overall["lucky.seed1"] > overall["single"] > mean > overall["weak"]    # the luckiest seed beats all
    typical = min(seeds, key=lambda s: abs(overall[s] - mean))
    assert typical != "lucky.seed1"

    render_reports(load_params(params_path), layout, progress=False)
    final = parse(Path(layout.final_report))
    callout = " ".join(final.find("div", **{"class": "callout best-model"}).text().split())
    assert callout.startswith(f"Best model: lucky, dev overall score (mean of 3 seeds) {fmt_metric(mean)} "
                              f"{fmt_interval(expected(layout, 'lucky', 'dev', 'overall').interval())}: highest, ")
    diff = expected(layout, "lucky", "dev", "overall").minus(expected(layout, "weak", "dev", "overall"))
    verdict = "significantly" if diff.interval().low > 0 else "not significantly"
    assert (f"{verdict} better than weak: {fmt_delta(diff.value)} {fmt_interval(diff.interval(), signed=True)}"
            in callout)
    assert ("Compared: the dev overall score of 1 experiment and 1 repeated experiment by the mean of its 3 seeds, "
            "never the luckiest seed; ensembles are compared with their members under Ensembles." in callout)
    assert callout.endswith(f"Its error analysis is below, on {typical}.")
    assert final.find("h2", id="best").text() == f"Error analysis of the best model: {typical}"
    because = " ".join(final.find("p", **{"class": "muted shown-because"}).text().split())
    assert because.startswith(f"The best model is the repeated experiment lucky; its error analysis shows {typical}, "
                              f"the seed whose dev score ({fmt_metric(overall[typical])}) is closest to the mean of "
                              f"the 3 seeds ({fmt_metric(mean)}): a typical seed, not the luckiest.")
    heading = final.find(id="sst-analysis").text()
    assert fmt_interval(expected(layout, typical, "dev", "sst_acc").interval()) in heading
    tags = {tr.find("td").find("a").text(): tr.find("td").find("span") for tr in final.find("table", **{
        "class": "overview"}).find("tbody").iter("tr")}
    assert {n for n, tag in tags.items() if tag is not None} == set(seeds)
    assert all(tags[s].text() == "best: a seed" for s in seeds)

    # a single run that beats the seeds' mean is the best model, whatever the luckiest seed scored
    other = tmp_path / "single.yaml"
    other.write_text(BEST_PARAMS.replace('weak: {description: "one seed of a weaker setup"}', "single: {}")
                     .replace("[weak, lucky]", "[single, lucky]"))
    data = load_report_data(load_params(other), layout)
    best = best_model(data, ScoreBook(data))
    assert (best.name, best.shown, best.repeated, best.score) == ("single", "single", False, overall["single"])
    assert best.compared.startswith("the dev overall score of 1 experiment and 1 repeated experiment")


def test_history_table_shows_epochs_text_and_scores(rendered):
    page = parse(rendered["out"] / "experiments" / "cls.html")
    table = page.find("table", **{"class": "history"})
    assert [th.text() for th in table.iter("th")][:5] == ["epoch", "stage", "lr", "seconds", "train_sst_loss"]
    first = [td.text() for td in table.find("tbody").find("tr").iter("td")][:5]
    assert first == ["1", "sst+para+sts", "2.00e-05", "1 min 01 s", "1.200"]


def test_shipped_params_render_before_anything_ran(tmp_path):
    """The project's own params.yaml: every study and experiment gets its table row and page."""
    params = load_params(REPO / "params.yaml")
    render_reports(params, Layout(str(tmp_path / "results"), str(tmp_path / "reports")), progress=False)
    final = parse(tmp_path / "reports" / "final.html")
    for study in params.params.studies:
        rows = [tr.attrs["data-row"] for tr in final.find("table", id=f"table-{study.name}").iter("tr")
                if "data-row" in tr.attrs]
        assert rows == study.experiments
    pages = {p.stem for p in (tmp_path / "reports" / "experiments").glob("*.html")}
    assert pages == set(params.experiments) | set(params.params.ensembles)


# ------------------------------------------------------------------ grids, summary rows, density

GRID_PARAMS = """\
base:
  finetune: {epochs: 2}
experiments:
  g: {description: grid template}
  r: {description: repeated template, repeats: [1, 2]}
studies:
  - name: dl
    title: Dropout x SMART lambda
    source: SMART Fine-tuning (002), Table 3
    experiments: [g]
    summary: [mean, std]
    grid:
      experiment: g
      axes:
        - {key: finetune.hidden_dropout, values: [0.1, 0.2, 0.3], label: dropout}
        - {key: finetune.smart.lambda_s, values: [1, 5], label: lambda}
  - name: sweep
    title: Learning rate
    grid:
      experiment: r
      axes: [{key: finetune.lr, values: [1.0e-5, 1.0e-4, 1.0e-3]}]
report: {worst_k: 3}
"""
GRID_QUALITY = {"g": (0.55, 1.2), "dl.dropout0.1.lambda1": (0.5, 1.3), "dl.dropout0.1.lambda5": (0.6, 1.0),
                "dl.dropout0.2.lambda1": (0.9, 0.3), "dl.dropout0.2.lambda5": (0.62, 0.9),
                "dl.dropout0.3.lambda5": (0.55, 1.1)}          # dl.dropout0.3.lambda1: no results yet
GRID_QUALITY |= {f"sweep.lr{lr}.seed{s}": (q + 0.02 * s, 1.0 - 0.1 * s)
                 for lr, q in [("1e-05", 0.5), ("0.0001", 0.7), ("0.001", 0.4)] for s in (1, 2)}


@pytest.fixture(scope="module")
def grid_rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    params_path, layout = build_inputs(root, GRID_PARAMS, GRID_QUALITY)
    render_reports(load_params(params_path), layout, progress=False)
    return {"params": params_path, "layout": layout, "out": Path(layout.reports),
            "final": parse(Path(layout.reports) / "final.html")}


def _dev(layout: Layout, name: str, key: str = "overall"):
    """A run's dev value from metrics.json (None when it has no results); a group's mean."""
    params = load_params(Path(layout.results).parent / "params.yaml")
    values = []
    for m in params.groups.get(name, [name]):
        path = Path(layout.metrics(m))
        if path.is_file():
            values.append(json.loads(path.read_text())["dev"][key])
    return float(np.mean(values)) if values else None


def test_two_axis_grid_renders_a_heatmap_of_dev_overall(grid_rendered):
    from minbert.report.plots import heat_colours

    layout = grid_rendered["layout"]
    table = grid_rendered["final"].find("table", data_grid="dl")
    assert table is not None
    row_labels = [tr.attrs["data-grid-row"] for tr in table.iter("tr") if "data-grid-row" in tr.attrs]
    assert row_labels == ["0.1", "0.2", "0.3"]
    assert [th.attrs["data-col"] for th in table.iter("th") if "data-col" in th.attrs] == ["1", "5"]
    cells = {td.attrs["data-cell"]: td for td in table.iter("td")}
    names = [f"dl.dropout{d}.lambda{lam}" for d in ("0.1", "0.2", "0.3") for lam in (1, 5)]
    assert list(cells) == names                                    # rows: dropout; columns: lambda
    values = {n: _dev(layout, n) for n in names}
    assert values["dl.dropout0.3.lambda1"] is None
    low, high = min(v for v in values.values() if v is not None), max(v for v in values.values() if v is not None)
    for name, td in cells.items():
        if values[name] is None:
            assert td.text().strip() == DASH and "style" not in td.attrs and _span(td, "ci") is None
            continue
        assert td.find(None, **{"class": "value"}).text() == fmt_metric(values[name])
        assert _span(td, "ci").text() == fmt_interval(expected(layout, name, "dev", "overall").interval())
        background, _ = heat_colours((values[name] - low) / (high - low))
        assert f"background-color: {background}" in td.attrs["style"]
    # the colour scale: lightest at the lowest cell, darkest at the highest, and a legend says so
    highest = max((n for n in names if values[n] is not None), key=values.get)
    assert f"background-color: {heat_colours(1.0)[0]}" in cells[highest].attrs["style"]
    caption = grid_rendered["final"].find("figure", id="grid-dl").find("figcaption").text()
    assert "Colour: dev overall" in caption and fmt_metric(low) in caption and fmt_metric(high) in caption
    assert f"{DASH}: no results yet" in caption
    # best mark: the rule of the study tables (significantly better than the second highest)
    ranked = sorted((n for n in names if values[n] is not None), key=lambda n: -values[n])
    diff = expected(layout, ranked[0], "dev", "overall").minus(expected(layout, ranked[1], "dev", "overall"))
    marked = [n for n, td in cells.items() if "best" in td.attrs["class"].split()]
    assert diff.interval().low > 0 and marked == [ranked[0]]           # dropout 0.2, lambda 1 is planted as best
    assert "significantly better than" in cells[ranked[0]].attrs["title"]
    # the study table still lists every cell (the template first), and no bar chart replaces the heatmap
    study = grid_rendered["final"].find("section", id="study-dl")
    assert list(_rows(study.find("table", id="table-dl"))) == ["g"] + names
    assert len(list(study.iter("img"))) == 0


def test_grid_best_is_not_marked_within_the_noise(tmp_path):
    from minbert.report.grids import study_grids

    quality = {"g": (0.55, 1.2)} | {n: (0.6, 1.0) for n in GRID_QUALITY if n.startswith("dl.")}
    params_path, layout = build_inputs(tmp_path, GRID_PARAMS, quality)
    data = load_report_data(load_params(params_path), layout)
    grid = study_grids(data, ScoreBook(data))["dl"]
    assert grid.best is None and not any(c.best for c in grid.cells)
    assert "not significantly better" in grid.verdict or "tied with" in grid.verdict


def test_one_axis_grid_renders_a_sweep_plot_of_group_means(grid_rendered):
    import base64

    from minbert.report.grids import study_grids

    layout = grid_rendered["layout"]
    data = load_report_data(load_params(grid_rendered["params"]), layout)
    grid = study_grids(data, ScoreBook(data))["sweep"]
    assert [a.labels for a in grid.axes] == [["1e-05", "0.0001", "0.001"]] and grid.axes[0].numeric
    assert [k for k, _ in grid.series_keys] == ["overall", "sst_acc", "para_acc", "sts_pearson"]
    for cell in grid.cells:                                        # repeated cells: the mean over their seeds
        assert cell.total_seeds == 2
        for key, _ in grid.series_keys:
            assert cell.series[key][0] == pytest.approx(_dev(layout, cell.name, key), abs=1e-12)
        assert fmt_interval(cell.series["overall"][1]) == fmt_interval(expected(layout, cell.name, "dev", "overall").interval())
    figure = grid_rendered["final"].find("figure", id="grid-sweep")
    src = figure.find("img").attrs["src"]
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    caption = figure.find("figcaption").text()
    assert "each value of lr (finetune.lr)" in caption and "bootstrap intervals as bands" in caption
    assert "Highest overall (leaderboard): sweep.lr0.0001 (significantly better than" in caption
    assert grid_rendered["final"].find("table", data_grid="sweep") is None      # one axis: the plot, no heatmap


def test_summary_rows_are_the_mean_and_population_std_of_each_column(grid_rendered):
    layout = grid_rendered["layout"]
    table = grid_rendered["final"].find("table", id="table-dl")
    rows = list(_rows(table))
    summary = {tr.attrs["data-summary"]: tr for tr in table.iter("tr") if "data-summary" in tr.attrs}
    assert list(summary) == ["mean", "std"]
    assert "ddof 0" in summary["std"].find("th").text()
    for split, key in _headers(table):
        values = [v for n in rows if (v := _dev(layout, n, key)) is not None]
        assert len(values) == len(rows) - 1                        # one cell has no results
        mean_td = summary["mean"].find("td", data_split=split, data_key=key)
        std_td = summary["std"].find("td", data_split=split, data_key=key)
        assert _span(mean_td, "value").text() == fmt_metric(np.mean(values))
        assert _span(std_td, "value").text() == fmt_metric(np.std(values))
        assert _span(mean_td, "nseeds").text() == f"n={len(values)}"
        for td in (mean_td, std_td):                               # no marks, no differences, no intervals
            assert "best" not in td.attrs["class"] and _span(td, "delta") is None and _span(td, "ci") is None
    legend = table.parent.parent.find("p", **{"class": "note legend"}).text()
    assert "population standard deviation (ddof 0)" in legend


def test_summary_values_match_numpy_exactly(grid_rendered):
    from minbert.report.tables import study_tables

    data = load_report_data(load_params(grid_rendered["params"]), grid_rendered["layout"])
    table = next(t for t in study_tables(data, ScoreBook(data)) if t.name == "dl")
    mean, std = table.summary
    for split, key, _, _ in table.columns:
        values = [r.cells[(split, key)].value for r in table.rows if r.cells[(split, key)].value is not None]
        assert mean.cells[(split, key)].value == float(np.mean(values))
        assert std.cells[(split, key)].value == float(np.std(values, ddof=0))


def test_sts_scatter_is_coloured_by_density_and_deterministic(rendered):
    from minbert.report.plots import point_density, regression_scatter

    frame = pd.read_csv(_folder(rendered["layout"], "sbert") / "sts-dev.csv", dtype={"id": str})
    worst = ["t000", "t001"]
    first = regression_scatter(frame, worst, (0.0, 5.0))
    assert first == regression_scatter(frame.copy(), worst, (0.0, 5.0))      # byte-identical
    density, method = point_density(frame["label"], frame["prediction"])
    assert method == "kernel density estimate" and density.max() == 1.0 and (density > 0).all()
    # the densest dot sits where the dots are crowded: more neighbours within 0.5 than the sparsest
    xy = frame[["label", "prediction"]].to_numpy()
    near = lambda i: int((np.hypot(*(xy - xy[i]).T) < 0.5).sum())            # noqa: E731
    assert near(int(density.argmax())) > near(int(density.argmin()))
    # points on a line (singular covariance) fall back to the histogram lookup
    same, how = point_density([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert how == "2-D histogram" and same.tolist() == [1.0, 1.0, 1.0, 1.0]
    page = parse(rendered["out"] / "experiments" / "sbert.html")
    fig = page.find(id="sts-analysis").parent
    assert "coloured by how crowded" in fig.text() and "colour bar" in fig.text()


def test_grids_and_summary_rows_before_anything_ran_and_a_categorical_sweep(tmp_path):
    from minbert.report import plots
    from minbert.report.grids import study_grids

    params = GRID_PARAMS.replace("report:", """\
  - name: frozen
    title: Frozen encoder or not
    summary: [std]
    grid:
      experiment: g
      axes: [{key: finetune.freeze_encoder, values: [false, true], label: frozen}]
report:""")
    params_path = tmp_path / "params.yaml"
    params_path.write_text(params)
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    render_reports(load_params(params_path), layout, progress=False)
    final = parse(Path(layout.final_report))
    heatmap = final.find("table", data_grid="dl")
    assert [td.text().strip() for td in heatmap.iter("td")] == [DASH] * 6
    assert "no results yet (6 of 6 cells)" in final.find("figure", id="grid-dl").text()
    std_row = next(tr for tr in final.find("table", id="table-frozen").iter("tr") if tr.attrs.get("data-summary") == "std")
    assert all(td.text().strip() == DASH for td in std_row.iter("td"))     # no columns yet: nothing ran
    assert "appears once its cells have dev scores" in final.find("section", id="study-sweep").text()
    # with results, a boolean axis is drawn as categories
    quality = {"g": (0.55, 1.2), "frozen.frozenfalse": (0.7, 0.8), "frozen.frozentrue": (0.4, 1.5)}
    (tmp_path / "with").mkdir()
    params_path, layout = build_inputs(tmp_path / "with", params, quality)
    data = load_report_data(load_params(params_path), layout)
    grid = study_grids(data, ScoreBook(data))["frozen"]
    assert grid.axes[0].labels == ["false", "true"] and not grid.axes[0].numeric
    assert [c.value for c in grid.cells] == [_dev(layout, n) for n in ("frozen.frozenfalse", "frozen.frozentrue")]
    png = plots.sweep_plot(grid)
    assert png.startswith("data:image/png;base64,") and png == plots.sweep_plot(grid)
    # a numeric axis is drawn on a log scale when its values grow by factors
    assert plots.log_spaced([3e-5, 1e-4, 3e-4]) and plots.log_spaced([1e-5, 1e-4, 1e-3])
    assert not plots.log_spaced([0.1, 0.2, 0.3]) and not plots.log_spaced([0.0, 0.1, 0.3]) and not plots.log_spaced([1, 5])


def test_a_missing_or_cut_history_and_an_overlapping_dev_file_are_said_on_the_page(tmp_path):
    """A deleted history.csv (the stage ran: its run record is there) and one cut mid-line are said in the
    curves section, not a missing section or dashes (issue 33, case 8); a dev file that shares its rows
    with the train file is a warning at the top of every page (case 3)."""
    params_path = tmp_path / "params.yaml"
    params_path.write_text("experiments: {a: {}, b: {seed: 2}, c: {seed: 3}}\n")
    layout = Layout(str(tmp_path / "results"), str(tmp_path / "reports"))
    for name in ("a", "b", "c"):
        Path(layout.training(name, "finetune")).mkdir(parents=True)
        Path(layout.model(name, "finetune")).write_bytes(b"a model")
        record = Path(layout.run_record("finetune", name))          # the stage ran: its run record says so
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"stage": "finetune", "name": name}))
    Path(layout.history("b", "finetune")).write_text("epoch,phase,dev_sst_acc,dev_sst_loss\n1,all,0.41,1.52\n"
                                                     "2,all,0.45,1.4")                  # cut in its last line
    Path(layout.history("c", "finetune")).write_text("epoch,phase,dev_sst_acc,dev_sst_loss\n1,all,0.41,1.52\n"
                                                     "2,all,,1.4\n")    # an undefined metric: no cut
    Path(layout.data).mkdir(parents=True)
    Path(layout.data_summary).write_text(json.dumps({"files": {
        "sts-dev.tsv": {"rows_read": 8, "rows_kept": 8, "rows_dropped": 0, "dropped_by_reason": {},
                        "overlap_with_train": {"rows": 8, "of": 8, "share": 1.0, "warn": True, "source": "raw/sts-dev.csv",
                                               "train": "raw/sts-train.csv"}},
        "sst-dev.tsv": {"rows_read": 8, "rows_kept": 8, "rows_dropped": 0, "dropped_by_reason": {},
                        "overlap_with_train": {"rows": 0, "of": 8, "share": 0.0, "warn": False}}}}))
    render_reports(load_params(params_path), layout, progress=False)
    overlap = "raw/sts-dev.csv: 8 of 8 dev rows (100%) are also in the train file raw/sts-train.csv"
    for page_path in (layout.final_report, layout.experiment_report("a"), layout.experiment_report("c")):
        text = " ".join(parse(Path(page_path)).text().split())
        assert f"Warning. {overlap}" in text and "sst-dev" not in text.split("Warning.")[1][:200]
    a = " ".join(parse(Path(layout.experiment_report("a"))).find(id="curves").parent.text().split())
    assert f"{layout.history('a', 'finetune')}: the training history is missing (deleted?)" in a
    assert "python -m stages.finetune --experiment a --force" in a
    b = " ".join(parse(Path(layout.experiment_report("b"))).text().split())
    assert f"{layout.history('b', 'finetune')}: the training history is cut short" in b
    c = " ".join(parse(Path(layout.experiment_report("c"))).text().split())
    assert "training history is" not in c
    Path(layout.history("c", "finetune")).write_text("epoch,phase,dev_sst_acc,dev_sst_loss\n1,all,0.41,1.52\n"
                                                     "2,all\n")         # cut at a field's end
    render_reports(load_params(params_path), layout, progress=False)
    c = " ".join(parse(Path(layout.experiment_report("c"))).text().split())
    assert f"{layout.history('c', 'finetune')}: the training history is cut short" in c


def test_the_data_table_adds_up_where_rows_went_to_another_split():
    """NLI's split by premise (and a declared task's dev held out of its training file): each file of
    the split reads the whole source, so read = kept + dropped + the rows that went to the other."""
    from minbert.report.render import split_rows

    rows = split_rows([
        {"file": "nli-train.tsv", "rows_read": 2527, "rows_kept": 2272, "rows_dropped": 3},
        {"file": "nli-dev.tsv", "rows_read": 2527, "rows_kept": 252, "rows_dropped": 3},
        {"file": "sst-train.tsv", "rows_read": 120, "rows_kept": 118, "rows_dropped": 2}])
    assert [(r.get("split_off"), r.get("split_to")) for r in rows] == \
        [(252, ["nli-dev.tsv"]), (2272, ["nli-train.tsv"]), (None, None)]
    assert all(r["rows_read"] == r["rows_kept"] + r["rows_dropped"] + r.get("split_off", 0) for r in rows)
