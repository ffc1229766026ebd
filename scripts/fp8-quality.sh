#!/usr/bin/env bash
# Trains example specs for N steps in bf16 and in each FP8 recipe on this machine's CPU, and
# prints the markdown table of docs/fp8.md ("Quality"): the final training loss and the eval loss
# of each run, and the FP8 run's final loss relative to bf16's.
#
#   scripts/fp8-quality.sh [--steps N] [SPEC...]   (default: 300 steps of examples/tiny-moe.yaml
#                                                  and examples/deepseek-v3-mini.yaml)
#
# Needs a built tree (build/bin/moetrain). Each run is `moetrain run SPEC --steps N --json` with
# train.precision rewritten, in a scratch directory removed at the end. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300
specs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) specs+=("$1"); shift ;;
  esac
done
[ ${#specs[@]} -gt 0 ] || specs=(examples/tiny-moe.yaml examples/deepseek-v3-mini.yaml)
moetrain=build/bin/moetrain
[ -x "$moetrain" ] || { echo "fp8-quality: $moetrain is missing: build first (make build)" >&2; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The spec with train.precision set to BF16 or to FP8 with the given recipe.
spec_with() {  # spec precision recipe
  local precision_line="  precision: $2"
  if [ "$2" = FP8 ]; then precision_line=$'  precision: FP8\n  fp8:\n    recipe: '"$3"; fi
  awk -v line="$precision_line" '
    /^train:/ { in_train = 1; print; print line; next }
    /^[^ #]/ { in_train = 0 }
    in_train && /^  precision:/ { next }
    { print }' "$1"
}

echo "| spec | precision | final loss | eval loss | final loss / bf16 | seconds |"
echo "|---|---|---|---|---|---|"
for spec in "${specs[@]}"; do
  base=""
  for run in BF16 FP8:DELAYED FP8:CURRENT FP8:BLOCKWISE FP8:MXFP8; do
    precision=${run%%:*} recipe=${run#*:}
    name=$(basename "$spec" .yaml)
    file="$scratch/$name-${run/:/-}.yaml"
    spec_with "$spec" "$precision" "$recipe" > "$file"
    echo "fp8-quality: $name $run, $steps steps..." >&2
    summary=$("$moetrain" run "$file" --steps "$steps" --json --checkpoint-dir "$scratch/ck" |
              grep '"summary":true')
    rm -rf "$scratch/ck"
    read -r final eval_loss seconds < <(python3 -c '
import json, sys
s = json.loads(sys.argv[1])
print(s["final_loss"], s.get("eval_loss", float("nan")), s["elapsed_s"])' "$summary")
    [ -n "$base" ] || base=$final
    label=$([ "$precision" = BF16 ] && echo bf16 || echo "fp8 $(echo "$recipe" | tr A-Z a-z)")
    ratio=$(python3 -c "print(f'{float(\"$final\") / float(\"$base\"):.4f}')")
    printf '| %s | %s | %.4f | %.4f | %s | %.0f |\n' "$name" "$label" "$final" "$eval_loss" \
      "$ratio" "$seconds"
  done
done
