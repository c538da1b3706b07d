#!/usr/bin/env bash
# Install fedseg with its test and Flower extras, lint, check import contracts, run tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,flower,brain
.venv/bin/ruff check src tests benchmarks
.venv/bin/lint-imports
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: tests/reporting/test_report_browser.py will be skipped"
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
