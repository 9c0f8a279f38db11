"""The papers' tables as data: the schema's checks (one-line errors with the nearest name), and
every transcribed number of every catalogue found in its paper's text (../shared/papers), with
a check that an altered number is caught."""
from __future__ import annotations

import copy

import pytest
from conftest import REPO

from minbert.core.errors import MinBertError
from minbert.params import read_yaml, validate_params
from minbert.params.papers import numbers, transcription_problems

CATALOGUES = ["params.yaml", "params/full.yaml", "params/minilm.yaml", "params/reproduce.yaml"]


@pytest.fixture(scope="module")
def papers_dir():
    d = REPO.parent / "shared" / "papers"
    if not d.is_dir():
        pytest.skip("../shared/papers is not present")
    return d


def _raw(path="params/full.yaml") -> dict:
    return read_yaml(REPO / path)


def _study(raw: dict, name: str) -> dict:
    return next(s for s in raw["studies"] if s["name"] == name)


@pytest.mark.parametrize("catalogue", CATALOGUES)
def test_every_transcribed_number_is_in_its_paper(catalogue, papers_dir):
    params = validate_params(_raw(catalogue), catalogue).params
    assert transcription_problems(params, papers_dir) == []


def test_the_full_catalogue_transcribes_every_mapped_table():
    params = validate_params(_raw(), "full").params
    tables = {(s.paper.id, s.paper.table) for s in params.studies if s.paper}
    assert {("000", f"Table {k}") for k in (1, 2, 3, 4)} <= tables
    assert {("002", "Table 2"), ("002", "Table 3"), ("002", "Table 4"), ("003", "Figures 5 and 6"),
            ("004", "Table 2"), ("004", "section 3.2")} <= tables
    r = next(s for s in params.studies if s.name == "p004_extensions").paper
    assert [row.label for row in r.rows] == [f"R{k}" for k in range(1, 12)]
    assert r.row("R3").dev["STS Dev"] == -0.048


@pytest.mark.parametrize("study, row, column, wrong", [
    ("p004_extensions", 3, "SST Dev", 0.498),           # a transposed digit
    ("p000_heads", 0, "Score", 0.383),
    ("p002_ensemble", 0, "Overall", 0.801),
])
def test_an_altered_number_is_caught(papers_dir, study, row, column, wrong):
    raw = _raw()
    paper = _study(raw, study)["paper"]
    split = "test" if study == "p002_ensemble" else "dev"
    paper["rows"][row][split][column] = wrong
    problems = transcription_problems(validate_params(raw, "full").params, papers_dir)
    assert len(problems) == 1 and study in problems[0] and paper["rows"][row]["label"] in problems[0]


def test_an_altered_summary_value_or_data_size_is_caught(papers_dir):
    raw = _raw()
    _study(raw, "p004_extensions")["paper"]["summary"]["std"]["Para Dev"] = 0.05
    raw["papers"]["004"]["data"]["para"] = 141489
    problems = transcription_problems(validate_params(raw, "full").params, papers_dir)
    assert len(problems) == 2 and any("summary std" in p for p in problems) and any("141489" in p for p in problems)


def test_numbers_reads_a_minus_set_apart_and_skips_exponents():
    assert numbers("R3 0.279 0.260 - 0.048 0.625, lr $1e-5$ v0.3 and .5") == [0.279, 0.26, -0.048, 0.625, 0.5]


def _error(raw) -> str:
    with pytest.raises(MinBertError) as e:
        validate_params(raw, "params.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("change, expected", [
    (lambda p: p["claims"][0].update(better="R22"), "unknown row 'R22' (did you mean 'R2'?)"),
    (lambda p: p["claims"][0].update(column="Overal Dev"), "unknown column 'Overal Dev' (did you mean 'Overall Dev'?)"),
    (lambda p: p["columns"][0].update(metric="overal"), "studies.9.paper.columns.0.metric"),
    (lambda p: p["rows"][0]["dev"].update({"SST dev": 0.2}), "unknown column 'SST dev' (did you mean 'SST Dev'?)"),
    (lambda p: p["rows"][0].update(run="p004_r1_pretraind"), "did you mean 'p004_r1_pretrained'?"),
    (lambda p: p["rows"][8].update(best_of=["p004_lr_swep"]), "did you mean 'p004_lr_sweep'?"),
    (lambda p: p.update(id="005"), "unknown paper '005'"),
    (lambda p: p["claims"][0].update(better="R1", worse="R2"), "is not above R2"),
    (lambda p: p["rows"][1].update(label="R1"), "label 'R1' is given twice"),
])
def test_paper_table_errors_are_one_line_and_name_the_key(change, expected):
    raw = _raw()
    change(_study(raw, "p004_extensions")["paper"])
    assert expected in _error(raw)


def test_a_row_runs_one_thing():
    raw = _raw()
    _study(raw, "p004_extensions")["paper"]["rows"][0]["best_of"] = ["p004_r2_finetuned"]
    assert "either 'run'" in _error(raw)


def test_a_paper_row_joins_its_study_and_best_of_a_study_stands_for_its_rows():
    raw = copy.deepcopy(_raw())
    st = _study(raw, "p004_extensions")
    st["experiments"] = []
    loaded = validate_params(raw, "full")
    study = next(s for s in loaded.params.studies if s.name == "p004_extensions")
    assert study.experiments[:2] == ["p004_r1_pretrained", "p004_r2_finetuned"]
    assert "p004_lr_sweep.lr0.0001" in study.paper.row("R9").best_of
    assert "p004_dropout_sweep.dropout0.6" in study.paper.row("R9").best_of


@pytest.mark.parametrize("catalogue", CATALOGUES)
def test_each_papers_formula_gives_its_printed_overall(catalogue):
    """The overall formula given for a paper (leaderboard or plain mean) reproduces, to its
    printed rounding, every printed overall from the same row's printed task scores."""
    from minbert.scoring.stats import leaderboard, plain_mean

    params = validate_params(_raw(catalogue), catalogue).params
    checked = 0
    for st in params.studies:
        if st.paper is None:
            continue
        formula = {"leaderboard": leaderboard, "mean": plain_mean}[params.papers[st.paper.id].overall]
        by_metric = {c.metric: c.name for c in st.paper.columns}
        for row in st.paper.rows:
            for values in (row.dev, row.test):
                keys = ("sst_acc", "para_acc", "sts_pearson", "overall")
                if all(by_metric.get(k) in values for k in keys):
                    sst, para, sts, overall = (values[by_metric[k]] for k in keys)
                    assert abs(formula(sst, para, sts) - overall) < 1e-3, (st.name, row.label)
                    checked += 1
    if catalogue == "params/full.yaml":
        assert checked >= 40
