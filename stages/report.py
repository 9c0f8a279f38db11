"""Render the HTML reports: reports/final.html (the studies' tables, the ensembles, the best
model's error analysis, how the results were produced) and reports/experiments/<name>.html.

    python -m stages.report [--params params.yaml] [--results results] [--out reports]
"""
from __future__ import annotations

from minbert.core.outputs import folders_read, refuse_over_inputs, refuse_replacing, writable_folder
from minbert.entry import run
from minbert.params.load import validate_params
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call

SUMMARY_HEADER = "summary:"


def main(argv: list[str] | None = None) -> None:
    call = stage_call("report", __doc__, argv, reports="out", arguments=lambda p: p.add_argument(
        "--out", default="reports", help="where the HTML goes (default: reports)"))
    from minbert.report import render_reports  # here, so a missing plotting package is one line (run)

    writable_folder(call.layout.reports, "--out")
    reads = call.job.read_paths
    refuse_over_inputs(call.layout.reports, "--out", reads, folders_read(reads, call.layout.results))
    refuse_replacing([call.layout.final_report, call.layout.experiment_reports], "--out")
    with running(call.job, force=call.args.force):
        # the report shows every section of the params: its settings are the params file's content
        lp = validate_params(call.job.settings)
        summary: list[str] = []
        written = render_reports(lp, call.layout, reads=call.job.reads, summary=summary)   # in the params' registry
    print(f"wrote {written[-1]} and {len(written) - 1} experiment page(s) in {call.layout.experiment_reports}")
    # the run's summary, last: DVC's terminal shows it, and Snakemake's run ends on it (the Snakefile
    # prints it from this job's log: minbert.pipeline.progress.run_end)
    print("\n".join([SUMMARY_HEADER, *(f"  {line}" for line in summary)]))


if __name__ == "__main__":
    run(main)
