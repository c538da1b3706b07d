#!/usr/bin/env bash
# How the demo's task was chosen, on the control rows only (local training and FedAvg; FedLPPA
# is never run here): at the demo's budget (8 rounds x 5 local iterations, the quickstart
# config otherwise), a task passes when both methods reach 10 % DSC in every region at every
# site. Candidates in order; results and CPU times are recorded in docs/benchmarks.md.
# Usage: bash benchmarks/demo_calibration.sh [OUT]   (about 2 CPU minutes per run)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/demo-calibration}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
candidate() { # name task size rounds iters
  local name=$1 task=$2 size=$3 rounds=$4 iters=$5
  for m in local fedavg; do
    /usr/bin/time -f "$name $m cpu_user=%U cpu_sys=%S wall=%e" -a -o "$out/times.txt" \
      .venv/bin/fedseg run quickstart --out "$out/$name/$m" --overwrite \
      --set name=$m --set method.name=$m --set data.root="$out/data-$task-$size" \
      --set data.synth.task=$task --set data.synth.size=$size \
      --set train.rounds=$rounds --set train.local_iters=$iters >"$out/$name-$m.log" 2>&1
  done
}
mkdir -p "$out"
candidate fundus64-8x5 fundus 64 8 5
candidate fundus48-14x5 fundus 48 14 5
candidate faz64-8x5 faz 64 8 5
candidate polyp64-8x5 polyp 64 8 5
for f in "$out"/*/*/results.json; do
  .venv/bin/python -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], {s: {k: round(100*v, 1) for k, v in d['dsc'].items()} for s, d in r['sites'].items()})" "$f"
done
