#!/usr/bin/env bash
# scripts/gpu-check.sh as CI runs it: `bundle` on the build, then `run` on a machine
# without a GPU, which must print "skipped: no GPU" and exit 0. Also checks what a GPU machine
# will rely on: the bundle holds every CUDA test found by name, the moetrain CLI, the benchmarks
# and the spec the training check trains, with every library they load except glibc's and
# CUDA's, under 64 MiB; and, with a stand-in nvidia-smi that lists a GPU the CUDA runtime cannot
# use, `run` runs every bundled test, trains the spec on the CPU (in f32 and bf16: those runs
# must succeed here) and tries CUDA, runs the benchmarks, prints a JSON summary and refuses to
# pass. The loss comparison itself is tested by gpu_check_compare_losses_test.sh (its own ctest).
#
#   gpu_check_test.sh REPO_DIR BUILD_DIR
set -euo pipefail

repo=$1
build=$2
script=$repo/scripts/gpu-check.sh
# xz's fastest level: the bundle is over 100 MiB before compression, and level 9 takes minutes on
# CI's cores. The archive it makes is larger than level 9's, so a level-0 bundle under 64 MiB
# proves that the real one is too.
export GPU_CHECK_XZ_LEVEL=${GPU_CHECK_XZ_LEVEL:-0}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Usage and errors.
"$script" --help | grep -q '^usage: gpu-check.sh bundle' || fail "--help prints no usage"
rc=0
"$script" >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "no subcommand: exit $rc, want 2"
rc=0
"$script" frobnicate >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "an unknown subcommand: exit $rc, want 2"
rc=0
out=$("$script" run "$scratch/none" 2>&1) || rc=$?
if [ $rc -ne 1 ] || ! grep -q 'no .*moetrain-gpu-bundle.tar.xz' <<<"$out"; then
  fail "run without a bundle: exit $rc, $out"
fi
rc=0
out=$("$script" bundle "$scratch/none" "$scratch/out" 2>&1) || rc=$?
if [ $rc -ne 1 ] || ! grep -q 'not a configured build folder' <<<"$out"; then
  fail "bundle of a folder that is not a build: exit $rc, $out"
fi
if command -v git >/dev/null 2>&1; then
  git init -q "$scratch/repo"
  rc=0
  out=$("$script" bundle "$build" "$scratch/repo/bundle" 2>&1) || rc=$?
  if [ $rc -ne 1 ] || ! grep -q 'not ignored by git' <<<"$out"; then
    fail "bundle into a folder git would commit: exit $rc, $out"
  fi
fi

# The CUDA tests, found here independently of the script: every *_cuda_test.cc, and the runtime
# tests that exist.
mapfile -t expected < <({
  find "$repo/tests" -name '*_cuda_test.cc' -printf '%f\n'
  for name in device_query_test exec_context_test caching_allocator_test cublaslt_api_test \
    nccl_communicator_test; do
    [ -z "$(find "$repo/tests" -name "$name.cc" -print -quit)" ] || echo "$name.cc"
  done
} | sed 's/\.cc$//' | LC_ALL=C sort -u)
[ ${#expected[@]} -gt 0 ] || fail "no CUDA test in $repo/tests"

# bundle
started=$SECONDS
"$script" bundle "$build" "$scratch/out" || fail "bundle failed"
echo "bundle took $((SECONDS - started)) s"
archive=$scratch/out/moetrain-gpu-bundle.tar.xz
[ -f "$archive" ] || fail "no $archive"
bytes=$(stat -c %s "$archive")
echo "bundle: $bytes bytes"
[ "$bytes" -lt $((64 * 1024 * 1024)) ] || fail "the bundle is $bytes bytes, over 64 MiB"
(cd "$scratch/out" && sha256sum --quiet -c moetrain-gpu-bundle.tar.xz.sha256) ||
  fail "the archive does not match its .sha256"
mkdir "$scratch/unpacked"
xz -dc "$archive" | tar -C "$scratch/unpacked" -xf -
root=$scratch/unpacked/moetrain-gpu-bundle
[ -x "$root/run.sh" ] || fail "the bundle has no run.sh"
[ -x "$root/gpu-check.sh" ] || fail "the bundle has no gpu-check.sh"
mapfile -t bundled < <(LC_ALL=C sort "$root/tests.txt")
[ "${bundled[*]}" = "${expected[*]}" ] ||
  fail "the bundle's tests (${bundled[*]}) are not the CUDA tests (${expected[*]})"
programs=(moetrain train_bench moe_layer_bench)
for name in "${expected[@]}" "${programs[@]}"; do
  [ -x "$root/bin/$name" ] || fail "bin/$name is not in the bundle"
  grep -q " bin/$name\$" "$root/MANIFEST.txt" || fail "MANIFEST.txt does not list bin/$name"
done
cmp -s "$repo/examples/tiny-moe.yaml" "$root/examples/tiny-moe.yaml" ||
  fail "the bundle's examples/tiny-moe.yaml is not the repository's"
[ "$(cat "$root/train-spec.txt")" = examples/tiny-moe.yaml ] || fail "train-spec.txt: $(cat "$root/train-spec.txt")"
[ "$(cat "$root/tools.txt")" = moetrain ] || fail "tools.txt: $(cat "$root/tools.txt")"
if ! grep -qx 'train_bench --device cuda .*--json' "$root/benchmarks.txt" ||
  ! grep -qx 'moe_layer_bench --device cuda --dtype bf16,fp8-delayed,fp8-current,fp8-blockwise,fp8-mxfp8 --json' \
    "$root/benchmarks.txt"; then
  fail "benchmarks.txt: $(cat "$root/benchmarks.txt")"
fi

# The libraries: none of glibc's or CUDA's, and with only the bundle's lib/ (and CUDA where this
# machine has it), every other library of every binary resolves into lib/.
glibc='^(ld-linux|linux-vdso|lib(c|m|mvec|pthread|dl|rt|resolv|util|anl|nsl)\.so|libnss_)'
cuda='^lib(cuda|cudart|cublas|nccl|nvidia-|nvrtc|nvJitLink|cudnn|cufft|curand|cusolver|cusparse)'
[ -f "$root/lib/gcc-runtime/libstdc++.so.6" ] || fail "libstdc++ is not in lib/gcc-runtime/"
while read -r lib; do
  name=${lib##*/}
  ! grep -qE "$glibc" <<<"$name" || fail "the bundle carries glibc's $name"
  ! grep -qE "$cuda" <<<"$name" || fail "the bundle carries CUDA's $name"
done < <(find "$root/lib" -type f)
for binary in "$root"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    grep -qE "$glibc|$cuda" <<<"$name" && continue
    [ "$path" = "$root/lib/$name" ] || [ "$path" = "$root/lib/gcc-runtime/$name" ] ||
      fail "${binary##*/} loads $name from $path, not from the bundle"
  done < <(LD_LIBRARY_PATH=$root/lib:$root/lib/gcc-runtime ldd "$binary")
done
echo "the bundle holds ${#expected[@]} tests and ${programs[*]} with their libraries"

# run, without a GPU. Where this machine has one, a missing nvidia-smi stands for none.
smi=nvidia-smi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  smi=$scratch/no-such-nvidia-smi
fi
started=$SECONDS
rc=0
out=$(GPU_CHECK_NVIDIA_SMI=$smi "$script" run "$scratch/out" 2>"$scratch/run.err") || rc=$?
echo "run took $((SECONDS - started)) s: $out"
[ $rc -eq 0 ] || fail "run without a GPU: exit $rc: $(cat "$scratch/run.err")"
grep -q '^skipped: no GPU' <<<"$out" || fail "run without a GPU did not print 'skipped: no GPU'"

# run with an nvidia-smi that lists a GPU which the CUDA runtime here cannot reach: every bundled
# test runs (and skips), tiny-moe trains on the CPU in f32 and bf16 and fails at once on CUDA,
# the benchmarks run (and find no GPU), one JSON summary comes out, and the run fails because the
# tests found no usable GPU and the CUDA runs failed. Only where there is no GPU.
if [ "$smi" = nvidia-smi ]; then
  cat >"$scratch/fake-nvidia-smi" <<'EOF'
#!/bin/sh
if [ "$1" = -L ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-stand-in)"; exit 0; fi
printf '%s' "name, driver_version, clocks.current.sm [MHz], clocks.max.sm [MHz], "
echo "clocks.current.memory [MHz], memory.total [MiB]"
echo "NVIDIA H200, 580.65.06, 345 MHz, 1980 MHz, 3201 MHz, 143771 MiB"
EOF
  chmod +x "$scratch/fake-nvidia-smi"
  rc=0
  GPU_CHECK_NVIDIA_SMI=$scratch/fake-nvidia-smi GPU_CHECK_BENCH_TIMEOUT=120 \
    "$script" run "$scratch/out" "$scratch/logs" >"$scratch/summary.json" 2>"$scratch/run.err" ||
    rc=$?
  [ $rc -eq 1 ] || fail "run with an unusable GPU: exit $rc, want 1: $(cat "$scratch/run.err")"
  python3 - "$scratch/summary.json" "$scratch/logs" "${expected[@]}" <<'EOF' ||
import json, os, re, sys
summary = json.load(open(sys.argv[1]))
logs = sys.argv[2]
expected = sorted(sys.argv[3:])
tests = summary["tests"]
problems = []
if summary["gpu"] != "NVIDIA H200" or summary["driver"] != "580.65.06":
    problems.append("gpu/driver: %s %s" % (summary["gpu"], summary["driver"]))
if summary["clocks"].get("clocks.max.sm") != "1980 MHz":
    problems.append("clocks: %s" % summary["clocks"])
if sorted(tests["binaries"]) != expected:
    problems.append("ran %s, want %s" % (sorted(tests["binaries"]), expected))
if tests["failed"] or tests["failures"] or tests["not_run"]:
    problems.append("failures without a GPU: %s %s" % (tests["failures"], tests["not_run"]))
if not tests["skipped"] or not tests["gpu_not_usable"]:
    problems.append("no test reported the GPU unusable: %s" % tests)
if not isinstance(summary.get("seconds"), float):
    problems.append("no seconds: %s" % summary)
if sorted(summary.get("bench", {})) != ["moe_layer_bench", "train_bench"]:
    problems.append("bench: %s" % summary.get("bench"))

# Training: the CPU runs trained 20 steps from the spec copies; the CUDA runs failed; every loss
# check failed, naming the failed runs.
runs = summary.get("training", {}).get("runs", {})
recipes = ["delayed", "current", "blockwise", "mxfp8"]
want_runs = sorted(["cpu_bf16", "cpu_f32", "cuda_bf16", "cuda_f32", "cuda_f32_repeat",
                    "cuda_f32_recompute", "cpu_mla_f32", "cuda_mla_f32",
                    "cuda_mla_f32_selective"] +
                   ["%s_fp8_%s" % (device, r) for device in ("cpu", "cuda") for r in recipes])
if sorted(runs) != want_runs:
    problems.append("training runs %s, want %s" % (sorted(runs), want_runs))
for name, run in runs.items():
    if name.startswith("cpu"):
        if run.get("exit") != 0 or run.get("steps") != 20 or "final_loss" not in run:
            problems.append("the CPU run %s did not train 20 steps: %s" % (name, run))
    elif run.get("exit") == 0:
        problems.append("the CUDA run %s succeeded without a GPU: %s" % (name, run))
for precision, value in ([("f32", "FP32"), ("bf16", "BF16"), ("mla-f32", "FP32"),
                          ("f32-recompute", "FP32"), ("mla-f32-selective", "FP32")] +
                         [("fp8-" + r, "FP8") for r in recipes]):
    text = open(os.path.join(logs, "train-%s.yaml" % precision)).read()
    lines = ["  precision: " + value, "  steps: 20", "  log_every: 1"]
    if value == "FP8":
        lines.append("    recipe: " + precision[4:].upper())
    if precision == "f32-recompute":
        lines.append("  recompute: FULL")
    if precision == "mla-f32-selective":
        lines.append("  recompute: SELECTIVE")
    for line in lines:
        if not re.search("^%s$" % line, text, re.M):
            problems.append("train-%s.yaml lacks '%s'" % (precision, line))
checks = summary.get("checks", {})
fp8_checks = ["loss_fp8_%s_cuda_vs_cpu" % r for r in recipes]
want_checks = sorted(["cuda_f32_bit_identical", "cuda_f32_recompute_bit_identical",
                      "loss_bf16_cuda_vs_cpu", "loss_f32_cuda_vs_cpu",
                      "loss_mla_f32_cuda_vs_cpu", "cuda_mla_f32_selective_bit_identical",
                      "moe_layer_bench", "tests", "train_bench"] + fp8_checks)
if sorted(checks) != want_checks:
    problems.append("checks %s, want %s" % (sorted(checks), want_checks))
for name in ["loss_f32_cuda_vs_cpu", "loss_bf16_cuda_vs_cpu", "cuda_f32_bit_identical",
             "cuda_f32_recompute_bit_identical", "loss_mla_f32_cuda_vs_cpu",
             "cuda_mla_f32_selective_bit_identical"] + fp8_checks:
    check = checks.get(name, {})
    reason = check.get("reason", "")
    if check.get("pass") is not False or not re.search(r"run cuda_(f32|bf16|mla_f32|fp8_\w+): exit 2",
                                                        reason):
        problems.append("%s: %s" % (name, check))
if summary.get("passed") is not False:
    problems.append("passed: %s" % summary.get("passed"))
for p in problems:
    print("summary: " + p)
unusable = tests["gpu_not_usable"][0] if tests["gpu_not_usable"] else ""
print("summary: %d passed, %d skipped; %s" % (tests["passed"], tests["skipped"], unusable))
sys.exit(1 if problems else 0)
EOF
    fail "the JSON summary is wrong"
  [ -f "$scratch/logs/summary.json" ] || fail "LOG_DIR did not receive summary.json"

  # A machine whose glibc is too old for the bundle's libstdc++ (but not for the binaries) uses
  # its own libstdc++, which here has every symbol version they need: the tests still load.
  needs=$root/runtime-needs.txt
  binaries_glibc=$(awk '$1 == "glibc" { sub(/GLIBC_/, "", $2); print $2 }' "$needs")
  runtime_glibc=$(awk '$1 == "gcc-runtime-glibc" { sub(/GLIBC_/, "", $2); print $2 }' "$needs")
  if [ "$binaries_glibc" != "$runtime_glibc" ]; then
    rc=0
    GPU_CHECK_GLIBC_VERSION=$binaries_glibc GPU_CHECK_NVIDIA_SMI=$scratch/fake-nvidia-smi \
      GPU_CHECK_PHASES=tests "$script" run "$scratch/out" >"$scratch/summary.json" \
      2>"$scratch/run.err" || rc=$?
    grep -q "glibc $binaries_glibc cannot load the bundle's libstdc++.*: using /" \
      "$scratch/run.err" ||
      fail "with glibc $binaries_glibc, run did not switch to the machine's libstdc++"
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["tests"]; sys.exit(
      1 if t["failures"] or not t["passed"] + t["skipped"] else 0)' "$scratch/summary.json" ||
      fail "with the machine's libstdc++ the tests did not run: $(cat "$scratch/summary.json")"
    echo "with glibc $binaries_glibc, run uses the machine's libstdc++"
  fi
fi
echo "gpu-check.sh: bundle and run (no GPU) pass"
