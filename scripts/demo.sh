#!/usr/bin/env bash
# The README demo: synthesize a small fundus federation with weak labels, train FedAvg on
# the weak labels and print the per-site results table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fedseg run quickstart --out runs/quickstart "$@"
