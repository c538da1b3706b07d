#!/usr/bin/env bash
# Measure the evidence budget of every federation, one after another (docs/reproduce.md).
# Finished runs are kept under docs/evidence/budgets/ and reused: rerunning continues.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# vc-fundus and vc-polyp (vc table2, table2-polyp) are measured: 40 rounds, in float32 before
# engine.amp: auto became the default (docs/reproduce.md says why they stand).
# The pancreas experiments run at 32-voxel volumes (docs/reproduce.md says why).
for pt in "fedlppa table3" "fedlppa table2" "fedbcs table1-nuclei" "fedbcs table1-prostate" \
          "pancreas3d table2-t1 --set data.synth.size=32" \
          "pancreas3d table2-t2 --set data.synth.size=32"; do
  echo "== $pt $(date -u +%H:%M:%S)"
  .venv/bin/fedseg reproduce $pt --calibrate || echo "== $pt failed"
done
