"""Render the HTML reports: reports/final.html (the studies' tables, the ensembles, the best
model's error analysis, how the results were produced) and reports/experiments/<name>.html.

    python -m stages.report [--params params.yaml] [--results results] [--out reports]
"""
from __future__ import annotations

from minbert.pipeline.runinfo import running

from ._cli import parser, run


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--out", default="reports", help="where the HTML goes (default: reports)")
    args = p.parse_args(argv)
    from minbert.core.layout import Layout
    from minbert.params import load_params
    from minbert.pipeline.plan import job_for
    from minbert.report import render_reports

    layout = Layout(args.results, args.out)
    the_job = job_for(args.params, "report", None, layout)
    with running(the_job):
        written = render_reports(load_params(args.params), layout)
    print(f"wrote {written[-1]} and {len(written) - 1} experiment page(s) in {layout.experiment_reports}")


if __name__ == "__main__":
    run(main)
