"""A study in its paper's shape and the claims scorecard, on tiny inputs with known outcomes (the
runs of tests/test_report.py: `sbert` far better than `cls` on every task, `near` one SST
sentence better than `cls`, `ghost` never run): the paper's labels, columns and overall formula,
the paper's value beside ours with its interval, and each claim's verdict."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import PARAMS, _metrics, build_inputs, expected, parse

from minbert.params import load_params
from minbert.report.formats import fmt_delta, fmt_metric
from minbert.report.papers import claim_verdict
from minbert.report.render import render_reports
from minbert.scoring import stats

PAPER = """\
papers:
  "000": {title: "A paper with a plain-mean score", overall: mean, epochs: 10, data: {sst: 8544, para: 141498},
          differs: [{setting: learning rate, paper: 1e-5, ours: 1e-4}]}
studies:
  - name: paper_study
    title: A paper's table
    summary: [mean]
    paper:
      id: "000"
      table: Table 9
      columns: [{name: Score, metric: overall}, {name: SST acc., metric: sst_acc}, {name: QQP, metric: para_acc},
                {name: STS, metric: sts_pearson}]
      rows:
        - {label: "R1 plain", run: cls, dev: {Score: 0.300, SST acc.: 0.900, QQP: 0.500, STS: 0.100}}
        - {label: "R2 better", run: sbert, dev: {Score: 0.700, SST acc.: 0.100, QQP: 0.900, STS: 0.900}}
        - {label: "R3 near", run: near, dev: {SST acc.: 0.950}}
        - {label: "R4 never run", run: ghost, dev: {SST acc.: 0.990}}
        - {label: "R5 best of", best_of: [cls, sbert], dev: {Score: 0.650}}
        - {label: "R6 twin", run: twin, stand_in: "the same predictions as R1", dev: {SST acc.: 0.900}}
        - {label: "R7 rising", run: rising, stand_in: "sbert's predictions, its curve still rising", dev: {QQP: 0.95}}
      printed_rows: 8
      summary: {mean: {Score: 0.5}}
      claims:
        - {text: holds, better: "R2 better", worse: "R1 plain", column: QQP}
        - {text: reverses, better: "R1 plain", worse: "R2 better", column: SST acc.}
        - {text: within noise, better: "R3 near", worse: "R1 plain", column: SST acc.}
        - {text: never ran, better: "R4 never run", worse: "R1 plain", column: SST acc.}
        - {text: no effect holds, same: ["R6 twin", "R1 plain"], column: SST acc., margin: 0.02,
           margin_reason: "the paper calls 0.02 noise"}
        - {text: no effect differs, same: ["R2 better", "R1 plain"], column: QQP, margin: 0.02, margin_reason: as above}
        - {text: no effect unclear, same: ["R3 near", "R1 plain"], column: SST acc., margin: 0.001,
           margin_reason: a margin below one sentence}
        - {text: no gain holds, no_gain: ["R6 twin", "R1 plain"], column: SST acc., margin: 0.02,
           margin_reason: "the paper calls 0.02 noise"}
        - {text: no gain differs, no_gain: ["R2 better", "R6 twin"], column: QQP, margin: 0.02,
           margin_reason: as above, quote: "R2 failed to improve on R6"}
        - {text: a row still rising, better: "R7 rising", worse: "R1 plain", column: QQP}
"""

# dev selection scores per evaluation: a curve that flattened, and one still rising at its end
FLAT = [0.40, 0.55, 0.60, 0.601, 0.600, 0.601, 0.600, 0.601]
RISING = [0.40, 0.45, 0.50, 0.54, 0.58, 0.62, 0.66, 0.70]


def write_curve(layout, name: str, scores: list[float]) -> None:
    """A finetune history.csv of one phase over the three leaderboard tasks with these dev scores (each
    task's column the same curve)."""
    n = len(scores)
    columns = {c: scores for c in ("dev_sst_acc", "dev_para_acc", "dev_sts_pearson", "dev_overall")}
    pd.DataFrame({"epoch": [round((k + 1) / 4, 4) for k in range(n)], "update": [10 * (k + 1) for k in range(n)],
                  "phase": ["sst+para+sts"] * n, "dev_score": scores, **columns}).to_csv(
        layout.history(name, "finetune"), index=False)


# the verdicts' rules on quiet evaluations (the demo's dev sets are too small to tell a plateau at the
# measured noise: tests/test_training_check.py covers that)
QUIET = "{jitter: 0.0, rows: 0.01}"
REPORT = f"report: {{title: Test report, worst_k: 3, training_check: {{noise: {{classification: {QUIET}, " \
         f"binary: {QUIET}, regression: {QUIET}}}}}}}"


@pytest.fixture(scope="module")
def paper_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper_report")
    params_path, layout = build_inputs(root)
    text = PARAMS.replace("experiments:\n", "experiments:\n  ghost: {description: never run, seed: 9}\n"
                          "  rising: {description: still rising, seed: 10}\n", 1)
    text = text.replace("studies:\n", PAPER + "\n", 1)      # the paper study first, then the others
    text = text.replace("report: {title: Test report, worst_k: 3}", REPORT, 1)
    params_path.write_text(text)
    for name in ("cls", "sbert", "near", "twin"):
        write_curve(layout, name, FLAT)
    shutil.copytree(layout.predictions("sbert"), layout.predictions("rising"))
    shutil.copy(layout.metrics("sbert"), layout.metrics("rising"))
    Path(layout.training("rising", "finetune")).mkdir(parents=True)
    write_curve(layout, "rising", RISING)
    render_reports(load_params(params_path), layout, progress=False)
    final = Path(layout.final_report)
    return {"layout": layout, "final": parse(final), "html": final.read_text()}


def _table(final):
    return final.find("table", id="paper-paper_study")


def test_paper_table_has_the_papers_labels_columns_and_formula(paper_report):
    table = _table(paper_report["final"])
    assert table is not None and table.attrs["data-formula"] == "mean"
    heads = [th.text().strip() for th in table.iter("th") if th.attrs.get("data-key")]
    # the paper's names, its order; its overall with its formula named under it
    assert heads == ["Score (plain mean)", "SST acc.", "QQP", "STS"]
    keys = [th.attrs["data-key"] for th in table.iter("th") if th.attrs.get("data-key")]
    assert keys == ["mean", "sst_acc", "para_acc", "sts_pearson"]            # Score is its plain mean
    labels = [tr.attrs["data-label"] for tr in table.iter("tr") if "data-label" in tr.attrs]
    assert labels == ["R1 plain", "R2 better", "R3 near", "R4 never run", "R5 best of", "R6 twin", "R7 rising"]
    assert "the plain mean of SST acc, Para acc and STS r" in paper_report["html"]


def test_each_cell_shows_the_papers_value_ours_its_interval_and_the_difference(paper_report):
    layout, table = paper_report["layout"], _table(paper_report["final"])
    row = next(tr for tr in table.iter("tr") if tr.attrs.get("data-label") == "R1 plain")
    cells = {td.attrs["data-column"]: td for td in row.iter("td") if "data-column" in td.attrs}
    mean = _metrics(layout, "cls")["dev"]["mean"]
    score = cells["Score"]
    assert score.find("span", **{"class": "paper-value"}).text() == "0.300"
    assert score.find("span", **{"class": "value"}).text() == fmt_metric(mean)
    est = expected(layout, "cls", "dev", "mean")
    iv = est.interval()
    assert f"[{fmt_metric(iv.low)}, {fmt_metric(iv.high)}]" in score.text()
    assert fmt_delta(mean - 0.300) in score.text()
    assert ("outside" in score.attrs["class"]) == (not iv.low <= 0.300 <= iv.high)
    # a best-of row stands for the best of its runs by dev overall: sbert
    best = next(tr for tr in table.iter("tr") if tr.attrs.get("data-label") == "R5 best of")
    assert best.attrs["data-run"] == "sbert"
    # the summary row is the mean over the same rows, beside the paper's printed value
    foot = next(tr for tr in table.iter("tr") if tr.attrs.get("data-summary") == "mean")
    foot_score = next(td for td in foot.iter("td") if td.attrs.get("data-column") == "Score")
    runs = ("cls", "sbert", "near", "sbert", "twin", "rising")
    ours = np.mean([_metrics(layout, n)["dev"]["mean"] for n in runs])
    assert foot_score.find("span", **{"class": "value"}).text() == fmt_metric(ours)
    assert foot_score.find("span", **{"class": "paper-value"}).text() == "0.500"
    # with its interval: each replicate the mean of the rows' replicates
    reps = np.mean([expected(layout, n, "dev", "mean").replicates for n in runs],
                   axis=0)
    iv = stats.percentile_interval(reps)
    assert f"[{fmt_metric(iv.low)}, {fmt_metric(iv.high)}]" in foot_score.text()


def test_claims_get_their_verdicts_and_the_scorecard_opens_the_page(paper_report):
    final, layout = paper_report["final"], paper_report["layout"]
    card = final.find("section", id="scorecard")
    assert card is not None
    body = final.find("body") or final
    first_section = next(body.iter("section"))
    assert first_section.attrs.get("id") == "scorecard"                    # the page opens with it
    by_text = {}
    for tr in card.iter("tr"):
        if "data-verdict" in tr.attrs:
            tds = list(tr.iter("td"))
            by_text[tds[1].find("span", **{"class": "claim-text"}).text()] = tr.attrs["data-verdict"]
            assert tds[0].find("a").attrs["href"] == "#study-paper_study"
    assert by_text == {"holds": "reproduced", "reverses": "reversed", "within noise": "not significant",
                       "never ran": "not run", "no effect holds": "reproduced", "no effect differs": "differs",
                       "no effect unclear": "inconclusive", "no gain holds": "reproduced",
                       "no gain differs": "differs", "a row still rising": "undertrained"}
    counts = {s.attrs["data-count"]: s.text() for s in card.iter("span") if "data-count" in s.attrs}
    assert counts["reproduced"].strip().endswith(" 3")                # a difference, a no effect, a no gain
    assert counts["differs"].strip().endswith(" 2")
    assert all(counts[v].strip().endswith(" 1")
               for v in ("reversed", "not significant", "inconclusive", "undertrained", "not run"))
    assert "of 8 claims judged" in card.text() and "of 10 claims in all" in card.text()
    # an undertrained claim says in one line which row, its trend, and what the comparison would read;
    # the whole evidence is said once, under the counts. The schedule (10% warm-up, linear decay) puts the
    # last quarter of the learning-rate budget over the last 4 of the 8 evaluations, its last half over the
    # last 6: the slope through those, over one more quarter, gains 0.107.
    rising = next(tr for tr in card.iter("tr") if tr.attrs.get("data-verdict") == "undertrained")
    note = rising.find("div", **{"class": "desc training-note"}).text()
    assert note.strip() == ("rising finetune sst+para+sts, selection score: still rising (+0.107 > 0.01) (and 1 more) "
                            "(reads: reproduced)")
    why = card.find("details", **{"class": "untrained-rows"}).find("li").text()
    assert why.startswith("rising finetune sst+para+sts, selection score: still rising: its trend a window (25% of its "
                          "learning-rate budget), fitted over its last 50% (6 of 8 evaluations) +0.107 a window ± 0.000 "
                          "(more than 0.01)")
    assert "Demo data" in card.text()                                       # data.dir is data/demo
    # ours is the paired bootstrap difference, as minbert.scoring.stats gives it on the same files
    holds = next(tr for tr in card.iter("tr") if tr.attrs.get("data-verdict") == "reproduced")
    diff = expected(layout, "sbert", "dev", "para_acc").minus(expected(layout, "cls", "dev", "para_acc"))
    assert fmt_delta(diff.value) in holds.text() and fmt_delta(0.4) in holds.text()


def test_scale_line_says_how_the_run_differs_from_the_paper(paper_report):
    note = paper_report["final"].find("p", **{"class": "note scale"})
    assert note is not None
    text = note.text()
    assert "model all-MiniLM-L6-v2 (the paper: bert-base-uncased)" in text
    assert "2 epochs (the paper: 10 for most rows)" in text


def test_claim_verdict_rule():
    def est(values):
        return stats.Estimate(float(np.mean(values)), np.asarray(values, dtype=float), ())
    assert claim_verdict(0.02, est([0.01, 0.02, 0.03] * 50)) == "reproduced"
    assert claim_verdict(0.02, est([-0.01, -0.02, -0.03] * 50)) == "reversed"
    assert claim_verdict(-0.02, est([-0.01, -0.02, -0.03] * 50)) == "reproduced"
    assert claim_verdict(0.02, est([-0.01, 0.0, 0.03] * 50)) == "not significant"
    assert claim_verdict(0.02, None) == "not run"


def test_scale_line_counts_the_rows_each_experiment_trains_on():
    """The training rows under a paper table are what each row's experiment trains on: the prepared
    rows after its own downsampling (mode and caps), not the prepared files' sizes."""
    from types import SimpleNamespace as NS

    from minbert.params import FinetuneParams
    from minbert.params.studies import PaperParams
    from minbert.report.papers import scale_line

    def exp(**finetune):
        return NS(model="m", finetune=FinetuneParams(epochs=10, **finetune))

    lp = NS(params=NS(ensembles={}), groups={}, experiments={
        "capped": exp(downsample={"mode": "none", "caps": {"sst": 3000, "para": 3000}}),
        "smallest": exp(downsample={"mode": "smallest"}),
        "full": exp(downsample={"mode": "none"})})
    paper = PaperParams(title="t", overall="mean", model="m", epochs=10, data={"sst": 8544, "para": 8000})
    summary = [{"file": "sst-train.tsv", "rows_kept": 8544}, {"file": "para-train.tsv", "rows_kept": 8000},
               {"file": "sts-train.tsv", "rows_kept": 6040}]
    assert scale_line(lp, paper, ["full"], summary) == ""
    capped = scale_line(lp, paper, ["capped"], summary)
    assert "3,000 (the paper: 8,544)" in capped and "3,000 (the paper: 8,000)" in capped
    assert "3,000/8,544 (the paper: 8,544)" in scale_line(lp, paper, ["capped", "full"], summary)
    assert "6,040 (the paper: 8,544)" in scale_line(lp, paper, ["smallest"], summary)   # the smallest task: STS


def test_a_no_effect_claim_reads_as_such(paper_report):
    """A no-effect claim shows its two rows as A ≈ B, its margin and why; the legend explains its verdicts."""
    card = paper_report["final"].find("section", id="scorecard")
    row = next(tr for tr in card.iter("tr") if tr.attrs.get("data-verdict") == "inconclusive")
    text = row.text()
    assert "R3 near \u2248 R1 plain" in text and "\u00b10.001" in text and "a margin below one sentence" in text
    legend = card.find("p", **{"class": "muted legend"}).text()
    assert "within \u00b1 the margin" in legend and "inconclusive otherwise" in legend


def test_no_effect_verdict_rule():
    def est(values):
        return stats.Estimate(float(np.mean(values)), np.asarray(values, dtype=float), ())
    assert claim_verdict(-0.009, est([-0.004, 0.0, 0.004] * 50), margin=0.01) == "reproduced"
    assert claim_verdict(-0.009, est([0.003, 0.004, 0.005] * 50), margin=0.01) == "reproduced"   # small, inside
    assert claim_verdict(-0.009, est([0.02, 0.03, 0.04] * 50), margin=0.01) == "differs"
    assert claim_verdict(-0.009, est([-0.02, 0.0, 0.03] * 50), margin=0.01) == "inconclusive"
    assert claim_verdict(-0.009, None, margin=0.01) == "not run"
    assert claim_verdict(None, est([0.01, 0.02, 0.03] * 50)) == "reproduced"    # a difference stated in words


def test_the_page_says_what_each_table_is_and_how_it_was_made(paper_report):
    final, html = paper_report["final"], paper_report["html"]
    study = final.find("section", id="study-paper_study")
    caption = study.find("p", **{"class": "note caption"}).text()
    assert "Reproduces 7 of the 8 rows of 000" in " ".join(caption.split())
    # a stand-in row names its run, the paper's label in the "compares to" column
    table = _table(final)
    twin = next(tr for tr in table.iter("tr") if tr.attrs.get("data-label") == "R6 twin")
    assert twin.find("strong", **{"class": "run-label"}).text().strip() == "twin"
    assert twin.find("td", **{"class": "compares-to"}).text().strip() == "R6 twin"
    assert "the same predictions as R1" in twin.text()
    plain_row = next(tr for tr in table.iter("tr") if tr.attrs.get("data-label") == "R1 plain")
    assert plain_row.find("strong", **{"class": "paper-label"}).text() == "R1 plain"
    # the declared differences beside the table
    differs = study.find("p", **{"class": "note differs"}).text()
    assert "learning rate: the paper 1e-5, here 1e-4" in differs
    # the scorecard carries each table's scale line and where the numbers were made (run records)
    card = final.find("section", id="scorecard")
    scales = card.find("ul", **{"class": "note scales"}).text()
    assert "paper_study" in scales and "model all-MiniLM-L6-v2 (the paper: bert-base-uncased)" in scales
    assert "cpu:" in card.find("p", **{"class": "muted devices"}).text()
    # a run's claims rows name the runs compared here
    assert "here: twin vs cls" in card.text()
    # the legend says how a repeated experiment is resampled; the demo note names the real-data catalogue
    assert "also resamples its seeds" in card.text()
    assert "catalogue: papers" in card.text() and "minilm" not in card.text()
    # one overall score per paper table: the paper's, named
    assert "Score is the paper's overall score" in " ".join(html.split())
    heads = [th.text().strip() for th in final.find("table", id="table-paper_study").iter("th")
             if th.attrs.get("data-key") in ("overall", "mean")]
    assert heads and all(h == "Mean (the paper's score)" for h in heads)
    assert ">None<" not in html


def test_scale_line_says_when_the_paper_prints_no_training_rows():
    """000 prints its data sets' sizes, not the rows it trained on: the line gives ours and says so,
    never the paper's totals as its training rows."""
    from types import SimpleNamespace as NS

    from minbert.params import FinetuneParams
    from minbert.params.studies import PaperParams
    from minbert.report.papers import scale_line

    lp = NS(params=NS(ensembles={}), groups={}, experiments={
        "capped": NS(model="m", finetune=FinetuneParams(epochs=10, downsample={"mode": "none", "caps": {"sst": 3000}}))})
    paper = PaperParams(title="t", overall="mean", model="m", epochs=10, totals={"sst": 11855})
    line = scale_line(lp, paper, ["capped"], [{"file": "sst-train.tsv", "rows_kept": 8544}])
    assert "SST 3,000 (the paper: not stated, of a data set of 11,855)" in line
    # a table whose rows trained on other rows than the paper's others (004's Objective 2) says so itself
    assert scale_line(lp, paper, ["capped"], [{"file": "sst-train.tsv", "rows_kept": 8544}], {"sst": 3000}) == ""


# ---------------------------------------------------------------- words the page runs together

INLINE = {"a", "abbr", "b", "cite", "code", "em", "i", "kbd", "label", "mark", "q", "s", "small", "span", "strong",
          "time", "u", "var"}


def glued_words(html: str) -> list[tuple[str, str]]:
    """The places where the page's text runs two words together across an inline element's edge, as
    a reader copying it or a screen reader gets it ("Score" then a span "plain mean": "Scoreplain
    mean"); block elements separate their text, and <sup>/<sub> belong to the word they follow."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.text, self.edge, self.hidden, self.found = "", None, 0, []

        def handle_starttag(self, tag, attrs):
            self.hidden += tag in ("script", "style")
            self._edge(tag)

        def handle_endtag(self, tag):
            self.hidden -= tag in ("script", "style")
            self._edge(tag)

        def _edge(self, tag):
            if tag in INLINE:
                self.edge = len(self.text)
            elif tag not in ("sup", "sub"):
                self.text += "\n"

        def handle_data(self, data):
            if self.hidden:
                return
            if self.edge == len(self.text) and self.text[-1:].isalnum() and data[:1].isalnum():
                self.found.append((self.text[-30:].split("\n")[-1], data[:30]))
            self.text += data

    parser = Text()
    parser.feed(html)
    return parser.found


def test_the_glue_finder_finds_what_the_page_did():
    assert glued_words('<th>Score<span class="detail formula">plain mean</span></th>') == [("Score", "plain mean")]
    assert glued_words('<p><span>reproduced 0</span><span>not significant 0</span></p>') == \
        [("reproduced 0", "not significant 0")]
    assert glued_words('<th>Score <span>(plain mean)</span></th><td>a</td><td>b</td><p>x<sup>2</sup></p>') == []


def test_no_header_or_label_runs_two_words_together(paper_report, tmp_path):
    """The paper tables' headers read "Scoreplain mean" and "Overallleaderboard"; the scorecard's
    counts, the row tags (baseline, ensemble, seeds, best) and the page's links ran together the same
    way: every page of the reports, checked."""
    from test_report import GRID_PARAMS, GRID_QUALITY

    pages = [Path(paper_report["layout"].final_report), *Path(paper_report["layout"].experiment_reports).glob("*.html")]
    params_path, layout = build_inputs(tmp_path, GRID_PARAMS, GRID_QUALITY)       # heatmaps and sweeps
    render_reports(load_params(params_path), layout, progress=False)
    pages += [Path(layout.final_report), *Path(layout.experiment_reports).glob("*.html")]
    found = {(p.name, glued) for p in pages for glued in glued_words(p.read_text())}
    assert not found, sorted(found)
    header = next(th for th in _table(paper_report["final"]).iter("th") if th.attrs.get("data-key") == "mean")
    assert " ".join(header.text().split()) == "Score (plain mean)"


def test_a_row_untrained_on_one_claims_column_is_named_with_it_beside_the_columns_it_trained_on():
    """The scorecard said "not: cross_encoder" beside a judged cross_encoder claim: cross_encoder had
    trained on that claim's column (Overall) and not on another claim's (STS)."""
    from types import SimpleNamespace as NS

    from minbert.report.papers import Scorecard, rows_checked

    def claim(column, *rows, split="dev"):
        return NS(column=column, split=split, training=[NS(name=n, trained=t, evidence="") for n, t in rows])

    claims = [claim("STS", ("cross_encoder", False), ("multitask_rr", False)),
              claim("Overall", ("cross_encoder", True), ("multitask_rr", True)),
              claim("Score", ("mlm_multitask", False), ("frozen_baseline", True)),
              claim("Score", ("multitask_rr", True), ("frozen_baseline", True)),
              claim("Score", ("mlm_multitask", False), ("x", True), split="test")]
    card = Scorecard(claims, {}, True, rows=rows_checked(claims))
    assert card.untrained_where == ["cross_encoder on STS (trained on Overall)", "mlm_multitask on Score, test Score",
                                    "multitask_rr on STS (trained on Overall, Score)"]
    assert card.rows_untrained == ["cross_encoder", "mlm_multitask", "multitask_rr"]


def test_the_run_ends_on_the_best_model_its_score_the_claims_and_where_the_report_is(paper_report):
    """The report stage prints these lines last (DVC's terminal shows them; Snakemake's run ends on
    them): the best model as the page names it, with its dev score and interval, the scorecard's
    counts, the report's path."""
    import re

    layout = paper_report["layout"]                   # rendered again, the same pages
    params_path = Path(layout.results).parent / "params.yaml"
    summary: list[str] = []
    render_reports(load_params(params_path), layout, progress=False, summary=summary)
    html = Path(layout.final_report).read_text()
    best = re.search(r'class="callout best-model">Best model: <strong>(?:<a [^>]*>)?([^<]+)', html).group(1)
    assert summary[0].startswith(f"best model: {best}") and re.search(r"dev overall score 0\.\d{3} \[0\.\d{3}, 0\.\d{3}\]$",
                                                                      summary[0]), summary
    assert summary[1] == ("claims: 8 of 10 judged (3 reproduced, 1 not significant, 1 reversed, 2 differs, "
                          "1 inconclusive); 1 undertrained; 1 not run (demo data: the verdicts only show how the page "
                          "reads)")
    assert summary[2] == f"report: {layout.final_report}"


LEFT_OUT = """\
  - name: left_study
    title: A table left out here
    left_out: "no claim of it can be judged at this scale"
    paper:
      id: "000"
      table: Table 8
      columns: [{name: SST acc., metric: sst_acc}]
      rows:
        - {label: "L1", run: cls, dev: {SST acc.: 0.5}}
        - {label: "L2", run: only_here, dev: {SST acc.: 0.4}}
      claims:
        - {text: left aside, better: L1, worse: L2, column: SST acc.}
"""


def test_a_table_left_out_shows_the_papers_values_and_its_claims_as_left_out(tmp_path):
    """A table a catalogue leaves out (`left_out`, at a scale: `scales.<name>.named.studies`): its
    rows that no running table needs do not run, the page shows the paper's values with the reason,
    and its claims count as left out, the reason beside each, never as undertrained or not run."""
    params_path, layout = build_inputs(tmp_path)
    text = PARAMS.replace("experiments:\n", "experiments:\n  only_here: {description: only the left-out table}\n", 1)
    text = text.replace("studies:\n", PAPER.split("studies:\n")[0] + "studies:\n" + LEFT_OUT, 1)
    params_path.write_text(text)
    lp = load_params(params_path)
    assert "only_here" not in lp.experiments and "cls" in lp.experiments      # cls: other tables run it
    render_reports(lp, layout, progress=False)
    final = parse(Path(layout.final_report))
    section = final.find("section", id="study-left_study")
    assert "Not run at this scale: no claim of it can be judged at this scale" in " ".join(section.text().split())
    assert "0.5" in section.find("table", id="paper-left_study").text()
    card = final.find("section", id="scorecard")
    row = next(tr for tr in card.iter("tr") if tr.attrs.get("data-verdict") == "left out")
    assert "left aside" in row.text() and "no claim of it can be judged" in row.text()
    assert card.find("span", **{"data-count": "left out"}).text().split()[-1] == "1"
