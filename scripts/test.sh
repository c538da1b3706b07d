#!/usr/bin/env bash
# Install fedseg with its test and Flower extras, lint, check import contracts, run tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,flower,brain
# a real nuclei image + mask for tests/data/test_real_nuclei.py (the wheel is read, not installed)
ls .cache/wheels/stardist-0.9.2-*.whl >/dev/null 2>&1 || .venv/bin/python -m pip download -q --no-deps \
  "stardist==0.9.2" -d .cache/wheels || echo "stardist wheel not downloaded: the real-nuclei test will be skipped"
.venv/bin/ruff check src tests benchmarks
.venv/bin/lint-imports
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: tests/reporting/test_report_browser.py will be skipped"
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
