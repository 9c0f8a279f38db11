"""Render the HTML reports: reports/final.html (the studies' tables, the ensembles, the best
model's error analysis, how the results were produced) and reports/experiments/<name>.html.

    python -m stages.report [--params params.yaml] [--results results] [--out reports]
"""
from __future__ import annotations

from stages import _cli


def main(argv: list[str] | None = None) -> None:
    p = _cli.parser(__doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="the results folder (default: results)")
    p.add_argument("--out", default="reports", help="where the HTML goes (default: reports)")
    p.add_argument("--list-inputs", action="store_true",
                   help="print every file the report reads, one per line, and exit")
    args = p.parse_args(argv)

    from minbert.report import render_reports, report_inputs

    if args.list_inputs:
        print("\n".join(str(path) for path in report_inputs(args.params, args.results)))
        return
    written = render_reports(args.params, args.results, args.out)
    print(f"wrote {written[-1]} and {len(written) - 1} experiment page(s) in {args.out}/experiments")


if __name__ == "__main__":
    _cli.run(main)
