#!/usr/bin/env bash
# Builds the fuzz targets of tests/fuzz with clang++ (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and fuzzes each for a bounded time, one after another. Exits 0 when
# no target crashed, 1 when one did (the reproducer is under BUILD_DIR/artifacts/<name>/), 77 when
# clang++ or libFuzzer is missing (nothing is built or run).
#
#   tests/fuzz/run_fuzzers.sh [--seconds N] [--max-len BYTES] [--build-dir DIR]
#                             [--build-only | --no-build] [NAME...]
#
# NAME: job_spec, safetensors, checkpoint_manifest, llmc_token_file, model_config (default: all).
# --seconds: per target (default 60). --max-len: libFuzzer's -max_len, the largest input it makes
# (default 2097152, 2 MiB: JSON nested 10^6 deep fits). --build-dir: default build/fuzz. The
# inputs a run finds that add coverage are kept in BUILD_DIR/corpus/<name>/, so later runs start
# from them as well as from the seed corpus tests/fuzz/corpus/<name>/. Environment: CXX (default
# clang++), FUZZ_BUILD_JOBS (default 2), FUZZ_RSS_LIMIT_MB (default 2048).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=60
max_len=2097152
build_dir=$root/build/fuzz
mode=all
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --build-only) mode=build; shift ;;
    --no-build) mode=run; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run_fuzzers.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(job_spec safetensors checkpoint_manifest llmc_token_file model_config)
for t in "${targets[@]}"; do
  [ -f "$here/${t}_fuzz.cc" ] || { echo "run_fuzzers.sh: no fuzz target $t" >&2; exit 2; }
done

cxx=${CXX:-clang++}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run_fuzzers.sh: skipped: $cxx not found (scripts/setup.sh installs clang)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe/probe.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cc" -o "$probe/probe" \
    >"$probe/log" 2>&1; then
  echo "run_fuzzers.sh: skipped: $cxx cannot link libFuzzer with ASan and UBSan" \
       "(scripts/setup.sh installs libclang-rt-dev):"
  cat "$probe/log"
  exit 77
fi

if [ $mode != run ]; then
  start=$SECONDS
  cmake -S "$here" -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
  cmake --build "$build_dir" -j "${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]/%/_fuzz}"
  echo "run_fuzzers.sh: built ${targets[*]} in $((SECONDS - start)) s"
fi
[ $mode = build ] && exit 0

failed=()
for t in "${targets[@]}"; do
  binary=$build_dir/${t}_fuzz
  [ -x "$binary" ] || { echo "run_fuzzers.sh: $binary is not built" >&2; exit 2; }
  mkdir -p "$build_dir/corpus/$t" "$build_dir/artifacts/$t"
  log=$build_dir/$t.log
  echo "run_fuzzers.sh: fuzzing $t for $seconds s (log: $log)"
  # The first corpus directory receives what the run finds; the seed corpus is only read.
  touch "$build_dir/artifacts/$t.stamp"
  status=0
  # A short allocation context keeps libFuzzer's out-of-memory report (a heap profile) to seconds
  # (rerun a reproducer by hand for full stacks); the outer timeout ends a target that hangs past
  # its time inside one input.
  ASAN_OPTIONS=${ASAN_OPTIONS:-malloc_context_size=2} timeout -s KILL $((seconds + 300)) \
    "$binary" -max_total_time="$seconds" -max_len="$max_len" \
    -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" -timeout=30 -print_final_stats=1 \
    -dict="$here/$t.dict" -artifact_prefix="$build_dir/artifacts/$t/" \
    "$build_dir/corpus/$t" "$here/corpus/$t" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ $status -ne 0 ]; then
    failed+=("$t")
    tail -n 60 "$log"
    echo "run_fuzzers.sh: $t FAILED (exit $status); reproducer(s):" \
         "$(find "$build_dir/artifacts/$t" -type f -newer "$build_dir/artifacts/$t.stamp" | tr '\n' ' ')"
  else
    echo "run_fuzzers.sh: $t: ${runs:-?} inputs in $seconds s, 0 crashes"
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "run_fuzzers.sh: crashes in: ${failed[*]}"; exit 1; }
