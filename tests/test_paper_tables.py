"""The papers' tables as data: the schema's checks (one-line errors with the nearest name), and
every transcribed number of every catalogue found in its paper's text (../shared/papers), with
a check that an altered number is caught."""
from __future__ import annotations

import copy

import pytest
from conftest import REPO

from minbert.core.errors import MinBertError
from minbert.params import read_yaml, validate_params
from minbert.params.papers import numbers, transcription_problems, written_twice

CATALOGUES = ["params.yaml", "params/papers.yaml", "params/minilm.yaml"]


@pytest.fixture(scope="module")
def papers_dir():
    d = REPO.parent / "shared" / "papers"
    if not d.is_dir():
        pytest.skip("../shared/papers is not present")
    return d


def _raw(path="params/papers.yaml") -> dict:
    return read_yaml(REPO / path)


def _study(raw: dict, name: str) -> dict:
    return next(s for s in raw["studies"] if s["name"] == name)


@pytest.mark.parametrize("catalogue", CATALOGUES)
def test_every_transcribed_number_is_in_its_paper(catalogue, papers_dir):
    params = validate_params(_raw(catalogue), catalogue).params
    assert transcription_problems(params, papers_dir) == []


def test_the_catalogue_transcribes_every_mapped_table():
    params = validate_params(_raw(), "papers").params
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
    problems = transcription_problems(validate_params(raw, "papers").params, papers_dir)
    assert len(problems) == 1 and study in problems[0] and paper["rows"][row]["label"] in problems[0]


def test_an_altered_summary_value_or_data_size_is_caught(papers_dir):
    raw = _raw()
    _study(raw, "p004_extensions")["paper"]["summary"]["std"]["Para Dev"] = 0.05
    raw["papers"]["004"]["data"]["para"] = 141489
    problems = transcription_problems(validate_params(raw, "papers").params, papers_dir)
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
    loaded = validate_params(raw, "papers")
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
    if catalogue == "params/papers.yaml":
        assert checked >= 40


# ---------------------------------------------------------------- claims as their papers state them

CLAIM_CATALOGUES = ["params.yaml", "params/papers.yaml"]
COLUMN_METRIC = {"sst": "sst_acc", "qqp": "para_acc", "para": "para_acc", "sts": "sts_pearson",
                 "cfimdb": "cfimdb_acc", "overall": "overall", "score": "overall", "dev_total": "overall"}


def _claims(catalogue):
    params = validate_params(_raw(catalogue), catalogue).params
    return [(st, c) for st in params.studies if st.paper for c in st.paper.claims]


@pytest.mark.parametrize("catalogue", CLAIM_CATALOGUES)
def test_every_claim_compares_the_papers_rows_on_the_metric_its_column_prints(catalogue):
    """A claim's column reads what its printed name says, and each of its two rows either carries the
    paper's printed value in that column (found in the paper's text by the test above) or the claim
    quotes the words in which the paper states it."""
    for st, c in _claims(catalogue):
        column = st.paper.column(c.column)
        word = column.name.split()[0].lower()
        assert COLUMN_METRIC[word] == column.metric, (st.name, c.text, column.name)
        for label in c.rows:
            printed = getattr(st.paper.row(label), c.split)
            assert c.column in printed or c.quote, (st.name, c.text, label)


@pytest.mark.parametrize("catalogue", CLAIM_CATALOGUES)
def test_every_claim_quotes_its_paper_or_says_why_it_is_a_proxy(catalogue):
    for st, c in _claims(catalogue):
        assert c.quote or c.proxy, (st.name, c.text)
        if c.kind in ("no_effect", "no_gain"):
            assert c.margin and c.margin_reason and c.quote, (st.name, c.text)


def test_claims_of_the_same_finding_agree_between_the_demo_and_the_catalogue():
    """The demo encodes a claim it shares with params/papers.yaml as the catalogue does."""
    papers = {(st.paper.id, st.paper.table, c.text): c for st, c in _claims("params/papers.yaml")}
    shared = 0
    for st, c in _claims("params.yaml"):
        f = papers.get((st.paper.id, st.paper.table, c.text))
        if f is None:
            continue
        shared += 1
        assert (c.kind, c.column, c.split, c.quote, c.proxy, c.margin) == \
               (f.kind, f.column, f.split, f.quote, f.proxy, f.margin), c.text
    assert shared >= 3


def _claim(catalogue, study, text):
    st = next(s for s, _ in _claims(catalogue) if s.name == study)
    return next(c for c in st.paper.claims if c.text == text)


@pytest.mark.parametrize("catalogue, study, text, kind, rows, column, difference", [
    # 004 compares SMART (R6) with lambda 0 (R7), "reduced performance by 0.03", not with R4
    ("params/papers.yaml", "p004_extensions", "SMART (lambda 5) lowers the score against lambda 0", "difference",
     ("R7", "R6"), "Overall Dev", 0.034),
    # "did not improve performance nor did it impair performance": no effect
    ("params/papers.yaml", "p004_extensions", "PCGrad neither improves nor impairs R4", "no_effect", ("R8", "R4"),
     "Overall Dev", -0.009),
    ("params/papers.yaml", "p004_extensions", "additional pretraining lowers the score", "difference", ("R4", "R5"),
     "Overall Dev", 0.015),
    # 002 names QQP and STS for simultaneous training, not Overall
    ("params/papers.yaml", "p002_methods", "simultaneous training raises QQP", "difference",
     ("Concat+SMART*", "Concat+SMART"), "QQP", 0.101),
    ("params/papers.yaml", "p002_methods", "simultaneous training raises STS", "difference",
     ("Concat+SMART*", "Concat+SMART"), "STS", 0.103),
    ("params/papers.yaml", "p002_methods", "gradient surgery brings no clear improvement", "no_gain",
     ("Concat+SMART+Surgery+Pretrain", "Concat+SMART+Pretrain"), "Overall", -0.001),
    # 003's label scale, stated in words only
    ("params/papers.yaml", "p003_embeddings", "labels scaled to 0..1 beat -1..1", "difference",
     ("STS_PARA_HEAD_MOD", "STS_PARA_HEAD_MOD, STS labels scaled to -1..1"), "STS", None),
    # 000 compares its MLM rows with Table 1's baseline
    ("params/papers.yaml", "p000_mlm_or_multitask", "MLM on Para and STS beats the baseline", "difference",
     ("MLM Para and STS", "Baseline (Table 1)"), "Score", 0.017),
    ("params/papers.yaml", "p000_mlm_or_multitask", "MLM on all data falls below the baseline", "difference",
     ("Baseline (Table 1)", "MLM All"), "Score", 0.008),
    ("params/papers.yaml", "p000_mlm_or_multitask", "MLM on SST and STS falls below the baseline", "difference",
     ("Baseline (Table 1)", "MLM SST and STS"), "Score", 0.013),
])
def test_the_re_encoded_claims(catalogue, study, text, kind, rows, column, difference):
    params = validate_params(_raw(catalogue), catalogue).params
    st = next(s for s in params.studies if s.name == study)
    c = next(c for c in st.paper.claims if c.text == text)
    assert (c.kind, c.rows, c.column) == (kind, rows, column)
    paper = st.paper.paper_difference(c)
    assert (paper is None) if difference is None else abs(paper - difference) < 1e-9


def test_the_old_proxies_are_gone_or_labelled():
    texts = {c.text: c for _, c in _claims("params/papers.yaml")}
    assert "MLM on Para and STS beats MLM on all data" not in texts
    assert "simultaneous training beats sequential" not in texts
    assert "SMART (lambda 5) lowers the score" not in texts and "PCGrad does not improve on R4" not in texts
    assert "best cells of its grid" in texts["lambda 5 with dropout 0.1 beats lambda 1 with dropout 0.3"].proxy
    assert "says nothing of it" in texts["the shared layers raise PARA"].proxy


def test_a_quote_not_in_the_paper_is_caught(papers_dir):
    raw = _raw()
    claim = _study(raw, "p004_extensions")["paper"]["claims"][0]
    claim["quote"] = "fine tuning was a triumph"
    problems = transcription_problems(validate_params(raw, "papers").params, papers_dir)
    assert len(problems) == 1 and "fine tuning was a triumph" in problems[0] and "p004_extensions" in problems[0]


@pytest.mark.parametrize("change, expected", [
    (lambda c: c.update(same=["R8", "R4"]), "not better/worse and same"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(same=["R8", "R4"], no_gain=["R8", "R4"], margin=0.01,
                                                          margin_reason="x")), "not same and no_gain"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(no_gain=["R8", "R4"])), "a no-gain claim needs 'margin'"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(no_gain=["R2", "R1"], margin=0.01, margin_reason="x")),
     "the paper's R2 (0.512) is more than the margin 0.01 above R1 (0.282)"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(same=["R8", "R4"])), "needs 'margin' and 'margin_reason'"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(same=["R4", "R4"], margin=0.01, margin_reason="x")),
     "two different rows"),
    (lambda c: c.update(margin=0.01), "'margin' belongs to a no-effect ('same') or no-gain ('no_gain') claim"),
    (lambda c: (c.pop("better"), c.pop("worse"), c.update(same=["R8", "R44"], margin=0.01, margin_reason="x")),
     "unknown row 'R44'"),
])
def test_claim_kind_errors_are_one_line(change, expected):
    raw = _raw()
    change(_study(raw, "p004_extensions")["paper"]["claims"][0])
    assert expected in _error(raw)


def test_a_row_printed_nowhere_needs_the_papers_words():
    raw = _raw()
    claims = _study(raw, "p003_embeddings")["paper"]["claims"]
    scale = next(c for c in claims if c["text"] == "labels scaled to 0..1 beat -1..1")
    scale.pop("quote")
    assert "prints no dev STS for 'STS_PARA_HEAD_MOD, STS labels scaled to -1..1'" in _error(raw)


def test_the_catalogue_is_written_at_the_papers_settings():
    """params/papers.yaml at its own (the papers') scale: each paper's learning rate, batch and
    epochs, pooling, dropout and 000's head re-training; what no paper states off; no caps on the
    training rows; every other difference declared per paper, each table's own beside it
    (tests/test_scales.py: the plan, and the laptop scale over it)."""
    from minbert.params import load_params

    lp = load_params(REPO / "params/papers.yaml")
    assert lp.params.scale == "paper" and lp.base.model == "all-MiniLM-L6-v2"
    expected = {"p000": (1e-5, 8, 10), "p002": (1e-5, 8, 10), "p003": (2e-5, 32, 3), "p004": (1e-5, 16, 10)}
    frozen_rate = ("p004_r1_pretrained", "p004_r3_cos_pretrained", "p002_frozen", "p003_frozen",
                   "p002_frozen_cos_sim", "p003_frozen_head_mod", "p004_obj2_sst_frozen", "p004_obj2_cfimdb_frozen")
    for name, e in lp.experiments.items():
        f = e.finetune
        row = name.rsplit(".seed", 1)[0]
        lr, batch, epochs = expected[name[:4]]
        if row in frozen_rate:
            # 004's frozen rows, the frozen references of the tables that print none and their encoder-alone
            # runs: the heads' rate of 004's frozen rows
            assert f.freeze_encoder and f.head_lr == 1e-3, name
            continue
        if row.startswith(("p004_r9", "p004_lr_sweep", "p004_dropout_sweep")):
            epochs = 6                                  # 004's R9: R4 for six epochs, one setting varied
            lr = f.lr if row.startswith("p004_lr_sweep") else lr
        if row.startswith("p004_obj2"):
            batch = 8                                   # Objective 2: the course's defaults
        if row.startswith("p002_dropout_lambda"):
            assert f.hidden_dropout in (0.1, 0.2, 0.3, 0.4, 0.5), name
        elif name.startswith("p002"):
            assert f.hidden_dropout == 0.3, name
        assert (f.lr, f.batch_size, f.epochs) == (lr, batch, epochs), name
        assert f.head_lr in (None, f.lr), name          # heads at the encoder's rate
        assert (f.warmup_ratio, f.weight_decay, f.grad_clip, f.lr_schedule) == (0.0, 0.0, None, "constant"), name
        assert f.heads.pooling == "cls", name
        assert not f.downsample.caps and f.downsample.mode in ("none", "smallest"), name
        if row in ("p000_mt_sequential_rr", "p000_mt_drop_rr", "p000_sft", "p000_mlm_sst_para_mt"):
            rh = e.retrain_heads
            assert rh.enabled and (rh.lr, rh.batch_size, rh.epochs, rh.downsample.mode) == (1e-5, 8, 10, "none"), name
    mlm = lp.params.pretrainings["mlm_sst_para"]
    assert (mlm.lr, mlm.batch_size, mlm.warmup_ratio, mlm.epochs, mlm.mlm.downsample.size) == (1e-5, 8, 0.0, 20, 6040)
    for n in ("nli_regression", "nli_contrastive", "nli_triplet"):
        nli = lp.params.pretrainings[n]
        assert (nli.lr, nli.batch_size, nli.nli.pooling, nli.warmup_ratio) == (2e-5, 32, "cls", 0.0)
        assert nli.evals_per_epoch == 4                 # a curve for the training check, declared below
    for pid, paper in lp.params.papers.items():
        assert paper.differs, pid
        assert all(d.setting and d.paper and d.ours for d in paper.differs)
    assert lp.params.papers["004"].data == {"sst": 6040, "para": 6040, "sts": 6040}
    assert not lp.params.papers["000"].data and lp.params.papers["000"].totals
    tables = {st.name: st.paper for st in lp.params.studies if st.paper}
    assert {d.setting for d in tables["p004_extensions"].differs} == {"R9", "R10", "R11"}
    assert tables["p004_extensions"].frozen_reference == "R1"
    assert (tables["p002_methods"].reference_run, tables["p003_embeddings"].reference_run) == \
        ("p002_frozen", "p003_frozen")
    assert (tables["p002_methods"].encoder_alone, tables["p003_embeddings"].encoder_alone) == \
        (["p002_frozen_cos_sim"], ["p003_frozen_head_mod"])
    # every difference of the papers' scale declared as data beside its tables: each paper's precision,
    # 000's round-robin, 003's contrastive temperature and NLI dev loss, 004's summed PCGrad; the scale's
    # own: 003's evaluations, 002's Para phase
    differs = {pid: {d.setting: d for d in paper.differs} for pid, paper in lp.params.papers.items()}
    assert all("bf16" in differs[pid]["precision"].ours for pid in differs)
    assert "Algorithm 1" in differs["000"]["round-robin"].ours
    assert "0.05" in differs["003"]["contrastive NLI objective"].ours and \
        lp.params.pretrainings["nli_contrastive"].nli.temperature == 0.05
    assert "4 times" in differs["003"]["NLI pretraining's dev loss"].ours
    assert "PCGrad sums" in differs["004"]["the summed losses"].ours
    assert "3 times an epoch, the best of the 9" in differs["003"]["dev evaluations"].ours
    assert "within just 2 epochs" in differs["002"]["Para's phase"].paper
    assert "bert-base" not in str([d.paper for d in lp.params.papers["003"].differs])   # 003 states no width


def test_the_model_is_a_setting_and_the_heads_follow_its_width(tmp_path):
    """`model` in params.yaml runs the one catalogue on another encoder: every experiment starts from
    it, and the shared layers written as the encoder's width (or half of it: 000's 768 -> 384) take
    that encoder's; the line under each table names the model against the paper's."""
    import shutil

    from minbert.params import load_params

    (tmp_path / "params").mkdir()
    shutil.copy(REPO / "params" / "papers.yaml", tmp_path / "params" / "papers.yaml")
    for model in ("bert-base-uncased", None):
        chosen = f"model: {model}\n" if model else ""
        (tmp_path / "params.yaml").write_text("catalogue: papers\nscale: paper\n" + chosen)
        lp = load_params(tmp_path / "params.yaml")
        assert {e.model for e in lp.experiments.values()} == {model or "all-MiniLM-L6-v2"}
        shared = lp.experiments["p000_head_shared.seed11711"].finetune.heads.shared
        assert shared.sizes == ["encoder/2"]
    assert lp.params.papers["000"].model == "bert-base-uncased"


@pytest.mark.parametrize("change,message", [
    ({"reference_run": "p002_frozn"}, "key 'studies[4].paper.reference_run' (study 'p002_methods'): unknown experiment "
                                      "'p002_frozn' (did you mean 'p002_frozen'?)"),
    ({"reference_run": "p002_baseline"}, "key 'studies[4].paper.reference_run' (study 'p002_methods'): 'p002_baseline' "
                                         "fine-tunes its encoder; the reference is a run with finetune.freeze_encoder: true"),
    ({"frozen_reference": "Baseline"}, "frozen_reference and reference_run: give one frozen-encoder reference"),
])
def test_a_tables_frozen_reference_exists_and_is_frozen(change, message):
    raw = _raw("params/papers.yaml")
    _study(raw, "p002_methods")["paper"].update(change)
    with pytest.raises(MinBertError) as err:
        validate_params(raw, "papers.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_demo_and_minilm_catalogues_claim_no_more_than_they_run():
    """The demo's runs are not the papers' methods (each row says how it differs); a partial table
    says how many rows the paper prints; a seed ensemble is not captioned as 002's five-model
    ensemble; minilm's titles state no hardware and its sources cite the papers' own tables."""
    demo = validate_params(_raw("params.yaml"), "params.yaml").params
    for st in demo.studies:
        if st.paper:
            assert all(r.stand_in for r in st.paper.rows), st.name
            assert st.paper.printed_rows and st.paper.printed_rows > len(st.paper.rows), st.name
    assert "five differently tuned models" in _study(_raw("params.yaml"), "seed_ensemble")["source"]
    minilm = _raw("params/minilm.yaml")
    for st in minilm["studies"]:
        assert not any(w in st["title"] for w in ("CPU", "cores", "GPU")), st["title"]
        assert "001" not in st.get("source", "")
    sources = " ".join(st.get("source", "") for st in minilm["studies"])
    assert "000, Tables 2-4" in sources and "003, Figure 5" in sources and "000, Table 1;" not in sources.split("bi-encoder")[0]


def _params_files() -> dict[str, dict]:
    paths = [REPO / "params.yaml", *sorted((REPO / "params").glob("*.yaml"))]
    return {p.relative_to(REPO).as_posix(): read_yaml(p) for p in paths}


def test_every_table_claim_and_paper_is_written_in_one_file():
    """The papers' tables, claims and titles are transcribed once (params/papers.yaml); the demo shows
    some of their rows by naming it (`transcribed_in`), never by writing their values again."""
    files = _params_files()
    assert written_twice(files) == []
    demo = [st["paper"] for st in files["params.yaml"]["studies"] if st.get("paper")]
    assert demo and all(p["transcribed_in"] == "papers" for p in demo)


def test_a_table_or_claim_written_twice_is_caught():
    files = _params_files()
    papers = files["params/papers.yaml"]
    copy_of = copy.deepcopy(next(st for st in papers["studies"] if st["name"] == "p004_extensions"))
    problems = written_twice({**files, "params/another.yaml": {"studies": [copy_of],
                                                               "papers": {"004": papers["papers"]["004"]}}})
    assert any("004 Table 2 is written in 2 places (params/papers.yaml, params/another.yaml)" in p for p in problems)
    assert any("the claim of 004 Table 2 on Overall Dev between R2 and R1" in p for p in problems)
    assert any(p.startswith("paper 004 is written in 2 places") for p in problems)
    demo = copy.deepcopy(files["params.yaml"])
    demo["studies"][0]["paper"]["rows"][0]["dev"] = {"Score": 0.388}       # a printed value written again
    problems = written_twice({**files, "params.yaml": demo})
    assert problems == ["params.yaml: study 'training_approaches' takes 000 Table 4 from params/papers.yaml and "
                        "writes its rows.1. Baseline.dev again"]


def test_a_transcribed_table_takes_its_values_and_claims_from_the_catalogue(tmp_path):
    """The demo's tables carry the catalogue's printed values, columns, printed row count and the
    claims on the rows it shows; a row or table the catalogue lacks is a one-line error."""
    from minbert.params import load_params

    demo = load_params(REPO / "params.yaml")
    papers = validate_params(_raw(), "papers").params
    ours = next(st for st in demo.params.studies if st.name == "training_approaches").paper
    theirs = next(st for st in papers.studies if st.name == "p000_training_approaches").paper
    assert ours.columns == theirs.columns and ours.printed_rows == 5
    assert ours.row("4. Multi-task").test == theirs.row("4. Multi-task").test
    assert {c.text for c in ours.claims} == {c.text for c in theirs.claims
                                             if set(c.rows) <= {"1. Baseline", "4. Multi-task", "5. MLM + Multi-task"}}
    assert demo.params.papers["000"].title == papers.papers["000"].title and demo.params.papers["000"].differs
    assert demo.transcribed == [REPO / "params" / "papers.yaml"]
    raw = read_yaml(REPO / "params.yaml")
    raw["studies"][0]["paper"]["rows"][0]["label"] = "1. Baseline model"
    with pytest.raises(MinBertError, match=r"key 'studies\[0\].paper.rows\[0\].label': params/papers.yaml's Table 4 "
                                           r"has no row '1. Baseline model' \(did you mean '1. Baseline'\?\)"):
        validate_params(raw, "params.yaml", REPO)
    raw["studies"][0]["paper"]["table"] = "Table 44"
    with pytest.raises(MinBertError, match="params/papers.yaml has no table 'Table 44' of paper '000'"):
        validate_params(raw, "params.yaml", REPO)
