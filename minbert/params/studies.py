"""The sections of params.yaml that only the report reads, and params.yaml as a whole: the studies
(the report's tables, their grids) with the papers' tables they reproduce (rows, columns, printed
values, claims), the report's settings, and `Params`, the model of the whole file.

They are apart from the settings' models (minbert.params.schema) so that no job but the report runs
them: a job receives its settings resolved in its job file and never reads the whole params, so an
edit to a claim check re-describes the report alone.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from minbert.core.tasks import TASKS
from minbert.params.fields import Strict, TaskName
from minbert.params.messages import close
from minbert.params.plateau import EvaluationNoise
from minbert.params.schema import DataParams, EnsembleParams, ExperimentParams, ExportParams, PretrainParams
from minbert.params.tasks import Declarations

PAPER_OVERALL = {"leaderboard": "overall", "mean": "mean"}   # a paper's overall formula -> metrics.json key
# what a paper column reads: its overall score (in the paper's formula) or one task's metric
PaperMetric = Literal[("overall",) + tuple(t.metric_key for t in TASKS.values())]
Split = Literal["dev", "test"]


# ---------------------------------------------------------------- grids

class GridAxis(Strict):
    """One axis of a study's grid: a setting and its values."""
    key: str = Field(description="an experiment setting, dotted: `finetune.hidden_dropout`")
    values: list[Any] = Field(description="the setting's values, each once")
    label: str = Field("", description="short name in the experiment names and the report; empty: the key's last "
                                       "part")

    @field_validator("values")
    @classmethod
    def _some_values(cls, v):
        if not v or len(v) != len({repr(x) for x in v}):
            raise ValueError("needs values, each once")
        return v

    @property
    def name(self) -> str:
        return self.label or self.key.rsplit(".", 1)[-1]


class GridParams(Strict):
    """A study's grid: every combination of the axes' values applied to one experiment, each an
    experiment of its own named <study>.<label><value>[.<label><value>] (e.g. dropout x lambda)."""
    experiment: str = Field(description="the experiment each cell changes")
    axes: list[GridAxis] = Field(min_length=1, max_length=2, description="one or two axes; the first varies "
                                                                         "slowest")


# ---------------------------------------------------------------- the papers' tables

class PaperDifference(Strict):
    """One setting in which this catalogue's runs of a paper differ from the paper (shown beside
    each of its tables as "differs from the paper")."""
    setting: str = Field(description="the setting, in words: \"learning rate\", \"model\"")
    paper: str = Field(description="the paper's value, as it states it (\"not stated\" where it does not)")
    ours: str = Field(description="this catalogue's value")
    why: str = Field("", description="why it differs, where the reason is not obvious (shown beside the difference)")


class PaperParams(Strict):
    """A report the catalogue reproduces: its title, its own overall formula, the scale it ran at
    (for the line under each of its tables that says how this run's scale differs) and every other
    setting in which this catalogue's runs differ from it."""
    title: str = Field(description="the paper's title")
    overall: Literal["leaderboard", "mean"] = Field(
        description="its overall score: `leaderboard`: (SST acc + Para acc + (STS r + 1) / 2) / 3; `mean`: the "
                    "plain mean of the three")
    model: str = Field("bert-base-uncased", description="the model it fine-tuned")
    epochs: int | None = Field(None, ge=1, description="the epochs of most of its rows")
    data: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="the training rows per task the paper trained its rows on, as it prints them (after its own "
                        "downsampling)")
    totals: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="where the paper prints no training rows for a task: the data set's size it prints (the scale "
                        "line says its training rows are not stated)")
    differs: list[PaperDifference] = Field(
        [], description="every setting (other than model, epochs and rows, which the scale line compares) in which "
                        "this catalogue's runs of the paper differ from it")


class PaperColumn(Strict):
    """One printed column of a paper's table."""
    name: str = Field(description="as printed: \"Overall Dev\", \"QQP\", \"DEV_TOTAL\"")
    metric: PaperMetric = Field(description="what it reads: `overall` (the paper's formula, "
                                            "`papers.<id>.overall`) or one task's metric")


class PaperRow(Strict):
    """One printed row: its label, what reproduces it (`run`: an experiment, a repeated experiment
    or an ensemble; or `best_of`: the best by dev of experiments or of studies' rows, as a paper's
    best-of-a-sweep row), and every value it prints, per split, by column name."""
    label: str = Field(description="the row's label as printed")
    run: str | None = Field(None, description="the experiment, repeated experiment or ensemble that reproduces it "
                                              "(it joins the study's rows)")
    best_of: list[str] = Field([], description="instead of `run`: experiments, ensembles or studies (their rows) "
                                               "whose best by dev stands for the row")
    from_table: str = Field("", description="a row of another table of the paper that this table's claims compare "
                                            "with (\"Table 1\"): it does not count among this table's rows")
    stand_in: str = Field("", description="when the run is not the paper's method for this row: how it differs (the "
                                          "page then names the run and shows the paper's label as what it compares "
                                          "to)")
    dev: dict[str, float] = Field({}, description="the printed dev values by column name")
    test: dict[str, float] = Field({}, description="the printed test values by column name")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.run is None) == (not self.best_of):
            raise ValueError(f"row '{self.label}': give either 'run' (an experiment or ensemble) or 'best_of' "
                             f"(experiments or studies whose best by dev stands for the row)")
        return self


class PaperClaim(Strict):
    """A finding the paper states about two of its rows, on one column, of one of three kinds.
    A difference: `better` scores higher than `worse` (the paper's difference is that of its printed
    values). No effect: `same` names the two rows the paper finds do not differ, and `margin` the
    largest difference either way that still counts as none; reproduced when our difference's
    interval lies within ±margin. No gain (one-sided: "failed to improve", "no clear improvement"):
    `no_gain` names the row the paper finds did not improve on the second, and `margin` the largest
    gain that still counts as none; reproduced when our interval lies below +margin. A margin is on
    the claim's own column (the paper's overall formula for its overall) and says why
    (`margin_reason`)."""
    text: str = Field(description="the claim in a few words")
    better: str | None = Field(None, description="the label of the row the paper finds better")
    worse: str | None = Field(None, description="the label of the row it finds worse")
    same: list[str] = Field([], description="instead of better / worse, a no-effect claim: the two rows the paper "
                                            "finds do not differ (the difference is the first − the second)")
    no_gain: list[str] = Field([], description="instead of better / worse, a one-sided claim: the row the paper "
                                               "finds did not improve on the second (\"failed to improve\"); the "
                                               "difference is the first − the second")
    margin: float | None = Field(None, gt=0, description="a no-effect or no-gain claim: the largest difference "
                                                         "(either sign; for no gain, the largest gain) that counts "
                                                         "as none, on the claim's column")
    margin_reason: str = Field("", description="a no-effect or no-gain claim: why that margin (shown on the page)")
    column: str = Field(description="the column compared")
    split: Split = Field("dev", description="the split compared")
    quote: str = Field("", description="the paper's words that state the finding (checked against its text); "
                                       "required where the paper prints no value for one of the rows")
    proxy: str = Field("", description="when the paper does not state this comparison itself: what it states "
                                       "and why this comparison stands for it (shown on the page)")

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k, given in (("better/worse", self.better is not None or self.worse is not None),
                                    ("same", bool(self.same)), ("no_gain", bool(self.no_gain))) if given]
        if len(kinds) != 1:
            raise ValueError(f"claim '{self.text}': give one of 'better' and 'worse' (a difference), 'same' (no "
                             f"effect) or 'no_gain' (did not improve){'' if not kinds else ', not ' + ' and '.join(kinds)}")
        if kinds[0] == "better/worse":
            if self.better is None or self.worse is None:
                raise ValueError(f"claim '{self.text}': a difference needs both 'better' and 'worse'")
            if self.margin is not None or self.margin_reason:
                raise ValueError(f"claim '{self.text}': 'margin' belongs to a no-effect ('same') or no-gain "
                                 f"('no_gain') claim")
            return self
        pair = self.same or self.no_gain
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ValueError(f"claim '{self.text}': '{kinds[0]}' names two different rows")
        if self.margin is None or not self.margin_reason.strip():
            raise ValueError(f"claim '{self.text}': a {'no-effect' if self.same else 'no-gain'} claim needs 'margin' "
                             f"and 'margin_reason' (the largest difference that counts as none, and why)")
        return self

    @property
    def kind(self) -> Literal["difference", "no_effect", "no_gain"]:
        return "no_effect" if self.same else "no_gain" if self.no_gain else "difference"

    @property
    def rows(self) -> tuple[str, str]:
        """The two rows compared: the difference is the first − the second."""
        pair = self.same or self.no_gain
        return (pair[0], pair[1]) if pair else (self.better, self.worse)


class StudyPaper(Strict):
    """The paper table a study reproduces, as data: which paper and table, its columns in order,
    its rows with every printed value, the summary rows it prints, and its claims."""
    id: str = Field(description="a key of `papers`")
    table: str = Field(description="the table's name in the paper: \"Table 2\", \"Figure 5\"")
    transcribed_in: str = Field("", description="the catalogue (params/NAME.yaml) whose table of this paper and name "
                                                "this one shows some rows of: its columns, printed values, data and "
                                                "the claims on those rows are taken from there, so a table is "
                                                "written once; give only each row's label, run and stand-in")
    columns: list[PaperColumn] = Field(min_length=1, description="its columns in the paper's order")
    rows: list[PaperRow] = Field(min_length=1, description="its rows in the paper's order")
    printed_rows: int | None = Field(None, ge=1, description="how many rows the paper's table prints, when this study "
                                                             "carries fewer (the page says \"k of n rows\")")
    summary: dict[Literal["mean", "std"], dict[str, float]] = Field(
        {}, description="its printed Average / Std rows by column name")
    data: dict[TaskName, Annotated[int, Field(ge=1)]] = Field(
        {}, description="the training rows per task of this table's rows, where they differ from the paper's `data` "
                        "(as the paper prints them)")
    claims: list[PaperClaim] = Field([], description="the comparisons the paper makes between its rows")
    differs: list[PaperDifference] = Field(
        [], description="settings in which this table's runs differ from the paper, beyond the paper's own `differs` "
                        "(which every table of the paper shows)")
    frozen_reference: str = Field(
        "", description="the label of a row of this table with the encoder frozen: a fine-tuned row whose dev curve "
                        "shows no plateau still counts as trained on a claim's column where it beats this row there "
                        "significantly (the report's training check)")
    reference_run: str = Field(
        "", description="instead of `frozen_reference`, for a table that prints no frozen-encoder row: an experiment "
                        "with the encoder frozen, run beside the table's rows but not one of them, that plays the "
                        "same part in the training check")
    encoder_alone: list[str] = Field(
        [], description="experiments with the encoder frozen (and no pretraining), run beside the table's rows but not "
                        "rows of it, each a row's heads over the untouched encoder: where our effect on a claim is "
                        "several times the paper's, the claim shows what these give the two rows' heads "
                        "(`report.encoder_alone_ratio`; a frozen row is its own)")

    @model_validator(mode="after")
    def _consistent(self):
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("columns: a column name is given twice")
        labels = [r.label for r in self.rows]
        own = sum(1 for r in self.rows if not r.from_table)
        if self.printed_rows is not None and self.printed_rows < own:
            raise ValueError(f"printed_rows: {self.printed_rows} is fewer than the {own} rows of this table given")
        if len(set(labels)) != len(labels):
            dup = next(x for x in labels if labels.count(x) > 1)
            raise ValueError(f"rows: label '{dup}' is given twice")
        for r in self.rows:
            for split in ("dev", "test"):
                for col in getattr(r, split):
                    if col not in names:
                        raise ValueError(f"row '{r.label}' {split}: unknown column '{col}'{close(col, names)}")
        for kind, values in self.summary.items():
            for col in values:
                if col not in names:
                    raise ValueError(f"summary {kind}: unknown column '{col}'{close(col, names)}")
        if self.frozen_reference and self.reference_run:
            raise ValueError("frozen_reference and reference_run: give one frozen-encoder reference, a row's label or "
                             "an experiment")
        if self.frozen_reference and self.frozen_reference not in labels:
            raise ValueError(f"frozen_reference: unknown row '{self.frozen_reference}'"
                             f"{close(self.frozen_reference, labels)}")
        for c in self.claims:
            for side in c.rows:
                if side not in labels:
                    raise ValueError(f"claim '{c.text}': unknown row '{side}'{close(side, labels)}")
            if c.column not in names:
                raise ValueError(f"claim '{c.text}': unknown column '{c.column}'{close(c.column, names)}")
            rows = {r.label: getattr(r, c.split) for r in self.rows}
            first, second = c.rows
            missing = [side for side in c.rows if c.column not in rows[side]]
            if missing:
                if not c.quote.strip():
                    raise ValueError(f"claim '{c.text}': the paper prints no {c.split} {c.column} for '{missing[0]}' "
                                     f"(give the 'quote' that states the finding)")
            elif c.kind == "difference" and rows[first][c.column] <= rows[second][c.column]:
                raise ValueError(f"claim '{c.text}': the paper's {first} ({rows[first][c.column]}) is not "
                                 f"above {second} ({rows[second][c.column]}) on {c.column}")
            elif c.kind == "no_gain" and rows[first][c.column] - rows[second][c.column] > c.margin:
                raise ValueError(f"claim '{c.text}': the paper's {first} ({rows[first][c.column]}) is more than the "
                                 f"margin {c.margin:g} above {second} ({rows[second][c.column]}) on {c.column}")
        return self

    def column(self, name: str) -> PaperColumn:
        return next(c for c in self.columns if c.name == name)

    def row(self, label: str) -> PaperRow:
        return next(r for r in self.rows if r.label == label)

    def paper_difference(self, claim: PaperClaim) -> float | None:
        """The paper's printed difference (the claim's first row − its second); None where it prints
        no value for one of them (the claim then rests on its quote)."""
        first, second = (getattr(self.row(label), claim.split).get(claim.column) for label in claim.rows)
        return None if first is None or second is None else first - second


class StudyParams(Strict):
    """One table of the report: experiments as rows, against a baseline row."""
    name: str = Field(description="the study's name (unique; its page and its grid cells are named by it)")
    title: str = Field(description="the table's title")
    experiments: list[str] = Field([], description="its rows: experiments, repeated experiments or ensembles "
                                                   "(a grid's cells and a paper table's runs are added)")
    grid: GridParams | None = Field(None, description="more rows: the grid's cells")
    summary: list[Literal["mean", "std"]] = Field([], description="rows under the table: the mean / spread of each "
                                                                  "column")
    repeats: Annotated[int, Field(ge=1, le=100)] | None = Field(None, description="seeds for every row that sets "
                                                                                  "none")
    baseline: str | None = Field(None, description="the row the others are compared with; null: the first row")
    splits: list[Literal["dev", "test"]] = Field(["dev", "test"], description="the splits the table shows")
    source: str = Field("", description="which paper table it reproduces, in words")
    paper: StudyPaper | None = Field(None, description="that table as data: rows, columns, printed values, claims")
    left_out: str = Field("", description="why this table is not run (at a scale: `scales.<name>.named.studies`): "
                                          "the page shows it with the paper's values and this reason, its claims "
                                          "are counted as left out, and its rows run only where another table, a "
                                          "reference or an ensemble that runs needs them")


class TrainingCheckParams(Strict):
    """When a row counts as trained, so that a claim's verdict judges the method and not a run cut
    short (docs/report.md, "The training check"): on each phase of each training stage it depends on,
    the dev selection score and the claim's own column must have evaluations enough to show a curve,
    rise clearly above what a constant prediction scores, and have settled at the noise of their
    evaluations (minbert.train.plateau: their trend over the last `window` of the learning-rate budget,
    with its standard error, within the claim's tolerance); a pretraining must have lowered its own dev
    loss and flattened; and more training must not move the claim's difference past its verdict's
    boundary. Where the noise cannot tell, the claim is inconclusive."""
    min_evaluations: int = Field(4, ge=3, description="fewer dev evaluations in a phase cannot show a plateau (raise "
                                                      "`finetune.evals_per_epoch` for a short run)")
    window: float = Field(0.25, gt=0, lt=1, description="the last share of a phase's learning-rate budget (the learning "
                                                        "rate summed over its updates) whose trend is read, as the "
                                                        "change one more such share of training would bring")
    fit: float = Field(0.5, gt=0, lt=1, description="the last share of a phase's learning-rate budget the trend is "
                                                    "fitted over (at least the window): more evaluations, a smaller "
                                                    "error; where the curve still bends there, the steeper slope")
    window_evaluations: int = Field(2, ge=1, description="the fewest evaluations within the window that show a trend "
                                                         "(and one before the fit)")
    share: float = Field(0.5, gt=0, le=1, description="the tolerance: this share of the smaller of the claim's size "
                                                      "(the paper's difference and ours, or the margin) and our "
                                                      "interval's distance from the verdict's boundary")
    min_tolerance: float = Field(0.002, ge=0, description="the smallest tolerance (a move below it is not asked about)")
    tolerance: float = Field(0.01, ge=0, description="the largest tolerance, and the tolerance of a claim whose size "
                                                     "the paper does not print")
    noise: EvaluationNoise = Field(EvaluationNoise(), description="how much a task's dev score moves between two "
                                                                  "evaluations of a model that has stopped improving")
    above_chance: float = Field(0.02, ge=0, description="how far the best score must rise above a constant "
                                                        "prediction's (the majority class, a zero correlation)")
    pretrain_min_drop: float = Field(0.01, ge=0, lt=1, description="a pretraining moved when its best dev loss is "
                                                                   "at least this share below the starting model's")
    pretrain_share: float = Field(0.1, gt=0, le=1, description="a pretraining flattened when the trend of its last "
                                                               "window lowers its loss by at most this share of its "
                                                               "whole drop")

    @model_validator(mode="after")
    def _ordered(self):
        if self.fit < self.window:
            raise ValueError(f"fit ({self.fit:g}) is below window ({self.window:g}): the trend is fitted over at least "
                             f"the window")
        if self.min_tolerance > self.tolerance:
            raise ValueError(f"min_tolerance ({self.min_tolerance:g}) is above tolerance ({self.tolerance:g})")
        return self


class ReportParams(Strict):
    """The report's settings (docs/report.md)."""
    title: str = Field("Multi-task minBERT", description="the report's title")
    worst_k: int = Field(10, ge=1, description="how many of the worst-predicted dev examples each experiment's "
                                               "page lists per task")
    training_check: TrainingCheckParams = Field(TrainingCheckParams(), description="when a claim's row counts as "
                                                                                   "trained")
    encoder_alone_ratio: float = Field(3.0, ge=1, description="where our effect on a claim is this many times the "
                                                              "paper's or more, the claim shows what the encoder alone "
                                                              "gives the two rows' heads (`paper.encoder_alone`)")


# ---------------------------------------------------------------- scales

class ScaleDifference(PaperDifference):
    """A difference a scale brings, declared beside the tables of the papers it concerns."""
    papers: list[str] = Field([], description="the papers (keys of `papers`) it concerns; empty: every paper")


class ScaleNamed(Strict):
    """A scale's settings for single rows, by name, deep-merged last (over what the scale gives all)."""
    experiments: dict[str, dict[str, Any]] = Field({}, description="experiment name -> its settings at this scale "
                                                                   "(`template: true`: not run at this scale)")
    pretrainings: dict[str, dict[str, Any]] = Field({}, description="pretraining name -> its settings at this scale")
    studies: dict[str, dict[str, Any]] = Field({}, description="study name -> its settings at this scale (its "
                                                               "`experiments`, its `grid`)")


class ScaleParams(Strict):
    """One scale of a catalogue (`scales.<name>`, chosen by `scale`): what it changes in every run,
    how many seeds the claims' rows run, and every way in which that departs from the papers.
    The catalogue's rows, claims and declarations are written once; a scale is applied over them."""
    description: str = Field(description="the scale in a few words (shown on the scorecard)")
    base: dict[str, Any] = Field({}, description="deep-merged into `base`")
    experiments: dict[str, Any] = Field({}, description="deep-merged over every experiment's own settings (so it "
                                                        "wins over them)")
    frozen: dict[str, Any] = Field({}, description="deep-merged, after `experiments`, over every experiment that "
                                                   "freezes its encoder (finetune.freeze_encoder): what a row that "
                                                   "trains its heads alone can afford, its encoder's outputs computed "
                                                   "once")
    pretrainings: dict[str, Any] = Field({}, description="deep-merged over every pretraining's settings")
    repeats: Annotated[int, Field(ge=1, le=100)] | None = Field(
        None, description="seeds of every row of a study whose paper table has claims (the verdicts resample them)")
    named: ScaleNamed = Field(ScaleNamed(), description="settings for one experiment, pretraining or study, by its "
                                                        "name, deep-merged last (a sweep's values for this scale, say)")
    differs: list[ScaleDifference] = Field([], description="each way in which this scale departs from the papers")


# ---------------------------------------------------------------- params.yaml as a whole

class Params(Declarations):
    """params.yaml (or params.yaml's `catalogue` and `report` with a catalogue file's sections). Its
    `modules` and `tasks` (Declarations) come first: they are read before every section that names
    their tasks, losses and heads, and its tasks are then the declared ones."""

    catalogue: str = Field("demo", description="`demo`: the sections of params.yaml; NAME: the sections of "
                                               "params/NAME.yaml instead")
    data: DataParams = Field(DataParams(), description="how `prepare` reads and checks the raw files")
    base: ExperimentParams = Field(ExperimentParams(), description="the settings every experiment starts from (an "
                                                                   "experiment's keys)")
    pretrainings: dict[str, PretrainParams] = Field({}, description="named pretrainings; experiments refer to them "
                                                                    "by name and share one output")
    experiments: dict[str, dict[str, Any]] = Field(description="named experiments, each what it changes in `base` "
                                                               "(deep-merged)")
    ensembles: dict[str, EnsembleParams] = Field({}, description="named ensembles over member experiments")
    papers: dict[str, PaperParams] = Field({}, description="the reports whose tables studies reproduce "
                                                           "(`studies[].paper`)")
    studies: list[StudyParams] = Field([], description="the report's tables")
    report: ReportParams = Field(ReportParams(), description="report settings")
    export: ExportParams = Field(ExportParams(), description="the experiments exported in the Hugging Face format")
    scales: dict[str, ScaleParams] = Field({}, description="the scales the catalogue runs at, by name "
                                                           "(minbert.params.scales applies the chosen one)")
    scale: str | None = Field(None, description="the scale of `scales` to run at (params.yaml's, else the "
                                                "catalogue's); null where the catalogue has none")
    model: str | None = Field(None, description="the model every experiment starts from, in place of `base.model` "
                                                "(an experiment that names its own keeps it): `bert-base-uncased` "
                                                "runs the papers' catalogue on the papers' model; null: "
                                                "`base.model`")

