#!/usr/bin/env bash
# Measure the evidence budget of every federation, one after another (docs/reproduce.md).
# Finished runs are kept under docs/evidence/budgets/ and reused: rerunning continues.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
for pt in "fedlppa table3" "vc table2" "vc table2-polyp" "fedbcs table1-nuclei" \
          "fedbcs table1-prostate" "fedlppa table2" "pancreas3d table2"; do
  echo "== $pt $(date -u +%H:%M:%S)"
  .venv/bin/fedseg reproduce $pt --calibrate || echo "== $pt failed"
done
