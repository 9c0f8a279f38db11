"""The figures the docs state of runs hold: every count of jobs, fine-tunes and training updates in
README.md and the docs that report runs is either what the planner makes now of one of the project's
params files (docs/runs.yaml's `plans`, recomputed here from minbert.pipeline.plan and `minbert
estimate`'s count of updates) or a figure of a measured run that docs/runs.yaml records (its
revision, machine, command and the run records' times); every time of a run (a wall time such as
"1 h 54 min 34 s") is one recorded there. A paragraph reports a measured run under the marker
`<!-- run: ID -->` (until the next heading or marker); outside one, a count is the planner's now and a
time is never stated."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO, shared_data_dir

from minbert.params import load_params

DOCS = ["README.md", "docs/results.md", "docs/papers.md", "docs/report.md"]
COUNT = re.compile(r"(?<![\w.,])(\d[\d,]*) (jobs|fine-tunes|fine-tunings|training updates)\b")
TIME = re.compile(r"(?<![\w.,:])(\d+ h \d+ min(?: \d+ s)?|\d+ min \d+ s)\b")
MARK = re.compile(r"<!-- run: ([\w.-]+) -->")


def figures(path: Path):
    """(line number, run id or None, kind, value) of every figure of a markdown file."""
    run, fenced = None, False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            run = None
        for m in MARK.finditer(line):
            run = m.group(1)
        for m in COUNT.finditer(line):
            yield i, run, "count", int(m.group(1).replace(",", ""))
        for m in TIME.finditer(line):
            yield i, run, "time", m.group(1)


def values(entry) -> tuple[set, set]:
    """(the counts, the times) a record holds, wherever in it: its numbers, and the durations its texts
    quote (a number of seconds counts as its "X h Y min Z s" and "X h Y min" forms)."""
    counts, times = set(), set()

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, int):
            counts.add(x)
        elif isinstance(x, str):
            times.update(m.group(1) for m in TIME.finditer(x))
            counts.update(int(m.group(1).replace(",", "")) for m in COUNT.finditer(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                if k.endswith("seconds") and isinstance(v, (int, float)):
                    times.update(spoken(v))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(entry)
    return counts, times


def spoken(seconds: float) -> set[str]:
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    return {f"{h} h {m:02d} min {s} s", f"{h} h {m:02d} min", f"{h} h {m} min {s} s", f"{h} h {m} min"} if h else \
        {f"{m} min {s} s"}


@pytest.fixture(scope="module")
def record() -> dict:
    return yaml.safe_load((REPO / "docs" / "runs.yaml").read_text(encoding="utf-8"))


def plan_counts(spec: dict, tmp: Path) -> set[int]:
    """What the planner makes of a params file now: its jobs in all and per stage, the estimate's jobs
    (the training, pretraining and prediction jobs it prices) and training updates."""
    from minbert.pipeline.estimate import StepCost, estimate
    from minbert.pipeline.plan import pipeline

    if "params" in spec:
        lp = load_params(REPO / spec["params"])
    else:
        (tmp / "params").mkdir(exist_ok=True)
        path = tmp / "params.yaml"
        path.write_text(f"catalogue: {spec['catalogue']}\nscale: {spec['scale']}\n")
        (tmp / "params" / f"{spec['catalogue']}.yaml").write_text((REPO / "params" / f"{spec['catalogue']}.yaml").read_text())
        lp = load_params(path)
    jobs = pipeline(lp)
    stages = Counter(j.stage for j in jobs)
    est = estimate(lp, StepCost((0.0, 0.0), (0.0, 0.0)))
    return {len(jobs), len([j for j in jobs if j.stage != "export"]), len(est.jobs), est.updates, *stages.values()}


@pytest.fixture(scope="module")
def planned(record, tmp_path_factory) -> set[int]:
    if shared_data_dir() is None:
        pytest.skip("../shared/data is not present: the real-data catalogues cannot be planned")
    out = set()
    for name, spec in record["plans"].items():
        out |= plan_counts(spec, tmp_path_factory.mktemp(name))
    return out


def test_every_recorded_run_says_what_ran_where(record):
    ids = [r["id"] for r in record["runs"]]
    assert len(ids) == len(set(ids))
    for run in record["runs"]:
        assert {"id", "revision", "machine", "command"} <= set(run), run["id"]
        assert values(run) != (set(), set()), run["id"]


def test_every_figure_of_a_run_in_the_docs_is_the_planners_or_a_recorded_runs(record, planned):
    runs = {r["id"]: values(r) for r in record["runs"]}
    wrong = []
    for doc in DOCS:
        for line, run, kind, value in figures(REPO / doc):
            where = f"{doc}:{line}"
            if run is not None and run not in runs:
                wrong.append(f"{where}: no run '{run}' in docs/runs.yaml")
            elif run is not None:
                if value not in runs[run][0 if kind == "count" else 1]:
                    wrong.append(f"{where}: {value} {kind} is not in docs/runs.yaml's record of '{run}'")
            elif kind == "time":
                wrong.append(f"{where}: the time {value} is of no recorded run (mark it <!-- run: ID -->)")
            elif value not in planned:
                wrong.append(f"{where}: {value} is not a count the planner makes now of docs/runs.yaml's plans")
    assert not wrong, "\n".join(wrong)


def test_a_stale_count_or_an_unrecorded_time_is_caught(tmp_path, record, planned, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text("The paper scale plans 105 fine-tunes.\n\nIt ran in 4 min 33 s.\n\n"
                   "<!-- run: laptop-b7a6f2f -->\nIt ran 82 jobs in 1 h 54 min 34 s, then 17 jobs.\n")
    found = list(figures(doc))
    assert [(f[1], f[3]) for f in found] == [(None, 105), (None, "4 min 33 s"), ("laptop-b7a6f2f", 82),
                                           ("laptop-b7a6f2f", 17), ("laptop-b7a6f2f", "1 h 54 min 34 s")]
    counts, times = values(next(r for r in record["runs"] if r["id"] == "laptop-b7a6f2f"))
    assert 105 not in planned and 82 in counts and 17 not in counts and "1 h 54 min 34 s" in times


def test_a_runs_record_sums_its_run_records(tmp_path, capsys):
    """`python -m workflow.runs` prints what docs/runs.yaml keeps of a run: jobs and seconds by stage
    from the stages' run records, and the span from the first start to the last end."""
    import json

    from workflow.runs import main

    runs = tmp_path / "results" / "runs"
    (runs / "finetune").mkdir(parents=True)
    records = {"prepare.json": {"stage": "prepare", "wall_seconds": 1.4, "started": "2026-01-01T10:00:00",
                                "finished": "2026-01-01T10:00:01", "git_revision": "abcdef0123", "device": "cpu"},
               "finetune/a.json": {"stage": "finetune", "wall_seconds": 60.2, "started": "2026-01-01T10:00:02",
                                   "finished": "2026-01-01T10:01:02", "git_revision": "abcdef0123", "device": "cpu"},
               "finetune/b.json": {"stage": "finetune", "wall_seconds": 59.6, "started": "2026-01-01T10:00:02",
                                   "finished": "2026-01-01T10:01:40", "git_revision": "abcdef0123", "device": "cpu"}}
    for name, record in records.items():
        (runs / name).write_text(json.dumps(record))
    assert main(["--results", str(tmp_path / "results"), "--id", "x"]) == 0
    [entry] = yaml.safe_load(capsys.readouterr().out)
    assert entry["id"] == "x" and entry["revisions"] == ["abcdef0"] and entry["devices"] == ["cpu"]
    assert entry["stage_jobs"] == {"finetune": 2, "prepare": 1} and entry["jobs"] == 3
    assert entry["stage_seconds"] == {"finetune": 120, "prepare": 1} and entry["job_seconds"] == 121
    assert entry["wall_seconds"] == 100
