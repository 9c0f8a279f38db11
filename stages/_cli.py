"""What every stage CLI shares: argument parsing basics and one-line user errors."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from minbert.errors import MinBertError


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="the parameter file (default: params.yaml)")
    return p


def run(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Call `main`; a MinBertError (bad input) prints one line and exits 2, with no traceback."""
    try:
        main(argv)
    except MinBertError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def experiment_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a per-experiment stage: --params, --experiment, --data, --results."""
    p = parser(description)
    p.add_argument("--experiment", required=True, help="the experiment name in params.yaml")
    p.add_argument("--data", default="results/data", help="the prepared data (default: results/data)")
    p.add_argument("--results", default="results", help="the results folder (default: results)")
    return p
