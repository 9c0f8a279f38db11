"""A measured run as the docs record it (docs/runs.yaml), from its run records: how many jobs of
each stage ran, their summed wall times, the span from the first job's start to the last one's end,
the revisions and devices. The docs state a run's times and counts only as such a record holds them
(tests/test_doc_figures.py), so a figure can be traced to the records it came from:

    python -m workflow.runs --results results --id laptop-<revision> > entry.yaml
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections import Counter
from pathlib import Path

import yaml

from minbert.core.layout import Layout
from minbert.report.data import Outputs, run_infos


def summarise(infos: list[dict]) -> dict:
    """The record of a run from its stages' run records (minbert.report.data.run_infos)."""
    jobs, seconds = Counter(), Counter()
    starts, ends = [], []
    for info in infos:
        stage = str(info.get("stage", "?"))
        jobs[stage] += 1
        if isinstance(info.get("wall_seconds"), (int, float)):
            seconds[stage] += float(info["wall_seconds"])
        for key, into in (("started", starts), ("finished", ends)):
            if info.get(key):
                into.append(dt.datetime.fromisoformat(str(info[key])))
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    return {"revisions": sorted({str(i.get("git_revision", "unknown"))[:7] for i in infos}),
            "devices": sorted({str(i.get("gpu") or i.get("device") or "unknown") for i in infos}),
            "jobs": sum(jobs.values()), "stage_jobs": dict(sorted(jobs.items())),
            "stage_seconds": {k: round(v) for k, v in sorted(seconds.items())},
            "job_seconds": round(sum(seconds.values())), "wall_seconds": None if wall is None else round(wall)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="the results folder whose run records to read")
    parser.add_argument("--id", default="run", help="the record's name in docs/runs.yaml")
    args = parser.parse_args(argv)
    layout = Layout(results=args.results)
    records = sorted(str(p) for p in Path(layout.run_records).rglob("*.json"))      # every job's, read or not
    record = summarise(run_infos(Outputs({"runs:run_record": records}), layout))
    yaml.safe_dump([{"id": args.id, **record}], sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
