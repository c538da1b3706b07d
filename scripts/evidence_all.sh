#!/usr/bin/env bash
# Run every paper table at its evidence budget, three seeds, one table at a time: main tables
# first, then ablations and sweeps (docs/reproduce.md). A table whose federation has no measured
# budget yet is skipped (scripts/calibrate_all.sh measures them). Finished runs are kept in
# docs/evidence/<paper>-<table>/runs and reused, so rerunning continues where it stopped.
# Arguments, if any, replace the list, e.g. to use the second core for other tables:
#   scripts/evidence_all.sh "fedlppa table2" "pancreas3d table2-t1"
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
tables=(
  "fedlppa table3" "fedlppa table2" "pancreas3d table2-t1" "pancreas3d table2-t2"
  "fedbcs table1-prostate"
  "fedbcs table1-nuclei" "vc table1-fundus" "vc table1-polyp"
  "fedlppa table6" "fedlppa table7" "fedlppa table8" "fedlppa fig9"
  "fedbcs table2-prostate" "fedbcs table2-nuclei" "fedbcs table3" "fedbcs tau-prostate"
  "fedbcs tau-nuclei" "fedbcs fig4b"
  "vc table2" "vc table2-polyp" "vc table3" "vc table3-polyp"
)
if [ $# -gt 0 ]; then tables=("$@"); fi
for pt in "${tables[@]}"; do
  echo "== $pt $(date -u +%H:%M:%S)"
  .venv/bin/fedseg reproduce $pt --budget evidence --seeds 3 || echo "== $pt skipped or failed"
done
