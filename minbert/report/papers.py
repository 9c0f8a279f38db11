"""A study's paper table beside ours, the paper's claims with their verdicts, and the claims
scorecard that opens the page (docs/report.md, "The claims scorecard", "A study in its paper's shape").

This module is the one place where a claim's verdict is decided (`claim_verdict`, from the paired
bootstrap of the claim's two rows), and where ours is compared with a printed value (`compare`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.tasks import TASKS
from minbert.data.downsample import target_sizes
from minbert.params.studies import PAPER_OVERALL
from minbert.report.best import best_of, dev_score
from minbert.report.data import ReportData
from minbert.report.effects import encoder_alone, references, table_frozen_runs
from minbert.report.scores import ScoreBook, metric_value
from minbert.report.settled import claim_bounds, pair_check, row_check
from minbert.report.tables import SUMMARIES, description, summarise_values
from minbert.report.training import ClaimCheck
from minbert.scoring import stats

VERDICTS = ("reproduced", "not significant", "reversed", "differs", "inconclusive", "undertrained", "not run",
            "left out")
JUDGED = VERDICTS[:5]                       # the verdicts on a comparison; the others are counted apart
VERDICT_TITLES = {
    "reproduced": "a difference: the same sign as the paper's in every seed, and its paired-bootstrap interval "
                  "excludes 0; no effect: the interval lies within the claim's margin; no gain: the interval lies "
                  "below the claim's margin",
    "not significant": "a difference: the paired-bootstrap interval of our difference contains 0, or the seeds "
                       "disagree in its sign",
    "reversed": "a difference: the opposite sign to the paper's, and its interval excludes 0",
    "differs": "no effect: the interval excludes 0 and reaches beyond the claim's margin; no gain: the first row "
               "improves on the second (the interval lies above 0) beyond the margin",
    "inconclusive": "no effect or no gain: the interval contains 0 but reaches beyond the claim's margin; any claim: "
                    "at the noise of its rows' dev evaluations the training check cannot tell whether more training "
                    "would move a row, or the claim's difference, past what would change the verdict",
    "undertrained": "a row of the claim did not train (a dev curve of a stage it depends on, on its selection score or "
                    "the claim's column, is still moving or stayed at chance, its history is absent, or its "
                    "pretraining did not move), or more training would clearly move the claim's difference past "
                    "its verdict's boundary: the comparison would judge the run, not the paper's method",
    "not run": "one of the two rows has no dev scores (with predictions) yet",
    "left out": "the claim's table does not run at this scale (the catalogue says why): no verdict",
}


def claim_verdict(paper_difference: float | None, ours: stats.Estimate | None, confidence: float = stats.CONFIDENCE,
                  margin: float | None = None, kind: str = "difference", seed_differences=()) -> str:
    """A claim's verdict from ours (a paired bootstrap estimate of the claim's first row − its
    second). A difference claim (the paper's difference better − worse, positive; None where the
    paper states it in words only): reproduced, not significant, reversed; a difference whose seeds
    disagree in sign (`seed_differences`, seed by seed) is never reproduced. A no-effect claim
    (`margin` given): reproduced when our interval lies within ±margin (an equivalence test),
    differs when it excludes 0, inconclusive otherwise. A no-gain claim (one-sided, "failed to
    improve"): reproduced when the interval lies below +margin, differs when it lies above 0,
    inconclusive otherwise. Not run without an estimate."""
    if ours is None:
        return "not run"
    iv = ours.interval(confidence)
    if kind == "no_gain":
        if iv.high <= margin:
            return "reproduced"
        return "differs" if iv.low > 0 else "inconclusive"
    if margin is not None:
        if -margin <= iv.low and iv.high <= margin:
            return "reproduced"
        return "differs" if iv.excludes_zero else "inconclusive"
    if not iv.excludes_zero:
        return "not significant"
    paper_sign = paper_difference is None or paper_difference > 0
    if (ours.value > 0) != paper_sign:
        return "reversed"
    if any((d > 0) != paper_sign for d in seed_differences):
        return "not significant"
    return "reproduced"


@dataclass
class PaperCell:
    paper: float | None                         # the value the paper prints
    value: float | None = None                  # ours
    interval: stats.Interval | None = None
    difference: float | None = None             # ours − the paper's
    outside: bool = False                       # the paper's value lies outside our interval


@dataclass
class PaperRowView:
    label: str
    run: str | None                             # what stands for the row here (best_of: the chosen one)
    description: str
    has_results: bool
    note: str = ""                              # how a best-of row was chosen
    link: str | None = None                     # the run's page (a repeated experiment has none)
    stand_in: str = ""                          # how the run differs from the paper's method for the row
    cells: dict = field(default_factory=dict)   # (split, column name) -> PaperCell


@dataclass
class ClaimView:
    study: str
    text: str
    better: str                                 # row labels
    worse: str
    column: str
    split: str
    paper_difference: float
    better_run: str | None
    worse_run: str | None
    difference: float | None = None             # ours, better − worse
    interval: stats.Interval | None = None
    verdict: str = "not run"
    kind: str = "difference"                    # difference | no_effect (better, worse: the two rows)
    margin: float | None = None                 # no effect: the largest difference that counts as none
    margin_reason: str = ""
    quote: str = ""                             # the paper's words
    proxy: str = ""                             # why this comparison stands for what the paper states
    seeds: tuple = ()                           # the seeds behind each row (better, worse): their real counts
    seed_differences: list = field(default_factory=list)   # ours, seed by seed (where both rows ran the seeds)
    training: list = field(default_factory=list)   # RowCheck of each row (the training check)
    judged: str = ""                            # the verdict the comparison reads, where the training check overrode it
    tolerance: float | None = None              # the training check's tolerance for this claim's rows (on its column)
    settled: str = ""                           # whether more training would move the difference (the pair), in words
    alone: object = None                        # EncoderAlone: where our effect is several times the paper's
    formula: str = ""                           # an overall column: its paper's formula, named beside it
    left_out: str = ""                          # why the claim's table does not run (the catalogue's words)


@dataclass
class PaperTableView:
    study: str
    paper_id: str
    paper_title: str
    table: str
    formula: str                                # leaderboard | mean
    formula_text: str
    columns: list                               # [(split, column name, metrics.json key)]
    splits: list
    rows: list                                  # PaperRowView
    summary: list = field(default_factory=list)   # [(label, kind, {(split, name): PaperCell})]
    claims: list = field(default_factory=list)  # ClaimView
    scale: str = ""                             # how this run's scale differs from the paper's
    differs: list = field(default_factory=list)   # PaperDifference: the catalogue's other settings vs the paper's
    total_rows: int = 0                         # the paper table's rows
    shown_rows: int = 0                         # those a run here stands for
    overall_name: str = ""                      # the paper's overall column, as printed ("" when it has none)
    stand_ins: bool = False                     # a row's run is not the paper's method (a "compares to" column)
    left_out: str = ""                          # why this table does not run here: the paper's values alone

    @property
    def formula_name(self) -> str:
        return FORMULA_NAME[self.formula]

    def span(self, split: str) -> int:
        return sum(1 for s, *_ in self.columns if s == split)


FORMULA_TEXT = {"leaderboard": "(SST acc + Para acc + (STS r + 1) / 2) / 3, the leaderboard score",
                "mean": "the plain mean of SST acc, Para acc and STS r"}
FORMULA_NAME = {"leaderboard": "leaderboard", "mean": "plain mean"}     # beside an overall wherever it shows


def paper_metric_key(metric: str, formula: str) -> str:
    """The metrics.json key a paper column reads: its overall in the paper's formula, else the metric."""
    return PAPER_OVERALL[formula] if metric == "overall" else metric



def compare(cell: PaperCell) -> PaperCell:
    """Ours against the paper's printed value: the difference, and whether the printed value lies
    outside our interval (the page's dagger)."""
    if cell.value is not None and cell.paper is not None:
        cell.difference = cell.value - cell.paper
        cell.outside = cell.interval is not None and not (cell.interval.low <= cell.paper <= cell.interval.high)
    return cell


def row_run(row, book: ScoreBook) -> tuple[str | None, str]:
    """What stands for a paper row: its run, or the best by dev of its `best_of` (and why)."""
    if row.run is not None:
        return row.run, ""
    best = best_of(row.best_of, book)          # ties: the first listed
    if best is None:
        return None, f"the best by dev of {len(row.best_of)} runs, none of which has results yet"
    scored = sum(1 for n in row.best_of if dev_score(n, book) is not None)
    return best, f"the best by dev overall of {len(row.best_of)} runs ({scored} with results): {best}"


def _trained_rows(exps: list, data_summary: list[dict]) -> dict[str, set]:
    """task -> the training rows each experiment trains on: the prepared rows (prepare's summary)
    after its own downsampling (mode, caps)."""
    kept = {}
    for r in data_summary:
        name = str(r.get("file", ""))
        rows = r.get("rows_kept")
        for task in TASKS:      # every task: `smallest` downsampling compares an experiment's tasks
            if name == f"{task}-train.tsv" and isinstance(rows, int):
                kept[task] = rows
    trained: dict[str, set] = {}
    for e in exps:
        sizes = {t: kept[t] for t in e.finetune.tasks if t in kept}
        for t, n in target_sizes(sizes, e.finetune.downsample).items():
            trained.setdefault(t, set()).add(n)
    return trained


def scale_line(lp, paper, runs: list[str], data_summary: list[dict], table_data: dict | None = None) -> str:
    """One line saying how this run's scale (model, epochs, training rows) differs from the
    paper's, from the resolved settings of the rows' experiments (their downsampling included) and
    the prepare summary; '' when nothing differs. `table_data`: the training rows of this table's
    rows where they differ from the paper's (`StudyPaper.data`)."""
    paper_rows = {**paper.data, **(table_data or {})}
    exps = []
    for name in runs:
        names = lp.params.ensembles[name].members if name in lp.params.ensembles else lp.groups.get(name, [name])
        exps += [lp.experiments[n] for n in names if n in lp.experiments]
    if not exps:
        return ""
    parts = []
    models = sorted({e.model for e in exps})
    if models != [paper.model]:
        parts.append(f"model {', '.join(models)} (the paper: {paper.model})")
    epochs = sorted({e.finetune.epochs for e in exps})
    steps = sorted({e.finetune.max_steps_per_epoch for e in exps if e.finetune.max_steps_per_epoch})
    if paper.epochs is not None and (epochs != [paper.epochs] or steps):
        text = f"{'/'.join(map(str, epochs))} epoch{'s' if epochs != [1] else ''}"
        if steps:
            text += f" of at most {'/'.join(map(str, steps))} step{'s' if steps != [1] else ''}"
        parts.append(f"{text} (the paper: {paper.epochs} for most rows)")
    trained = _trained_rows(exps, data_summary)
    # the paper's training rows where it prints them; else its data set's size, said to be no more
    smaller = [f"{TASKS[t].short} {'/'.join(f'{n:,}' for n in sorted(trained[t]))} (the paper: {n_paper:,})"
               for t, n_paper in paper_rows.items()
               if t in trained and not all(0.9 <= n / n_paper <= 1.1 for n in trained[t])]
    smaller += [f"{TASKS[t].short} {'/'.join(f'{n:,}' for n in sorted(trained[t]))} (the paper: not stated, "
                f"of a data set of {n_total:,})"
                for t, n_total in paper.totals.items() if t in trained and t not in paper_rows]
    if smaller:
        parts.append("training rows " + ", ".join(smaller))
    return ("Scale differs from the paper's: " + "; ".join(parts) + ".") if parts else ""


def summary_interval(runs: list[str], kind: str, split: str, key: str, book: ScoreBook) -> stats.Interval | None:
    """The interval of a summary row (the mean or the ddof-0 std over the table's rows), each
    bootstrap replicate the summary of the rows' replicates (the same resample of the same
    examples for every row; a repeated experiment's replicates also resample its seeds); None
    unless every row with a value has an estimate on the same examples."""
    ests = [book.estimate(r, split, key) for r in runs if book.value(r, split, key) is not None]
    if not ests or any(e is None for e in ests) or len({e.basis for e in ests}) != 1:
        return None
    reps = np.stack([e.replicates for e in ests])               # [rows, resamples]
    summary = reps.mean(axis=0) if kind == "mean" else reps.std(axis=0, ddof=0)
    return stats.percentile_interval(summary, book.confidence)


def _paper_row(row, columns: list, book: ScoreBook) -> PaperRowView:
    """One row of the paper's table: the run that stands for it, each cell the paper's value beside ours."""
    run, note = row_run(row, book)
    has_results = run is not None and any(book.data.runs[m].metrics is not None for m in book.members(run))
    view = PaperRowView(row.label, run, description(run, book.data) if run else "", has_results, note,
                        run if run is not None and not book.is_group(run) else None, row.stand_in)
    for split, name, key in columns:
        cell = PaperCell(getattr(row, split).get(name))
        if run is not None:
            cell.value, cell.interval = book.value(run, split, key), book.interval(run, split, key)
        view.cells[(split, name)] = compare(cell)
    return view


def _summary(view: PaperTableView, printed: dict, kinds: list[str], book: ScoreBook) -> list:
    """The paper's summary rows (004's Average and Std Dev.) over the same rows as ours, each cell
    beside the printed value (dev) with its interval from the rows' bootstrap replicates."""
    runs = [r.run for r in view.rows if r.run]
    out = []
    for kind in kinds:
        cells = {}
        for split, name, key in view.columns:
            value = summarise_values([v for r in view.rows if (v := r.cells[(split, name)].value) is not None], kind)
            cell = PaperCell(printed.get(kind, {}).get(name) if split == "dev" else None, value)
            if value is not None:
                cell.interval = summary_interval(runs, kind, split, key, book)
            cells[(split, name)] = compare(cell)
        out.append((SUMMARIES[kind][0], kind, cells))
    return out


def claim_view(study: str, sp, claim, chosen: dict, formula: str, book: ScoreBook, settings=None) -> ClaimView:
    """A claim of the paper (`sp`: the study's paper table) on the runs chosen for its rows, with
    our difference, its interval, the seeds behind it and the verdict; `settings`: the report's
    (ReportParams), under which a claim whose row did not train is "undertrained" (the verdict it
    would have is kept as `judged`) and an effect several times the paper's is read against the
    encoder alone."""
    key = paper_metric_key(sp.column(claim.column).metric, formula)
    first, second = claim.rows
    view = ClaimView(study, claim.text, first, second, claim.column, claim.split, sp.paper_difference(claim),
                     chosen[first], chosen[second], kind=claim.kind, margin=claim.margin,
                     margin_reason=claim.margin_reason, quote=claim.quote, proxy=claim.proxy,
                     formula=FORMULA_NAME[formula] if sp.column(claim.column).metric == "overall" else "")
    est = None
    if view.better_run and view.worse_run:
        try:
            est = book.difference(view.better_run, view.worse_run, claim.split, key)
        except MinBertError:        # scored on different examples: no paired difference, so no verdict
            est = None
        view.seeds = tuple(len(book.members(r)) for r in (view.better_run, view.worse_run))
        view.seed_differences = seed_differences(view.better_run, view.worse_run, claim.split, key, book)
    if est is not None:
        view.difference, view.interval = est.value, est.interval(book.confidence)
    view.verdict = claim_verdict(view.paper_difference, est, book.confidence, claim.margin, claim.kind,
                                 view.seed_differences)
    if settings is None or view.verdict == "not run":
        return view
    training_check(view, sp, claim, chosen, key, book, settings.training_check)
    view.alone = encoder_alone(view, table_frozen_runs(sp, chosen, book), settings.encoder_alone_ratio, book, key)
    return view


def training_check(view: ClaimView, sp, claim, chosen: dict, key: str, book: ScoreBook, cfg) -> None:
    """The training check of a judged claim (docs/report.md, "The training check"): undertrained where a
    row did not train or more training would clearly move the difference past the verdict's boundary;
    inconclusive where the evaluations' noise cannot tell; the verdict it reads kept as `judged`."""
    size = claim.margin if claim.kind != "difference" else view.paper_difference
    view.tolerance, up, down = claim_bounds(cfg, claim.kind, size, view.difference, view.interval,
                                            claim.margin)
    printed = {chosen[r.label]: v for r in sp.rows if chosen.get(r.label) and not r.stand_in
               and (v := (getattr(r, claim.split, None) or {}).get(claim.column)) is not None}
    # a reference answers only for the row the claim finds better, on a difference that reads reproduced:
    # more training of that row could only widen its lead
    refs = references(sp, claim, chosen, book) if view.verdict == "reproduced" else {}
    check = ClaimCheck(key, claim.column, view.tolerance, claim.split, refs, printed, up, down)
    cells = {r.label: list(r.best_of) for r in sp.rows if r.best_of}
    view.training = [row_check(chosen[label], book, cfg, check, tuple(cells.get(label, ())))
                     for label in (view.better, view.worse)]
    statuses = {r.status for r in view.training}
    pair, view.settled = pair_check(view.training, check) if statuses == {"trained"} else ("", "")
    if "undertrained" in statuses or pair == "moving":
        view.judged, view.verdict = view.verdict, "undertrained"
    elif "unclear" in statuses or pair == "unclear":
        view.judged, view.verdict = view.verdict, "inconclusive"


def seed_differences(a: str, b: str, split: str, key: str, book: ScoreBook) -> list[float]:
    """a − b seed by seed, where both are repeated over the same seeds (their runs named
    `<name>.seed<seed>`); [] otherwise."""
    seeds_a = {m.rsplit(".seed", 1)[-1]: m for m in book.members(a) if ".seed" in m}
    seeds_b = {m.rsplit(".seed", 1)[-1]: m for m in book.members(b) if ".seed" in m}
    out = []
    for seed in seeds_a.keys() & seeds_b.keys():
        va, vb = (metric_value(book.data.runs[m], split, key) for m in (seeds_a[seed], seeds_b[seed]))
        if va is not None and vb is not None:
            out.append(float(va) - float(vb))
    return out if len(out) > 1 else []


def paper_table(study, data: ReportData, book: ScoreBook) -> PaperTableView | None:
    """A study's paper table: the paper's rows and columns, each cell the paper's value beside
    ours (interval, difference, whether the paper's value lies outside our interval), the summary
    rows over the same rows, and each claim's verdict."""
    sp = study.paper
    if sp is None:
        return None
    if study.left_out:
        return left_out_table(study, data)
    paper = data.params.params.papers[sp.id]
    splits = [s for s in ("dev", "test") if s == "dev" or any(getattr(r, s) for r in sp.rows)]
    columns = [(s, c.name, paper_metric_key(c.metric, paper.overall)) for s in splits for c in sp.columns]
    own_rows = sum(1 for r in sp.rows if not r.from_table)
    view = PaperTableView(study.name, sp.id, paper.title, sp.table, paper.overall, FORMULA_TEXT[paper.overall],
                          columns, splits, [_paper_row(row, columns, book) for row in sp.rows],
                          differs=list(paper.differs) + list(sp.differs), total_rows=sp.printed_rows or own_rows,
                          shown_rows=own_rows,
                          overall_name=next((c.name for c in sp.columns if c.metric == "overall"), ""),
                          stand_ins=any(r.stand_in for r in sp.rows))
    view.summary = _summary(view, sp.summary, [k for k in ("mean", "std") if k in sp.summary or k in study.summary],
                            book)
    chosen = {r.label: r.run for r in view.rows}
    settings = data.params.params.report
    view.claims = [claim_view(study.name, sp, claim, chosen, paper.overall, book, settings) for claim in sp.claims]
    view.scale = scale_line(data.params, paper, [r for r in chosen.values() if r], data.data_summary, sp.data)
    return view


def left_out_table(study, data: ReportData) -> PaperTableView:
    """A table the catalogue leaves out at this scale (`left_out`): the paper's rows and printed values
    alone, each of its claims counted as left out, with the catalogue's reason."""
    sp = study.paper
    paper = data.params.params.papers[sp.id]
    splits = [s for s in ("dev", "test") if s == "dev" or any(getattr(r, s) for r in sp.rows)]
    columns = [(s, c.name, paper_metric_key(c.metric, paper.overall)) for s in splits for c in sp.columns]
    rows = [PaperRowView(r.label, None, "", False,
                         cells={(s, name): PaperCell(getattr(r, s).get(name)) for s, name, _ in columns})
            for r in sp.rows]
    own_rows = sum(1 for r in sp.rows if not r.from_table)
    claims = [ClaimView(study.name, c.text, *c.rows, c.column, c.split, sp.paper_difference(c), None, None,
                        verdict="left out", kind=c.kind, margin=c.margin, margin_reason=c.margin_reason,
                        quote=c.quote, proxy=c.proxy, left_out=study.left_out) for c in sp.claims]
    return PaperTableView(study.name, sp.id, paper.title, sp.table, paper.overall, FORMULA_TEXT[paper.overall],
                          columns, splits, rows, claims=claims, differs=list(paper.differs) + list(sp.differs),
                          total_rows=sp.printed_rows or own_rows, shown_rows=0,
                          overall_name=next((c.name for c in sp.columns if c.metric == "overall"), ""),
                          left_out=study.left_out)


def paper_tables(data: ReportData, book: ScoreBook) -> dict[str, PaperTableView]:
    return {st.name: t for st in data.params.params.studies if (t := paper_table(st, data, book)) is not None}


# ------------------------------------------------------------------ the scorecard

@dataclass
class Scorecard:
    claims: list                                # ClaimView, every study's
    counts: dict                                # verdict -> number
    demo: bool                                  # the demo data: the verdicts say nothing of the papers
    scales: list = field(default_factory=list)  # [(study, its scale line)]: how these runs' scale differs
    devices: list = field(default_factory=list)   # where the numbers were made, from the run records
    scale: str = ""                             # the catalogue's scale: "laptop: ..." (params `scale`)
    seeds: list = field(default_factory=list)   # the distinct numbers of seeds of the judged claims' rows
    rows: dict = field(default_factory=dict)    # each claim row checked -> whether it trained in every claim

    @property
    def evidence(self) -> list[tuple[str, str]]:
        """(row, why) of each row that did not train: its first claim's evidence, said once."""
        seen: dict[str, str] = {}
        for claim in self.claims:
            for row in claim.training:
                if not row.trained and row.name not in seen:
                    seen[row.name] = row.evidence
        return sorted(seen.items())

    @property
    def rows_trained(self) -> int:
        return sum(self.rows.values())

    @property
    def rows_untrained(self) -> list[str]:
        return sorted(name for name, trained in self.rows.items() if not trained)

    @property
    def untrained_where(self) -> list[str]:
        """Each row that did not train, with the claim columns it did not train on and those it did
        ("cross_encoder on STS (trained on Overall)"): a row can count as untrained beside a claim of
        another column that it trained for and that is judged."""
        where: dict[str, dict[str, list[str]]] = {}
        for claim in self.claims:
            column = claim.column if claim.split == "dev" else f"{claim.split} {claim.column}"
            for row in claim.training:
                kept = where.setdefault(row.name, {"not": [], "trained": []})["trained" if row.trained else "not"]
                if column not in kept:
                    kept.append(column)
        return [f"{name} on {', '.join(w['not'])}" + (f" (trained on {', '.join(c for c in w['trained'] if c not in w['not'])})"
                                                      if set(w["trained"]) - set(w["not"]) else "")
                for name, w in sorted(where.items()) if w["not"]]

    @property
    def judged(self) -> int:
        """Claims with a verdict on the comparison (not undertrained, not run)."""
        return sum(self.counts.get(v, 0) for v in JUDGED)


def devices_of(data: ReportData) -> list[str]:
    """Every device the stages ran on, as their run records say ("cuda (NVIDIA H100 80GB HBM3)",
    "cpu"), with how many stage runs each."""
    seen: dict[str, int] = {}
    for info in data.run_infos:
        device = str(info.get("device") or "unknown device")
        gpu = info.get("gpu")
        text = f"{device} ({gpu})" if gpu else device
        seen[text] = seen.get(text, 0) + 1
    return [f"{d}: {n} stage run{'s' if n != 1 else ''}" for d, n in sorted(seen.items())]


def scorecard(tables: dict[str, PaperTableView], data: ReportData) -> Scorecard:
    claims = [c for t in tables.values() for c in t.claims]
    counts = {v: sum(1 for c in claims if c.verdict == v) for v in VERDICTS}
    demo = str(data.params.params.data.dir).rstrip("/").endswith("data/demo")
    scales = [(name, t.scale) for name, t in tables.items() if t.scale and t.claims]
    params = data.params.params
    scale = f"{params.scale}: {params.scales[params.scale].description}" if params.scale in params.scales else ""
    seeds = sorted({n for c in claims if c.verdict in JUDGED for n in c.seeds})
    return Scorecard(claims, counts, demo, scales, devices_of(data), scale, seeds, rows_checked(claims))


def rows_checked(claims: list) -> dict[str, bool]:
    """Every row a claim compares that the training check saw, and whether it trained in each claim
    it is in (a fine-tuned row may count as trained on one claim's column through the frozen
    reference and not on another's)."""
    out: dict[str, bool] = {}
    for claim in claims:
        for row in claim.training:
            out[row.name] = out.get(row.name, True) and row.trained
    return out
