#!/usr/bin/env bash
# The README demo: one synthetic FAZ (OCTA) federation whose 4 sites hold different weak labels;
# FedLPPA (personalised, weak labels) against FedAvg and local training on the same budget;
# the side-by-side tables, runs/demo/report/report.html and the next commands to try.
# Arguments go to `fedseg demo` (e.g. --set train.rounds=20, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fedseg demo "$@"
