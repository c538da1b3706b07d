#!/usr/bin/env bash
# Create .venv (if missing) and install fedseg with the given extras. torch is pinned to the
# CPU wheel first: a bare torch requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
