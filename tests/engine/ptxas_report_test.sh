#!/usr/bin/env bash
# Reads ptxas's resource report of every CUDA file of engine/ops/ and engine/backend/cuda/ (made
# by the ptxas_report target, cmake/ptxas_report.cmake) and prints one line per kernel: registers,
# stack frame, spill stores and loads, static shared memory. Fails, naming each, on:
#   - a function with non-zero spill stores or spill loads (the hot path must not touch local
#     memory; the library build's -warn-spills catches it first, this says where and how much);
#   - ptxas's wgmma-serialisation advisories C7508 and C7510-C7515 (a wgmma pipeline that ptxas
#     serialised runs several times slower, without any error);
#   - any other ptxas warning (the library build turns them into errors);
#   - a .cu without a report, a report older than its .cu, or no .cu at all.
#
#   ptxas_report_test.sh SOURCE_DIR REPORT_DIR   checks the build's reports
#   ptxas_report_test.sh --self-test             checks that each failure above is caught
set -euo pipefail

# One file's report → "kernel<TAB>name<TAB>registers<TAB>stack<TAB>stores<TAB>loads<TAB>smem" per
# entry function, "function<TAB>..." for other functions that spill, and "problem<TAB>text" for
# each finding. The report's order: "Compiling entry function 'K'", "Function properties for K",
# "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N registers, ... N bytes
# smem, ...". Functions that are not entries get the properties line only.
parse_report() {
  awk '
    function flush_function(name) {
      if (!(name in stack)) return
      if (name in is_entry) {
        printf "kernel\t%s\t%s\t%s\t%s\t%s\t%s\n", name, regs[name], stack[name], stores[name],
               loads[name], smem[name]
      } else if (stores[name] + loads[name] > 0) {
        printf "function\t%s\t-\t%s\t%s\t%s\t-\n", name, stack[name], stores[name], loads[name]
      }
    }
    /Compiling entry function/ {
      entry = $0; sub(/.*Compiling entry function \047/, "", entry); sub(/\047.*/, "", entry)
      is_entry[entry] = 1; regs[entry] = 0; smem[entry] = 0; order[++n] = entry; seen[entry] = 1
    }
    /Function properties for/ {
      current = $0; sub(/.*Function properties for /, "", current); sub(/[ \t]+$/, "", current)
      if (!(current in seen)) { order[++n] = current; seen[current] = 1 }
    }
    /bytes stack frame/ {
      if (match($0, /[0-9]+ bytes stack frame/)) stack[current] = substr($0, RSTART, RLENGTH) + 0
      if (match($0, /[0-9]+ bytes spill stores/)) stores[current] = substr($0, RSTART, RLENGTH) + 0
      if (match($0, /[0-9]+ bytes spill loads/)) loads[current] = substr($0, RSTART, RLENGTH) + 0
      if (stores[current] + loads[current] > 0) {
        printf "problem\t%s spills: %d bytes stored, %d bytes loaded\n", current, stores[current],
               loads[current]
      }
    }
    /Used [0-9]+ registers/ {
      if (match($0, /Used [0-9]+ registers/)) regs[entry] = substr($0, RSTART + 5, RLENGTH - 15) + 0
      if (match($0, /[0-9]+ bytes smem/)) smem[entry] = substr($0, RSTART, RLENGTH) + 0
    }
    /C75(08|1[0-5])/ { printf "problem\twgmma advisory: %s\n", $0 }
    /ptxas warning/ && !/C75(08|1[0-5])/ { printf "problem\twarning: %s\n", $0 }
    END { for (i = 1; i <= n; i++) flush_function(order[i]) }
  ' "$1"
}

demangle() {
  if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi
}

# A kernel's name for the table: demangled, without the engine's namespaces, the return type and
# the parameter list (the template arguments tell the instantiations apart).
short_name() {
  local name
  name=$(demangle <<<"$1" | sed -E 's/^void //; s/moetrain::(ops::)?(cuda::)?//g;
    s/\(anonymous namespace\):://g; s/\([^()]*\)$//')
  [ ${#name} -le 60 ] || name="${name:0:57}..."
  echo "$name"
}

# Checks SOURCE_DIR's .cu files against REPORT_DIR; prints the table and the problems.
check_reports() {
  local src=$1 reports=$2 status=0 source relative report parsed
  local -a sources=()
  # Hidden files are scratch copies (cmake/ptxas_report.cmake leaves them out too).
  mapfile -t sources < <(cd "$src" && find engine/ops engine/backend/cuda -name '*.cu' ! -name '.*' \
    2>/dev/null | LC_ALL=C sort)
  if [ ${#sources[@]} -eq 0 ]; then
    echo "FAIL: no .cu file under $src/engine/ops or $src/engine/backend/cuda"
    return 1
  fi
  printf '%-44s %-60s %5s %6s %7s %7s %7s\n' file kernel regs stack spill_st spill_ld smem
  for relative in "${sources[@]}"; do
    source=$src/$relative
    report=$reports/${relative%.cu}.txt
    if [ ! -f "$report" ]; then
      echo "FAIL: $relative has no report $report (build the ptxas_report target)"
      status=1
      continue
    fi
    if [ "$source" -nt "$report" ]; then
      echo "FAIL: $report is older than $relative (build the ptxas_report target)"
      status=1
      continue
    fi
    parsed=$(parse_report "$report")
    if ! grep -q '^kernel' <<<"$parsed"; then
      printf '%-44s %s\n' "$relative" "(no kernel)"
    fi
    while IFS=$'\t' read -r kind name regs stack stores loads smem; do
      [ "$kind" = kernel ] || [ "$kind" = function ] || continue
      name=$(short_name "$name")
      printf '%-44s %-60s %5s %6s %7s %7s %7s\n' "$relative" "$name" "$regs" "$stack" "$stores" \
        "$loads" "$smem"
    done <<<"$parsed"
    while IFS=$'\t' read -r kind text; do
      [ "$kind" = problem ] || continue
      echo "FAIL: $relative: $(demangle <<<"$text")"
      status=1
    done <<<"$parsed"
  done
  return $status
}

# Plants each failure in a scratch tree and checks that it is caught, and that a clean report
# passes.
self_test() {
  local dir status=0
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  mkdir -p "$dir/src/engine/ops/foo" "$dir/src/engine/backend/cuda" "$dir/reports"
  local clean spill advisory warning
  clean="ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN8moetrain3ops4cuda9FooKernelEPfl' for 'sm_90a'
ptxas info    : Function properties for _ZN8moetrain3ops4cuda9FooKernelEPfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 16384 bytes smem, 368 bytes cmem[0]
ptxas info    : Function properties for __internal_accurate_pow
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
  spill="${clean/0 bytes spill stores, 0 bytes spill loads/48 bytes spill stores, 48 bytes \
spill loads}"
  advisory="$clean
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized"
  warning="$clean
ptxas warning : Value of threads per SM for entry _Z3fooPf is out of range"

  plant() {  # plant NAME REPORT_TEXT → checks the tree with foo_cuda.cu's report set to it
    touch "$dir/src/engine/ops/foo/foo_cuda.cu" "$dir/src/engine/backend/cuda/ctx.cu"
    mkdir -p "$dir/reports/engine/ops/foo" "$dir/reports/engine/backend/cuda"
    printf '%s\n' "$2" >"$dir/reports/engine/ops/foo/foo_cuda.txt"
    echo "ptxas info    : 0 bytes gmem" >"$dir/reports/engine/backend/cuda/ctx.txt"
    touch -d '+1 second' "$dir/reports/engine/ops/foo/foo_cuda.txt" \
      "$dir/reports/engine/backend/cuda/ctx.txt"
  }
  expect_fail() {  # expect_fail WHAT PATTERN
    local out
    if out=$(check_reports "$dir/src" "$dir/reports"); then
      echo "self-test: $1 was not caught"
      status=1
    elif ! grep -qE "$2" <<<"$out"; then
      echo "self-test: $1 was caught without naming it ($2):"
      echo "$out"
      status=1
    fi
  }

  plant clean "$clean"
  local out
  if ! out=$(check_reports "$dir/src" "$dir/reports"); then
    echo "self-test: a clean report failed:"
    echo "$out"
    status=1
  elif ! grep -qE 'foo_cuda.cu +(FooKernel|_ZN.*FooKernelEPfl) +40 +0 +0 +0 +16384' <<<"$out"; then
    echo "self-test: the table does not show FooKernel's 40 registers and 16384 bytes smem:"
    echo "$out"
    status=1
  fi
  plant spill "$spill"
  expect_fail "a spill" 'FooKernel.*48 bytes stored, 48 bytes loaded'
  plant advisory "$advisory"
  expect_fail "a C7515 advisory" 'wgmma advisory: .*C7515'
  plant warning "$warning"
  expect_fail "a ptxas warning" 'warning: .*out of range'
  plant clean "$clean"
  rm "$dir/reports/engine/backend/cuda/ctx.txt"
  expect_fail "a .cu without a report" 'ctx.cu has no report'
  plant clean "$clean"
  touch -d '+1 minute' "$dir/src/engine/ops/foo/foo_cuda.cu"
  expect_fail "a stale report" 'older than engine/ops/foo/foo_cuda.cu'
  rm -rf "${dir:?}/src/engine"
  mkdir -p "$dir/src/engine/ops"
  expect_fail "an empty set of CUDA files" 'no \.cu file'
  [ $status -eq 0 ] && echo "self-test: every planted problem was caught, and a clean report passed"
  return $status
}

if [ "${1:-}" = "--self-test" ]; then
  self_test
  exit $?
fi
if [ $# -ne 2 ]; then
  echo "usage: ptxas_report_test.sh SOURCE_DIR REPORT_DIR | --self-test" >&2
  exit 2
fi
if check_reports "$1" "$2"; then
  echo "no spills, no wgmma-serialisation advisory and no ptxas warning in any CUDA file"
  exit 0
fi
exit 1
