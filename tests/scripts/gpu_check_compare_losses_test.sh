#!/usr/bin/env bash
# `scripts/gpu-check.sh compare-losses`, the loss check of the GPU run, on made-up
# `moetrain run --json` outputs (it needs no GPU): equal losses, losses within and outside the
# tolerance, bit-identity, different or unexpected step counts, a NaN loss, lines that are not
# steps, and bad usage. Each case checks the exit status and the verdict's JSON.
#
#   gpu_check_compare_losses_test.sh REPO_DIR
set -euo pipefail

script=$1/scripts/gpu-check.sh
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# A run's output: what moetrain run --json prints around its step lines, and one step line per
# "STEP LOSS" argument (LOSS as written, so that null stands for NaN).
write_run() {
  local file=$1 pair
  shift
  {
    echo '{"message":"memory estimate: 170.81 MiB"}'
    for pair in "$@"; do
      printf '{"aux_loss":0.031,"eval_loss":null,"grad_norm":1.5,"loss":%s,"lr":0.001,' "${pair#* }"
      printf '"step":%s,"tokens_per_s":22000.5,"tokens_seen":2048}\n' "${pair%% *}"
    done
    echo '{"checkpoint":"ck/tiny-moe/step-00000020","step":20}'
    echo '{"summary":true,"final_loss":3.5,"steps":20,"job":"tiny-moe"}'
  } >"$file"
}

# 20 losses like tiny-moe's, then the same scaled by 1 + FACTOR at step AT (all steps: AT=all).
losses() {
  local factor=${1:-0} at=${2:-none}
  awk -v f="$factor" -v at="$at" 'BEGIN {
    for (s = 1; s <= 20; s++) {
      l = 5.5 - 0.1 * s + 0.001 * s * s
      if (at == "all" || at == s) l *= 1 + f
      printf "%d %.17g\n", s, l
    }
  }'
}
run_file() {  # NAME FACTOR AT: a run file of 20 steps
  local -a pairs
  mapfile -t pairs < <(losses "${2:-0}" "${3:-none}")
  write_run "$scratch/$1.jsonl" "${pairs[@]}"
}

# expect NAME EXIT PASS [REASON_PATTERN] -- ARGS...: compare-losses ARGS exits EXIT, prints a
# verdict whose "pass" is PASS and whose "reason" matches REASON_PATTERN.
expect() {
  local name=$1 want_rc=$2 want_pass=$3 pattern=${4:-} rc=0 out
  shift 4
  [ "$1" = -- ] && shift
  out=$("$script" compare-losses "$@" 2>"$scratch/err") || rc=$?
  if [ $rc -ne "$want_rc" ]; then
    fail "$name: exit $rc, want $want_rc: $out $(cat "$scratch/err")"
    return
  fi
  if [ "$want_rc" -eq 2 ]; then
    echo "ok   $name: exit 2"
    return
  fi
  if ! python3 - "$out" "$want_pass" "$pattern" <<'EOF'; then
import json, re, sys
verdict = json.loads(sys.argv[1])
want_pass = sys.argv[2] == "true"
ok = verdict.get("pass") is want_pass
if sys.argv[3]:
    ok = ok and re.search(sys.argv[3], verdict.get("reason", "")) is not None
if not want_pass and "reason" not in verdict:
    ok = False
sys.exit(0 if ok else 1)
EOF
    fail "$name: verdict $out, want pass=$want_pass and a reason matching '$pattern'"
  else
    echo "ok   $name: $out"
  fi
}

run_file ref
run_file same
run_file close 3e-5 all        # f32: inside 1e-4
run_file far 3e-4 7            # f32: outside 1e-4 at step 7 only
run_file bf16_close -1.5e-2 all
run_file bf16_far 2.5e-2 12
run_file one_ulp 1e-15 5       # differs in the last bits only
mapfile -t pairs < <(losses)
write_run "$scratch/short.jsonl" "${pairs[@]:0:19}"                # steps 1..19
write_run "$scratch/shifted.jsonl" "${pairs[@]:1}" "21 3.0"        # steps 2..21
write_run "$scratch/nan.jsonl" "${pairs[@]:0:9}" "10 null" "${pairs[@]:10}"
write_run "$scratch/dup.jsonl" "${pairs[@]}" "${pairs[0]}"
write_run "$scratch/empty.jsonl"
# A run killed mid-line: the cut line is not a step, and the steps before it are compared.
{ cat "$scratch/short.jsonl"; printf '{"aux_loss":0.03,"loss":3.9'; } >"$scratch/cut.jsonl"

expect "equal, identical" 0 true "" -- --identical "$scratch/ref.jsonl" "$scratch/same.jsonl"
expect "equal, rtol 0" 0 true "" -- --rtol 0 --expect-steps 20 "$scratch/ref.jsonl" "$scratch/same.jsonl"
expect "within 1e-4" 0 true "" -- --rtol 1e-4 --expect-steps 20 "$scratch/ref.jsonl" "$scratch/close.jsonl"
expect "within 1e-4 is not identical" 1 false "step 1: .* != .*not bit-identical" -- \
  --identical "$scratch/ref.jsonl" "$scratch/close.jsonl"
expect "last bits differ" 1 false "step 5: .*not bit-identical" -- \
  --identical "$scratch/ref.jsonl" "$scratch/one_ulp.jsonl"
expect "outside 1e-4 at step 7" 1 false "^step 7: .*relative difference 0.0003 > 0.0001" -- \
  --rtol 1e-4 "$scratch/ref.jsonl" "$scratch/far.jsonl"
expect "bf16 within 2e-2" 0 true "" -- --rtol 2e-2 "$scratch/ref.jsonl" "$scratch/bf16_close.jsonl"
expect "bf16 outside 2e-2 at step 12" 1 false "^step 12: .* > 0.02" -- \
  --rtol 2e-2 "$scratch/ref.jsonl" "$scratch/bf16_far.jsonl"
expect "a step missing" 1 false "steps differ: ref has 20 steps \(1..20\), new has 19 steps \(1..19\)" -- \
  --rtol 1e-4 "$scratch/ref.jsonl" "$scratch/short.jsonl"
expect "a step missing, expected 20" 1 false "new has 19 steps \(1..19\), not 20" -- \
  --rtol 1e-4 --expect-steps 20 "$scratch/ref.jsonl" "$scratch/short.jsonl"
expect "the same count, other steps" 1 false "steps differ" -- \
  --identical "$scratch/ref.jsonl" "$scratch/shifted.jsonl"
expect "both short of the expected count" 1 false "ref has 19 steps .*, not 20; new has 19" -- \
  --rtol 1e-4 --expect-steps 20 "$scratch/short.jsonl" "$scratch/short.jsonl"
expect "a NaN loss" 1 false "step 10: a loss that is not finite" -- \
  --rtol 1 "$scratch/ref.jsonl" "$scratch/nan.jsonl"
expect "a step twice" 1 false "step 1 appears twice" -- --rtol 1 "$scratch/ref.jsonl" "$scratch/dup.jsonl"
expect "no step lines" 1 false "has no step lines" -- --rtol 1 "$scratch/ref.jsonl" "$scratch/empty.jsonl"
expect "no file" 1 false "cannot read .*none.jsonl" -- --rtol 1 "$scratch/ref.jsonl" "$scratch/none.jsonl"
expect "a cut last line" 0 true "" -- --identical --expect-steps 19 "$scratch/short.jsonl" "$scratch/cut.jsonl"
expect "no mode" 2 false "" -- "$scratch/ref.jsonl" "$scratch/same.jsonl"
expect "both modes" 2 false "" -- --rtol 1 --identical "$scratch/ref.jsonl" "$scratch/same.jsonl"
expect "a negative rtol" 2 false "" -- --rtol -1 "$scratch/ref.jsonl" "$scratch/same.jsonl"
expect "one file" 2 false "" -- --rtol 1 "$scratch/ref.jsonl"

[ $failures -eq 0 ] || {
  echo "$failures failures" >&2
  exit 1
}
echo "gpu-check.sh compare-losses: all cases pass"
