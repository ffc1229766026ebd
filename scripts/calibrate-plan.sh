#!/usr/bin/env bash
# Re-measures what `moetrain plan` is calibrated by on this machine, and checks the plan against it:
#
#   scripts/calibrate-plan.sh [BUILD_DIR [OUT_FILE]]     (defaults: build, calibration.json)
#
# Runs, one after another on a quiet machine (nothing else running: the figures are compared as
# they are):
#   calibrate_bench --json              the op classes' efficiencies, the FLOP/s and copy peaks
#   train_bench --json                  tokens/s of its default config, one rank
#   dispatch_bench --json --ranks 2|4   the loopback link and the dispatch+combine exchange
# writes them with the machine's description to OUT_FILE (the format of engine/plan/calibration.h),
# then runs `calibrate_bench --check OUT_FILE`: the plan's prediction of each measured figure.
# Exit status: calibrate_bench --check's (1 when a prediction is outside its tolerance), or the
# first benchmark's that fails. To make the file the stored one: copy it over
# bench/calibration/cpu.json and update the cpu preset (engine/plan/cluster.cc) from it;
# tests/engine/plan/calibration_test.cc checks both. Takes about two minutes on 2 cores.
set -euo pipefail
build=${1:-build}
out=${2:-calibration.json}
bin="$build/bin"
for b in calibrate_bench train_bench dispatch_bench; do
  [[ -x "$bin/$b" ]] || { echo "calibrate-plan.sh: $bin/$b not built (make build)" >&2; exit 1; }
done
echo "calibrate-plan.sh: calibrate_bench..." >&2
calibrate=$("$bin/calibrate_bench" --json --reps 5)
echo "calibrate-plan.sh: train_bench..." >&2
train=$("$bin/train_bench" --json --steps 6)
dispatch=""
for ranks in 2 4; do
  echo "calibrate-plan.sh: dispatch_bench --ranks $ranks..." >&2
  run=$("$bin/dispatch_bench" --json --ranks "$ranks" --reps 15)
  dispatch+="${dispatch:+, }\"$ranks\": $run"
done
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1 | tr -d '"\\')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cat > "$out" <<JSON
{"machine": {"cpu": "$cpu", "cores": $(nproc), "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "commit": "$commit"},
 "calibrate_bench": $calibrate,
 "train_bench": $train,
 "dispatch_bench": {$dispatch}}
JSON
echo "calibrate-plan.sh: wrote $out" >&2
"$bin/calibrate_bench" --check "$out"
