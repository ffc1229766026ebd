#!/usr/bin/env bash
# One command for a short GPU loan. A GPU machine is lent to this project
# rarely and briefly, with the CUDA driver and toolkit, CMake and Python but none of our other
# dependencies, and no network. So the work splits in two:
#
#   scripts/gpu-check.sh bundle && <run it on the GPU machine> scripts/gpu-check.sh run
#
#   gpu-check.sh bundle [--no-build] [BUILD_DIR [OUT_DIR]]    here (defaults: build, gpu-bundle)
#     Builds the CUDA tests, the `moetrain` CLI and the benchmarks, collects them with every shared
#     library they load except glibc's and the CUDA driver's and toolkit's (their ldd closure),
#     examples/tiny-moe.yaml and examples/deepseek-v3-mini.yaml, and writes OUT_DIR/moetrain-gpu-bundle.tar.xz (under 64 MiB), its
#     .sha256 and MANIFEST.txt. OUT_DIR must be outside the repository or ignored by git
#     (gpu-bundle/ is). --no-build: the build is done.
#   gpu-check.sh run [BUNDLE_DIR [LOG_DIR]]                   there (default: gpu-bundle)
#     Unpacks the bundle into a temporary folder, prints the GPU, driver and clocks, then:
#       1. tests: every bundled test;
#       2. training: 20 steps of examples/tiny-moe.yaml through `moetrain run --json`, on the CPU
#          and on CUDA, in f32, in bf16 (train.precision: BF16) and in FP8 with each of the four
#          recipes (train.precision: FP8, train.fp8.recipe), and CUDA f32 a second time; the
#          per-step losses must agree within 1e-4 relative in f32, 2e-2 in bf16 and 3e-2 in FP8
#          (CPU as the reference), and the two CUDA f32 runs bit for bit; CUDA f32 once more with
#          train.recompute: FULL, bit for bit against the first (recompute changes no bit); and
#          20 steps of examples/deepseek-v3-mini.yaml (MLA, MTP) at batch 4 in f32 on both,
#          within 1e-4, and on CUDA once more with train.recompute: SELECTIVE, bit for bit;
#       3. benchmarks: `train_bench --device cuda` (tokens/s, MFU against the measured dense bf16
#          GEMM rate, peak memory and its breakdown) and `moe_layer_bench --device cuda` in bf16
#          and each FP8 recipe;
#     and prints one JSON summary on stdout (progress goes to stderr): every check with its
#     verdict and numbers, under "checks", and "passed". Exit 1 when a check failed: a test failed
#     or did not run, the tests found no usable GPU although nvidia-smi lists one, a training run
#     or a benchmark failed, or losses disagree. The performance targets (MFU, peak memory) are
#     reported under "targets" and do not set the exit status. Without a GPU it prints
#     "skipped: no GPU (why)" and exits 0. LOG_DIR, if given, receives every test's log and gtest
#     JSON, each run's JSON lines, the benchmarks' output and summary.json.
#   gpu-check.sh compare-losses [--rtol R | --identical] [--expect-steps N] REF.jsonl NEW.jsonl
#     The loss check of `run` alone (runs anywhere with python3): reads the step lines of two
#     `moetrain run --json` outputs, prints one JSON verdict; exit 0 when they have the same steps
#     and every loss of NEW is within R relative of REF's (--identical: bit for bit), else 1.
#
# A whole check: `scripts/gpu-check.sh bundle` here; copy the repository with gpu-bundle/ (it is
# git-ignored: carry it explicitly) to the GPU machine; there
# `scripts/gpu-check.sh run gpu-bundle /tmp/gpu-logs`, within about 8 minutes (GPU_CHECK_BUDGET).
#
# The CUDA tests are found by name, so new ones join without editing this file: every
# tests/**/*_cuda_test.cc, plus the runtime tests named in RUNTIME_TESTS and LAST_TESTS below.
#
# Environment of `run` (seconds): GPU_CHECK_BUDGET (everything after unpacking, 420: each phase
# gets at most what is left of it), GPU_CHECK_TEST_TIMEOUT (one test, 90), GPU_CHECK_TESTS_BUDGET
# (all tests, 180), GPU_CHECK_TRAIN_TIMEOUT (one training run, 60), GPU_CHECK_BENCH_TIMEOUT (one
# benchmark, 150), GPU_CHECK_PHASES (which of "tests training benchmarks" to run; all). For
# tests: GPU_CHECK_NVIDIA_SMI (the nvidia-smi to ask), GPU_CHECK_GLIBC_VERSION (this machine's
# glibc, as far as choosing a libstdc++ goes). Of `bundle`: GPU_CHECK_JOBS (build jobs),
# GPU_CHECK_XZ_THREADS (2), GPU_CHECK_XZ_LEVEL (9).
set -euo pipefail

readonly BUNDLE_NAME=moetrain-gpu-bundle
readonly ARCHIVE_NAME=$BUNDLE_NAME.tar.xz
readonly MAX_BUNDLE_BYTES=$((64 * 1024 * 1024))
# What a bundle holds and how (format.txt): `run` refuses a bundle of another format, made by an
# older or newer gpu-check.sh. 2: tools, the training spec, benchmarks with their arguments.
readonly BUNDLE_FORMAT=2
# GPU tests whose names do not end in _cuda_test: the device query, the CUDA runtime and the NCCL
# communicator (it runs collectives on device memory where a GPU is). Run first, in this order:
# when the runtime is broken, their failures say so before the op tests' do.
readonly RUNTIME_TESTS=(device_query_test exec_context_test caching_allocator_test cublaslt_api_test)
readonly LAST_TESTS=(nccl_communicator_test)
# The benchmarks, in the order `run` runs them, and the arguments of each (bench_args).
readonly BENCHMARKS=(train_bench moe_layer_bench)
# Programs the training check runs, and the spec it trains (from the repository root).
readonly TOOLS=(moetrain)
readonly TRAIN_SPEC=examples/tiny-moe.yaml
# And DeepSeek-V3's attention and multi-token prediction (MLA, MTP) in f32, at a smaller batch.
readonly MLA_SPEC=examples/deepseek-v3-mini.yaml
readonly -a MLA_TRAIN_KEYS=(batch_size=4 micro_batch_size=4)
readonly TRAIN_STEPS=20
# Per-step loss tolerances of CUDA against the CPU (relative to the CPU's loss): f32 sums in
# another order; bf16 rounds every GEMM input and activation, in another order too.
readonly LOSS_RTOL_F32=1e-4
readonly LOSS_RTOL_BF16=2e-2
# FP8 rounds every GEMM input of the linear layers to 3 (E4M3) or 2 (E5M2) mantissa bits: an input
# that lands on the other side of a rounding boundary on the GPU moves by a whole FP8 step.
readonly LOSS_RTOL_FP8=3e-2
# The FP8 recipes the training check runs on both devices.
readonly FP8_RECIPES=(delayed current blockwise mxfp8)

bench_args() {
  case $1 in
    # d 2048, 8 layers, 16384 tokens a step, about 87 GiB in bf16 (bench/train_bench.cc): the model
    # of the MFU and peak-memory targets.
    train_bench) echo "--device cuda --config d2048 --json" ;;
    # bf16 and each FP8 recipe on the same layers: FP8 TFLOP/s against bf16 (docs/fp8.md).
    moe_layer_bench) echo "--device cuda --dtype bf16,fp8-delayed,fp8-current,fp8-blockwise,fp8-mxfp8 --json" ;;
    *) echo "--device cuda --json" ;;
  esac
}

usage() {
  cat <<'EOF'
usage: gpu-check.sh bundle [--no-build] [BUILD_DIR [OUT_DIR]]   (defaults: build gpu-bundle)
       gpu-check.sh run [BUNDLE_DIR [LOG_DIR]]                  (default: gpu-bundle)
       gpu-check.sh compare-losses [--rtol R | --identical] [--expect-steps N] REF NEW
       gpu-check.sh --help

bundle  builds the CUDA tests, moetrain, train_bench and moe_layer_bench in BUILD_DIR and
        writes OUT_DIR/moetrain-gpu-bundle.tar.xz (+ .sha256, MANIFEST.txt): the binaries,
        every shared library they load except glibc's and the CUDA driver's and toolkit's,
        and examples/tiny-moe.yaml and deepseek-v3-mini.yaml.
run     on the GPU machine: unpacks the bundle, prints the GPU, runs the tests, trains
        tiny-moe on the CPU and on CUDA (f32, bf16, FP8) and deepseek-v3-mini (MLA and MTP,
        f32) and compares the losses, runs the
        benchmarks, prints one JSON summary; exit 1 when a check failed. Without a GPU:
        "skipped: no GPU", exit 0.
compare-losses  the per-step losses of two `moetrain run --json` outputs: one JSON verdict;
        exit 0 when within R relative of REF (--identical: bit for bit), 1 otherwise.
EOF
}

log() { echo "gpu-check: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v from="$1" -v to="$(now)" 'BEGIN { printf "%.1f", to - from }'; }
SCRIPT_STARTED=$(now)
readonly SCRIPT_STARTED
die() {
  echo "gpu-check: error: $*" >&2
  exit 1
}
usage_error() {
  echo "gpu-check: $*" >&2
  usage >&2
  exit 2
}

repo_dir() { (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); }

# --- bundle ---------------------------------------------------------------------------------------

# glibc's own libraries and the kernel's vDSO: the GPU machine's must be used.
is_glibc() {
  case $1 in
    ld-linux* | linux-vdso* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
      libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.* | \
      libnss_*) return 0 ;;
  esac
  return 1
}

# The CUDA driver's and toolkit's libraries (and NCCL's): the GPU machine has its own, matching
# its driver. By name, and by where this machine keeps them.
is_cuda() {
  local name=$1 path=${2:-}
  case $name in
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libnvidia-* | \
      libnvrtc* | libnvJitLink* | libnvToolsExt* | libcupti* | libcufft* | libcurand* | \
      libcusolver* | libcusparse* | libcufile* | libcudnn*) return 0 ;;
  esac
  [ -n "$path" ] && [ "$path" != "not found" ] || return 1
  case $path:$(readlink -f "$path") in
    /usr/local/cuda* | /opt/nvidia/* | *:/usr/local/cuda* | *:/opt/nvidia/*) return 0 ;;
  esac
  return 1
}

# libstdc++ and libgcc_s need a newer glibc than our binaries do (GCC's runtime follows the
# distribution's glibc): they go to lib/gcc-runtime/, which `run` uses only where the machine's
# glibc can load them (gcc_runtime_dir).
is_gcc_runtime() {
  case $1 in libstdc++.so.* | libgcc_s.so.*) return 0 ;; esac
  return 1
}

# The newest glibc symbol version the files need: "GLIBC_2.34".
newest_glibc_needed() {
  objdump -T "$@" 2>/dev/null | grep -oE '\(?GLIBC_[0-9][0-9.]*' | tr -d '(' | sort -uV | tail -1
}

# What `run` checks before choosing a libstdc++: the newest glibc the binaries and lib/ need, the
# newest the GCC runtime needs, and every libstdc++ symbol version the binaries and lib/ need.
write_runtime_needs() {
  local root=$1
  command -v objdump >/dev/null 2>&1 || die "objdump (binutils) is needed to read symbol versions"
  local -a files runtime
  mapfile -t files < <(find "$root/bin" "$root/lib" -maxdepth 1 -type f)
  mapfile -t runtime < <(find "$root/lib/gcc-runtime" -type f)
  echo "glibc $(newest_glibc_needed "${files[@]}")"
  echo "gcc-runtime-glibc $([ ${#runtime[@]} -eq 0 ] || newest_glibc_needed "${runtime[@]}")"
  echo "libstdc++ $(objdump -T "${files[@]}" 2>/dev/null |
    grep -oE '(GLIBCXX|CXXABI)_[0-9][0-9.]*' | sort -uV | tr '\n' ' ')"
}

# The names of the test executables to bundle, in the order `run` runs them.
bundled_test_names() {
  local src=$1 name
  for name in "${RUNTIME_TESTS[@]}"; do
    [ -z "$(find "$src/tests" -name "$name.cc" -print -quit)" ] || echo "$name"
  done
  find "$src/tests" -name '*_cuda_test.cc' -printf '%f\n' | sed 's/\.cc$//' | LC_ALL=C sort -u
  for name in "${LAST_TESTS[@]}"; do
    [ -z "$(find "$src/tests" -name "$name.cc" -print -quit)" ] || echo "$name"
  done
}

bundle() {
  local build_first=1
  if [ "${1:-}" = --no-build ]; then
    build_first=0
    shift
  fi
  [ $# -le 2 ] || usage_error "bundle takes at most BUILD_DIR and OUT_DIR"
  local build=${1:-build} out=${2:-gpu-bundle} src started=$SECONDS
  src=$(repo_dir)
  [ -f "$build/CMakeCache.txt" ] ||
    die "$build is not a configured build folder (cmake -S . -B $build -G Ninja)"
  grep -q '^MOETRAIN_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
    die "$build was configured without CUDA (MOETRAIN_WITH_CUDA=OFF): there is nothing to bundle"

  # OUT_DIR must never be committed: outside any git work tree, or ignored.
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  if git -C "$out" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    ! git -C "$out" check-ignore -q "$out/$ARCHIVE_NAME"; then
    die "$out is inside a git work tree and not ignored by git; use gpu-bundle/ or a folder outside"
  fi

  local -a tests targets known missing=()
  mapfile -t tests < <(bundled_test_names "$src")
  [ ${#tests[@]} -gt 0 ] || die "no CUDA test found under $src/tests"
  [ -f "$src/$TRAIN_SPEC" ] || die "no $src/$TRAIN_SPEC, which the training check trains"
  [ -f "$src/$MLA_SPEC" ] || die "no $src/$MLA_SPEC, which the training check trains"
  targets=("${tests[@]}" "${TOOLS[@]}" "${BENCHMARKS[@]}")
  # `--target help` also re-runs CMake when a test file was added since the last configure.
  local help
  help=$(cmake --build "$build" --target help 2>&1) || die "cmake --build $build failed: $help"
  mapfile -t known < <(sed -n 's/^\([A-Za-z0-9_.+-]*\): phony$/\1/p' <<<"$help")
  local target
  for target in "${targets[@]}"; do
    printf '%s\n' "${known[@]}" | grep -qx -- "$target" || missing+=("$target")
  done
  [ ${#missing[@]} -eq 0 ] || die "no build target for: ${missing[*]} (is $build configured?)"

  if [ $build_first -eq 1 ]; then
    log "building ${#targets[@]} targets in $build: ${targets[*]}"
    cmake --build "$build" ${GPU_CHECK_JOBS:+-j "$GPU_CHECK_JOBS"} --target "${targets[@]}" >&2 ||
      die "the build failed"
  fi
  local build_seconds=$((SECONDS - started))

  local staging root archive=$out/$ARCHIVE_NAME
  staging=$(mktemp -d "${TMPDIR:-/tmp}/moetrain-gpu-bundle.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap must remove these paths
  trap "rm -rf '$staging' '$archive.tmp'" EXIT
  root=$staging/$BUNDLE_NAME
  mkdir -p "$root/bin" "$root/lib/gcc-runtime"

  local binary path name line
  local -a provided=()
  for target in "${targets[@]}"; do
    binary=$build/bin/$target
    [ -x "$binary" ] || binary=$(find "$build" -type f -name "$target" -perm -u+x -print -quit)
    if [ -z "$binary" ] || [ ! -x "$binary" ]; then
      die "$target was built but its executable is not in $build"
    fi
    cp "$binary" "$root/bin/$target"
    # ldd lists the whole closure: "name => path (addr)", "name => not found", "/lib64/ld (addr)",
    # "linux-vdso.so.1 (addr)".
    local listing
    listing=$(ldd "$binary") || die "ldd $binary failed"
    while read -r line; do
      case $line in
        *" => "*) name=${line%% => *} path=${line#* => } path=${path%% (*} ;;
        *) name=${line%% (*} name=${name##*/} path= ;;
      esac
      if is_glibc "$name"; then
        continue
      elif is_cuda "$name" "$path"; then
        provided+=("$name")
      elif [ "$path" = "not found" ] || [ -z "$path" ]; then
        die "$target needs $name, which is not found here"
      elif is_gcc_runtime "$name"; then
        [ -e "$root/lib/gcc-runtime/$name" ] || cp -L "$path" "$root/lib/gcc-runtime/$name"
      elif [ ! -e "$root/lib/$name" ]; then
        cp -L "$path" "$root/lib/$name"
      fi
    done <<<"$listing"
  done

  cp "$src/scripts/gpu-check.sh" "$root/gpu-check.sh"
  cat >"$root/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the bundled CUDA tests, training check and benchmarks from this unpacked folder (see
# gpu-check.sh):
#   ./run.sh [LOG_DIR]
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/gpu-check.sh" run-unpacked "$here" "$@"
EOF
  chmod +x "$root/run.sh" "$root/gpu-check.sh"
  printf '%s\n' "${tests[@]}" >"$root/tests.txt"
  # One benchmark a line: its name, then its arguments.
  for target in "${BENCHMARKS[@]}"; do echo "$target $(bench_args "$target")"; done \
    >"$root/benchmarks.txt"
  printf '%s\n' "${TOOLS[@]}" >"$root/tools.txt"
  echo "$BUNDLE_FORMAT" >"$root/format.txt"
  mkdir -p "$root/$(dirname "$TRAIN_SPEC")"
  cp "$src/$TRAIN_SPEC" "$root/$TRAIN_SPEC"
  echo "$TRAIN_SPEC" >"$root/train-spec.txt"
  mkdir -p "$root/$(dirname "$MLA_SPEC")"
  cp "$src/$MLA_SPEC" "$root/$MLA_SPEC"
  echo "$MLA_SPEC" >"$root/mla-spec.txt"
  printf '%s\n' "${provided[@]}" | LC_ALL=C sort -u >"$root/provided-by-gpu-machine.txt"
  write_runtime_needs "$root" >"$root/runtime-needs.txt"
  {
    echo "commit $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
    git -C "$src" diff --quiet HEAD 2>/dev/null || echo "with uncommitted changes"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(ldd --version | head -1)"
  } >"$root/build-info.txt"
  (cd "$root" && find . -type f ! -name MANIFEST.txt -printf '%s %P\n' | LC_ALL=C sort -k2) \
    >"$root/MANIFEST.txt"
  local raw_bytes
  raw_bytes=$(du -sb "$root" | cut -f1)
  log "staged ${#tests[@]} tests, ${TOOLS[*]}, ${#BENCHMARKS[@]} benchmarks," \
    "$(find "$root/lib" -type f | wc -l) libraries: $((raw_bytes / 1024 / 1024)) MiB; compressing"

  local compress_started=$SECONDS
  tar -C "$staging" --owner=0 --group=0 --numeric-owner -cf - "$BUNDLE_NAME" |
    xz -T"${GPU_CHECK_XZ_THREADS:-2}" -"${GPU_CHECK_XZ_LEVEL:-9}" >"$archive.tmp"
  local bytes
  bytes=$(stat -c %s "$archive.tmp")
  if [ "$bytes" -ge $MAX_BUNDLE_BYTES ]; then
    rm -f "$archive.tmp"
    die "the bundle is $((bytes / 1024 / 1024)) MiB, over the 64 MiB a copy may carry"
  fi
  mv "$archive.tmp" "$archive"
  (cd "$out" && sha256sum "$ARCHIVE_NAME" >"$ARCHIVE_NAME.sha256")
  cp "$root/MANIFEST.txt" "$out/MANIFEST.txt"
  log "wrote $archive: $bytes bytes ($((bytes * 100 / MAX_BUNDLE_BYTES))% of 64 MiB);" \
    "build ${build_seconds} s, staging and compression $((SECONDS - started - build_seconds)) s" \
    "(xz $((SECONDS - compress_started)) s)"
  log "CUDA libraries left to the GPU machine: $(tr '\n' ' ' <"$root/provided-by-gpu-machine.txt")"
}

# --- run ------------------------------------------------------------------------------------------

run() {
  [ $# -le 2 ] || usage_error "run takes at most BUNDLE_DIR and LOG_DIR"
  local bundle_dir=${1:-gpu-bundle} log_dir=${2:-}
  local archive=$bundle_dir/$ARCHIVE_NAME
  [ -f "$archive" ] || die "no $archive (make it with: gpu-check.sh bundle BUILD_DIR $bundle_dir)"
  if [ -f "$archive.sha256" ]; then
    (cd "$bundle_dir" && sha256sum --quiet -c "$ARCHIVE_NAME.sha256" >&2) ||
      die "$archive does not match its sha256: copied incompletely?"
  fi
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/moetrain-gpu-check.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap must remove this folder
  trap "rm -rf '$work'" EXIT
  xz -dc "$archive" | tar -C "$work" -xf - || die "could not unpack $archive"
  log "unpacked $archive into $work"
  run_unpacked "$work/$BUNDLE_NAME" "$log_dir"
}

# a <= b for version numbers: version_le 2.35 2.36.
version_le() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }

# The folder of the libstdc++ and libgcc_s to use, or nothing for the machine's own: the bundle's
# (those the tests were built with) where this machine's glibc loads them, else the machine's own
# if it has every symbol version the binaries need. GPU_CHECK_GLIBC_VERSION stands in for the
# machine's glibc version (tests).
gcc_runtime_dir() {
  local dir=$1 needs=$1/runtime-needs.txt have need need_runtime system version lacking=
  have=${GPU_CHECK_GLIBC_VERSION:-$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')}
  need=$(awk '$1 == "glibc" { sub(/GLIBC_/, "", $2); print $2 }' "$needs")
  need_runtime=$(awk '$1 == "gcc-runtime-glibc" { sub(/GLIBC_/, "", $2); print $2 }' "$needs")
  if [ -z "$have" ]; then
    log "cannot tell this machine's glibc version; using the bundle's libstdc++"
    echo "$dir/lib/gcc-runtime"
    return
  fi
  if [ -n "$need" ] && ! version_le "$need" "$have"; then
    log "WARNING: the binaries need glibc $need and this machine has $have: they will not load"
  fi
  if [ -z "$need_runtime" ] || version_le "$need_runtime" "$have"; then
    echo "$dir/lib/gcc-runtime"
    return
  fi
  for system in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libstdc++.so.6 \
    /usr/lib64/libstdc++.so.6 /lib64/libstdc++.so.6; do
    [ -e "$system" ] && break
  done
  if [ ! -e "$system" ]; then
    log "WARNING: glibc $have cannot load the bundle's libstdc++ (needs $need_runtime) and" \
      "this machine has none of its own"
    echo "$dir/lib/gcc-runtime"
    return
  fi
  local provided_versions
  provided_versions=$(grep -aoE '(GLIBCXX|CXXABI)_[0-9][0-9.]*' "$system" | sort -u)
  local -a versions
  read -ra versions < <(awk '$1 == "libstdc++" { $1 = ""; print }' "$needs")
  for version in "${versions[@]}"; do
    grep -qxF "$version" <<<"$provided_versions" || lacking+=" $version"
  done
  if [ -n "$lacking" ]; then
    log "WARNING: glibc $have cannot load the bundle's libstdc++ (needs $need_runtime), and" \
      "$system lacks$lacking: the tests will not load"
    echo "$dir/lib/gcc-runtime"
    return
  fi
  log "glibc $have cannot load the bundle's libstdc++ (needs $need_runtime): using $system"
}

# Library folders of the CUDA toolkit on this machine, and of PyTorch's NVIDIA wheels.
toolkit_lib_dirs() {
  local dir nvcc
  nvcc=$(command -v nvcc || true)
  for dir in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"} \
    ${nvcc:+"$(dirname "$nvcc")/../lib64" "$(dirname "$nvcc")/../lib"} \
    /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$dir" ] && (cd "$dir" && pwd)
  done | awk '!seen[$0]++'
}
python_nvidia_lib_dirs() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 - <<'EOF' 2>/dev/null || true
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for root in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(root, "**", "lib"), recursive=True)):
        if glob.glob(os.path.join(lib, "*.so*")):
            print(lib)
EOF
}

# The libraries ldd cannot resolve for the bundled binaries, one "binary: library" a line; and
# cuBLASLt, which the CUDA backend loads with dlopen (so ldd does not list it), when neither a
# folder of LD_LIBRARY_PATH nor the loader's cache has it.
unresolved_libraries() {
  local dir=$1 binary folder cublaslt=libcublasLt.so.13 found=
  for binary in "$dir"/bin/*; do
    ldd "$binary" 2>/dev/null | awk -v b="${binary##*/}" '/not found/ { print b ": " $1 }'
  done
  local -a folders
  IFS=: read -ra folders <<<"${LD_LIBRARY_PATH:-}"
  for folder in "${folders[@]}"; do
    [ -n "$folder" ] && [ -e "$folder/$cublaslt" ] && found=1
  done
  [ -n "$found" ] || /sbin/ldconfig -p 2>/dev/null | grep -q "$cublaslt" || echo "dlopen: $cublaslt"
}

# Seconds left of GPU_CHECK_BUDGET (set by run_unpacked); every phase stops starting work at 0.
budget_left() { echo $((RUN_BUDGET_END - SECONDS)); }
# min(a, b)
min() { echo $(($1 < $2 ? $1 : $2)); }
phase_enabled() { [[ " $2 " == *" $1 "* ]]; }

# Phase 1: every bundled test, each under a time limit; logs/tests.tsv and each test's log and
# gtest JSON.
run_tests() {
  local dir=$1 logs=$2
  local -a tests
  mapfile -t tests <"$dir/tests.txt"
  local test_timeout=${GPU_CHECK_TEST_TIMEOUT:-90} budget=${GPU_CHECK_TESTS_BUDGET:-180}
  local tests_started=$SECONDS i=0 name left limit rc t0 outcome seconds
  for name in "${tests[@]}"; do
    i=$((i + 1))
    left=$(min $((budget - (SECONDS - tests_started))) "$(budget_left)")
    if [ "$left" -le 0 ]; then
      log "[$i/${#tests[@]}] $name: not run (the time budget is spent)"
      printf '%s\tnot_run\t0\t0\n' "$name" >>"$logs/tests.tsv"
      continue
    fi
    limit=$((left < test_timeout ? left : test_timeout))
    t0=$(now)
    rc=0
    timeout -k 10 "$limit" "$dir/bin/$name" --gtest_brief=1 \
      --gtest_output="json:$logs/$name.json" >"$logs/$name.log" 2>&1 || rc=$?
    outcome=ran
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || outcome=timeout
    seconds=$(since "$t0")
    printf '%s\t%s\t%s\t%s\n' "$name" "$outcome" "$rc" "$seconds" >>"$logs/tests.tsv"
    if [ $rc -eq 0 ]; then
      log "[$i/${#tests[@]}] $name: ok ($seconds s)"
    else
      [ $outcome = ran ] || rc="$rc, timed out after $limit s"
      log "[$i/${#tests[@]}] $name: FAILED (exit $rc, $seconds s); its last lines:"
      tail -n 20 "$logs/$name.log" | sed 's/^/    /' >&2
    fi
  done
}

# A copy of the spec SRC at DST that trains STEPS steps in PRECISION (FP32, BF16, or FP8:RECIPE
# with RECIPE one of DELAYED, CURRENT, BLOCKWISE, MXFP8) and reports every step: train.steps,
# train.log_every and train.precision set (added when absent; FP8 adds train.fp8.recipe, and the
# spec must have no train.fp8 of its own), and train.optimizer.warmup_steps lowered to a quarter
# of the steps where it is longer.
make_train_spec() {
  python3 - "$@" <<'PY'
import re, sys
src, dst, precision, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
precision, _, recipe = precision.partition(":")
want = {"steps": str(steps), "log_every": "1", "precision": precision}
want.update(arg.split("=", 1) for arg in sys.argv[5:])  # more train keys, KEY=VALUE
out, section, seen, train_at = [], None, set(), None
for line in open(src).read().splitlines():
    top = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):", line)
    if top:
        section = top.group(1)
    elif section == "train":
        key = re.match(r"^  (%s):" % "|".join(want), line)
        warmup = re.match(r"^    warmup_steps:\s*(\d+)", line)
        if key:
            seen.add(key.group(1))
            line = "  %s: %s" % (key.group(1), want[key.group(1)])
        elif warmup and int(warmup.group(1)) > steps // 4:
            line = "    warmup_steps: %d" % (steps // 4)
    out.append(line)
    if top and section == "train":
        train_at = len(out)
if train_at is None:
    out.append("train:")
    train_at = len(out)
out[train_at:train_at] = ["  %s: %s" % (k, v) for k, v in want.items() if k not in seen] + (
    ["  fp8:", "    recipe: %s" % recipe] if recipe else [])
with open(dst, "w") as f:
    f.write("\n".join(out) + "\n")
PY
}

# gpu-check.sh compare-losses: see the header. One JSON verdict on stdout; exit 0 pass, 1 fail,
# 2 bad usage.
compare_losses() {
  python3 - "$@" <<'PY'
import argparse, json, math, sys

parser = argparse.ArgumentParser(prog="gpu-check.sh compare-losses")
mode = parser.add_mutually_exclusive_group(required=True)
mode.add_argument("--rtol", type=float, help="largest |new - ref| / |ref| allowed at any step")
mode.add_argument("--identical", action="store_true", help="every loss bit for bit")
parser.add_argument("--expect-steps", type=int, help="the number of steps each must have")
parser.add_argument("ref", help="moetrain run --json output: the reference")
parser.add_argument("new", help="moetrain run --json output: compared with ref")
args = parser.parse_args()
if args.rtol is not None and not args.rtol >= 0:
    parser.error("--rtol must be a number >= 0")

def load(path):
    """{step: loss} of the step lines (those with "step" and "loss"); loss None where not a
    finite number (moetrain prints NaN as null). Other lines (messages, checkpoints, the summary,
    a line cut off when the run was killed) are not steps."""
    try:
        text = open(path, errors="replace").read()
    except OSError as e:
        return None, "cannot read %s: %s" % (path, e.strerror)
    steps = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or "step" not in obj or "loss" not in obj:
            continue
        step, loss = obj["step"], obj["loss"]
        if not isinstance(step, int) or isinstance(step, bool):
            return None, "%s: a step that is not an integer: %r" % (path, step)
        if step in steps:
            return None, "%s: step %d appears twice" % (path, step)
        ok = isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss)
        steps[step] = float(loss) if ok else None
    if not steps:
        return None, "%s has no step lines" % path
    return steps, None

def show(loss):
    return "NaN or inf" if loss is None else repr(loss)

def span(steps):
    keys = sorted(steps)
    return "%d steps (%d..%d)" % (len(keys), keys[0], keys[-1])

verdict = {"pass": False, "mode": "identical" if args.identical else "rtol"}
if args.rtol is not None:
    verdict["rtol"] = args.rtol
ref, ref_error = load(args.ref)
new, new_error = load(args.new)
reasons = [e for e in (ref_error, new_error) if e]
if not reasons:
    verdict["steps"] = len(ref)
    verdict["ref_final_loss"] = ref[max(ref)]
    verdict["new_final_loss"] = new[max(new)]
    if set(ref) != set(new):
        reasons.append("the steps differ: ref has %s, new has %s" % (span(ref), span(new)))
    for name, steps in (("ref", ref), ("new", new)):
        if args.expect_steps is not None and len(steps) != args.expect_steps:
            reasons.append("%s has %s, not %d" % (name, span(steps), args.expect_steps))
    worst, worst_step, first_bad = 0.0, None, None
    for step in sorted(set(ref) & set(new)):
        a, b = ref[step], new[step]
        if a is None or b is None:
            reasons.append("step %d: a loss that is not finite (ref %s, new %s)"
                           % (step, show(a), show(b)))
            break
        rel = abs(b - a) / abs(a) if a != 0 else (0.0 if b == 0 else math.inf)
        if worst_step is None or rel > worst:
            worst, worst_step = rel, step
        bad = (b != a) if args.identical else (rel > args.rtol)
        if bad and first_bad is None:
            first_bad = (step, a, b, rel)
    if worst_step is not None:
        verdict["max_rel_diff"] = worst
        verdict["worst_step"] = worst_step
    if first_bad is not None:
        step, a, b, rel = first_bad
        if args.identical:
            reasons.append("step %d: %r != %r (not bit-identical)" % (step, a, b))
        else:
            reasons.append("step %d: %r vs %r, relative difference %.3g > %g"
                           % (step, a, b, rel, args.rtol))
verdict["pass"] = not reasons
if reasons:
    verdict["reason"] = "; ".join(reasons)
print(json.dumps(verdict))
sys.exit(0 if verdict["pass"] else 1)
PY
}

# Phase 2: 20 steps of the bundled spec through `moetrain run --json` on the CPU and on CUDA, in
# f32, bf16 and each FP8 recipe, CUDA f32 twice and once recomputing; then the loss checks.
# logs/training.tsv (name, outcome, exit, seconds, device, precision), run-NAME.jsonl and .log,
# train-PRECISION.yaml (the specs trained), checks.tsv (check, ref run, new run) and
# check-NAME.json (each verdict).
run_training() {
  local dir=$1 logs=$2 spec
  spec=$dir/$(cat "$dir/train-spec.txt")
  local precision recipe spec_precision
  local -a precisions=(f32 bf16) fp8_runs=() fp8_checks=()
  for recipe in "${FP8_RECIPES[@]}"; do
    precisions+=("fp8-$recipe")
    fp8_runs+=("cpu_fp8_$recipe:cpu:fp8-$recipe" "cuda_fp8_$recipe:cuda:fp8-$recipe")
    fp8_checks+=("loss_fp8_${recipe}_cuda_vs_cpu cpu_fp8_$recipe cuda_fp8_$recipe --rtol $LOSS_RTOL_FP8")
  done
  for precision in "${precisions[@]}"; do
    case $precision in
      f32) spec_precision=FP32 ;;
      bf16) spec_precision=BF16 ;;
      fp8-*) spec_precision=FP8:$(echo "${precision#fp8-}" | tr '[:lower:]' '[:upper:]') ;;
    esac
    if ! make_train_spec "$spec" "$logs/train-$precision.yaml" "$spec_precision" "$TRAIN_STEPS" \
      2>"$logs/train-spec.log"; then
      log "could not write the $precision spec: $(cat "$logs/train-spec.log")"
    fi
  done
  if ! make_train_spec "$spec" "$logs/train-f32-recompute.yaml" FP32 "$TRAIN_STEPS" \
    recompute=FULL 2>"$logs/train-spec.log"; then
    log "could not write the recompute spec: $(cat "$logs/train-spec.log")"
  fi
  if ! make_train_spec "$dir/$(cat "$dir/mla-spec.txt")" "$logs/train-mla-f32.yaml" FP32 \
    "$TRAIN_STEPS" "${MLA_TRAIN_KEYS[@]}" 2>"$logs/train-spec.log"; then
    log "could not write the MLA spec: $(cat "$logs/train-spec.log")"
  fi
  if ! make_train_spec "$dir/$(cat "$dir/mla-spec.txt")" "$logs/train-mla-f32-selective.yaml" \
    FP32 "$TRAIN_STEPS" "${MLA_TRAIN_KEYS[@]}" recompute=SELECTIVE 2>"$logs/train-spec.log"; then
    log "could not write the MLA selective-recompute spec: $(cat "$logs/train-spec.log")"
  fi
  local train_timeout=${GPU_CHECK_TRAIN_TIMEOUT:-60} entry name device limit rc t0 seconds outcome
  local checkpoints=$dir/training-checkpoints
  for entry in cpu_f32:cpu:f32 cuda_f32:cuda:f32 cuda_f32_repeat:cuda:f32 \
    cuda_f32_recompute:cuda:f32-recompute cpu_bf16:cpu:bf16 cuda_bf16:cuda:bf16 "${fp8_runs[@]}" \
    cpu_mla_f32:cpu:mla-f32 cuda_mla_f32:cuda:mla-f32 \
    cuda_mla_f32_selective:cuda:mla-f32-selective; do
    IFS=: read -r name device precision <<<"$entry"
    limit=$(min "$train_timeout" "$(budget_left)")
    if [ "$limit" -le 0 ]; then
      log "training $name: not run (the time budget is spent)"
      printf '%s\tnot_run\t0\t0\t%s\t%s\n' "$name" "$device" "$precision" >>"$logs/training.tsv"
      continue
    fi
    rm -rf "$checkpoints"
    t0=$(now)
    rc=0
    timeout -k 10 "$limit" "$dir/bin/moetrain" run --json --device "$device" \
      --checkpoint-dir "$checkpoints" "$logs/train-$precision.yaml" >"$logs/run-$name.jsonl" \
      2>"$logs/run-$name.log" || rc=$?
    rm -rf "$checkpoints"  # tens of MiB, never read
    seconds=$(since "$t0")
    outcome=ran
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || outcome=timeout
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$outcome" "$rc" "$seconds" "$device" "$precision" \
      >>"$logs/training.tsv"
    if [ $rc -eq 0 ]; then
      log "training $name: $TRAIN_STEPS steps on $device in $precision ($seconds s)"
    else
      log "training $name: FAILED (exit $rc, $outcome, $seconds s); its last lines:"
      tail -n 10 "$logs/run-$name.log" | sed 's/^/    /' >&2
    fi
  done
  local check ref new how_text
  local -a how
  for entry in "loss_f32_cuda_vs_cpu cpu_f32 cuda_f32 --rtol $LOSS_RTOL_F32" \
    "loss_bf16_cuda_vs_cpu cpu_bf16 cuda_bf16 --rtol $LOSS_RTOL_BF16" \
    "cuda_f32_bit_identical cuda_f32 cuda_f32_repeat --identical" \
    "cuda_f32_recompute_bit_identical cuda_f32 cuda_f32_recompute --identical" "${fp8_checks[@]}" \
    "loss_mla_f32_cuda_vs_cpu cpu_mla_f32 cuda_mla_f32 --rtol $LOSS_RTOL_F32" \
    "cuda_mla_f32_selective_bit_identical cuda_mla_f32 cuda_mla_f32_selective --identical"; do
    read -r check ref new how_text <<<"$entry"
    read -ra how <<<"$how_text"
    printf '%s\t%s\t%s\n' "$check" "$ref" "$new" >>"$logs/checks.tsv"
    # From logs/, so that the verdict names the files as LOG_DIR holds them.
    (cd "$logs" && compare_losses "${how[@]}" --expect-steps "$TRAIN_STEPS" "run-$ref.jsonl" \
      "run-$new.jsonl" >"check-$check.json" 2>>checks.log) || true
    log "$check: $(cat "$logs/check-$check.json")"
  done
}

# Phase 3: each benchmark with its arguments (benchmarks.txt); logs/benchmarks.tsv, NAME.json
# (its stdout) and NAME.log (its stderr).
run_benchmarks() {
  local dir=$1 logs=$2
  local bench bench_args_text rc t0 limit bench_timeout=${GPU_CHECK_BENCH_TIMEOUT:-150}
  local -a args
  while read -r bench bench_args_text; do
    [ -n "$bench" ] || continue
    read -ra args <<<"$bench_args_text"
    limit=$(min "$bench_timeout" "$(budget_left)")
    if [ "$limit" -le 0 ]; then
      log "$bench: not run (the time budget is spent)"
      printf '%s\tnot_run\t0\t0\n' "$bench" >>"$logs/benchmarks.tsv"
      continue
    fi
    log "$bench ${args[*]} (at most $limit s)"
    rc=0
    t0=$(now)
    timeout -k 10 "$limit" "$dir/bin/$bench" "${args[@]}" \
      >"$logs/$bench.json" 2>"$logs/$bench.log" || rc=$?
    printf '%s\tran\t%s\t%s\n' "$bench" "$rc" "$(since "$t0")" >>"$logs/benchmarks.tsv"
    if [ $rc -ne 0 ]; then
      log "$bench failed (exit $rc); its last lines:"
      tail -n 15 "$logs/$bench.log" | sed 's/^/    /' >&2
    fi
  done <"$dir/benchmarks.txt"
}

run_unpacked() {
  local dir=$1 log_dir=${2:-}
  [ -f "$dir/tests.txt" ] || die "$dir is not an unpacked bundle (no tests.txt)"
  local format
  format=$(cat "$dir/format.txt" 2>/dev/null || echo 1)
  [ "$format" = "$BUNDLE_FORMAT" ] ||
    die "$dir is a bundle of format $format, this gpu-check.sh reads $BUNDLE_FORMAT: make it again" \
      "with this gpu-check.sh bundle"
  dir=$(cd "$dir" && pwd)
  local smi=${GPU_CHECK_NVIDIA_SMI:-nvidia-smi} gpus
  if ! command -v "$smi" >/dev/null 2>&1; then
    echo "skipped: no GPU (no nvidia-smi on this machine)"
    return 0
  fi
  if ! gpus=$("$smi" -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
    echo "skipped: no GPU (nvidia-smi -L: $(head -1 <<<"$gpus"))"
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || die "python3 is needed for the JSON summary"

  local logs=$dir/logs gpu_csv line
  mkdir -p "$logs"
  gpu_csv=$("$smi" --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total \
    --format=csv 2>&1) || die "nvidia-smi --query-gpu failed: $gpu_csv"
  echo "$gpu_csv" >"$logs/gpu.csv"
  log "GPUs:"
  while read -r line; do echo "  $line" >&2; done <<<"$gpu_csv"

  # The bundle's libraries first, then the toolkit's; PyTorch's NVIDIA wheels only for what the
  # toolkit lacks (NCCL, say), so that one toolkit's libraries are not mixed with another's.
  local lib_path=$dir/lib dir_entry gcc_runtime
  gcc_runtime=$(gcc_runtime_dir "$dir")
  [ -z "$gcc_runtime" ] || lib_path+=":$gcc_runtime"
  while read -r dir_entry; do lib_path+=":$dir_entry"; done < <(toolkit_lib_dirs)
  export LD_LIBRARY_PATH=$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local unresolved
  unresolved=$(unresolved_libraries "$dir")
  if [ -n "$unresolved" ]; then
    while read -r dir_entry; do
      [ -n "$dir_entry" ] && LD_LIBRARY_PATH+=":$dir_entry"
    done < <(python_nvidia_lib_dirs)
    unresolved=$(unresolved_libraries "$dir")
  fi
  log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  [ -z "$unresolved" ] || log "libraries not found (those binaries will fail):"$'\n'"$unresolved"

  local phases=${GPU_CHECK_PHASES:-tests training benchmarks}
  echo "$phases" >"$logs/phases.txt"
  : >"$logs/tests.tsv"
  : >"$logs/training.tsv"
  : >"$logs/checks.tsv"
  : >"$logs/benchmarks.tsv"
  RUN_BUDGET_END=$((SECONDS + ${GPU_CHECK_BUDGET:-420}))
  if phase_enabled tests "$phases"; then run_tests "$dir" "$logs"; fi
  if phase_enabled training "$phases"; then run_training "$dir" "$logs"; fi
  if phase_enabled benchmarks "$phases"; then run_benchmarks "$dir" "$logs"; fi

  local status=0
  summarize "$logs" "$(since "$SCRIPT_STARTED")" >"$logs/summary.json" || status=$?
  cat "$logs/summary.json"
  if [ -n "$log_dir" ]; then
    mkdir -p "$log_dir"
    cp -r "$logs/." "$log_dir/"
    log "logs copied to $log_dir"
  fi
  return $status
}

# Prints the JSON summary of a run from its logs folder; exit 1 when a check failed.
summarize() {
  python3 - "$1" "$2" <<'EOF'
import csv, json, os, sys

logs, seconds = sys.argv[1], float(sys.argv[2])

def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default

rows = list(csv.reader(read(os.path.join(logs, "gpu.csv")).strip().splitlines()))
# "clocks.current.sm [MHz]" -> "clocks.current.sm"; the values keep their units.
keys = [h.split("[")[0].strip() for h in rows[0]] if rows else []
gpus = [dict(zip(keys, [v.strip() for v in row])) for row in rows[1:]]
first = gpus[0] if gpus else {}
summary = {
    "gpu": first.get("name", "unknown"),
    "driver": first.get("driver_version", "unknown"),
    "clocks": {k: v for k, v in first.items() if k.startswith("clocks") or k.startswith("memory")},
    "gpu_count": len(gpus),
}

# gpu_not_usable: tests that skipped with "no GPU" although nvidia-smi lists one (a driver older
# than the toolkit, say); the run then checked nothing and must not pass.
tests = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "not_run": [],
         "gpu_not_usable": [], "binaries": {}}
for line in read(os.path.join(logs, "tests.tsv")).splitlines():
    name, outcome, rc, secs = line.split("\t")
    entry = {"exit": int(rc), "seconds": float(secs), "passed": 0, "failed": 0, "skipped": 0}
    tests["binaries"][name] = entry
    if outcome == "not_run":
        entry["outcome"] = "not run: time budget spent"
        tests["not_run"].append(name)
        continue
    try:
        report = json.loads(read(os.path.join(logs, name + ".json"), "null"))
    except ValueError:
        report = None
    for suite in (report or {}).get("testsuites", []):
        for case in suite.get("testsuite", []):
            if case.get("status") == "NOTRUN":  # DISABLED_ tests
                continue
            full = "%s: %s.%s" % (name, suite.get("name"), case.get("name"))
            if case.get("failures"):
                entry["failed"] += 1
                tests["failures"].append(full)
            elif case.get("result") == "SKIPPED":
                entry["skipped"] += 1
            else:
                entry["passed"] += 1
    if outcome == "timeout":
        entry["outcome"] = "timed out"
        tests["failures"].append("%s: timed out after %s s" % (name, secs))
        entry["failed"] += 1
    elif int(rc) != 0 and entry["failed"] == 0:
        # A crash, or a failure outside any test: the binary's exit says so, gtest's JSON may not.
        why = "" if report else ", no gtest report"
        tests["failures"].append("%s: exit %s%s" % (name, rc, why))
        entry["failed"] += 1
    # gtest prints "file:line: Skipped" and then the reason.
    log = read(os.path.join(logs, name + ".log")).splitlines()
    reasons = []
    for previous, reason in zip(log, log[1:]):
        if previous.endswith(": Skipped") and reason not in reasons:
            reasons.append(reason)
    if reasons:
        entry["skip_reasons"] = reasons[:3]
    no_gpu = [r for r in reasons if r.startswith("no GPU")]
    if no_gpu:
        tests["gpu_not_usable"].append("%s: %s" % (name, no_gpu[0]))
    for key in ("passed", "failed", "skipped"):
        tests[key] += entry[key]
summary["tests"] = tests

def last_json_object(text):
    """The last line of text that parses as a JSON object, or None."""
    for candidate in reversed(text.strip().splitlines()):
        if candidate.startswith("{"):
            try:
                value = json.loads(candidate)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None

def tail(name, lines=10):
    return read(os.path.join(logs, name)).strip().splitlines()[-lines:]

def exit_text(rc):
    return "exit %s%s" % (rc, " (timed out)" if rc in ("124", "137") else "")

phases = read(os.path.join(logs, "phases.txt")).split()
checks = {}
if "tests" in phases:
    checks["tests"] = {
        "pass": bool(tests["binaries"]) and not (tests["failed"] or tests["not_run"] or
                                                 tests["gpu_not_usable"]),
        "passed": tests["passed"], "failed": tests["failed"], "skipped": tests["skipped"]}

# Training: each run's outcome and losses, then the loss checks (a check fails when either of
# its runs did, whatever the comparison of what they printed says).
runs = {}
for line in read(os.path.join(logs, "training.tsv")).splitlines():
    name, outcome, rc, secs, device, precision = line.split("\t")
    entry = {"device": device, "precision": precision, "exit": int(rc), "seconds": float(secs)}
    steps = []
    for text in read(os.path.join(logs, "run-%s.jsonl" % name)).splitlines():
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict) and "step" in obj and "loss" in obj:
            steps.append(obj)
    entry["steps"] = len(steps)
    if steps:
        entry["final_loss"] = steps[-1]["loss"]
        rates = sorted(s.get("tokens_per_s") or 0 for s in steps[1:]) or [0]
        entry["tokens_per_s"] = rates[len(rates) // 2]  # median, the first step left out
        peaks = [s["device_memory_peak_bytes"] for s in steps if "device_memory_peak_bytes" in s]
        if peaks:
            entry["device_memory_peak_bytes"] = max(peaks)
    if outcome == "not_run":
        entry["outcome"] = "not run: time budget spent"
    elif int(rc) != 0:
        entry["outcome"] = exit_text(rc)
        entry["stderr_tail"] = tail("run-%s.log" % name, 5)
    runs[name] = entry
if "training" in phases:
    summary["training"] = {"runs": runs}
    for line in read(os.path.join(logs, "checks.tsv")).splitlines():
        check, ref, new = line.split("\t")
        verdict = last_json_object(read(os.path.join(logs, "check-%s.json" % check)))
        if verdict is None:
            verdict = {"pass": False, "reason": "no verdict: %s" % " ".join(tail("checks.log", 3))}
        failed_runs = ["%s: %s" % (r, runs[r].get("outcome", "?")) for r in (ref, new)
                       if r not in runs or runs[r]["exit"] != 0 or "outcome" in runs[r]]
        if failed_runs:
            verdict["pass"] = False
            verdict["reason"] = "; ".join(["run " + f for f in failed_runs] +
                                          ([verdict["reason"]] if "reason" in verdict else []))
        verdict["runs"] = [ref, new]
        checks[check] = verdict

benches = {}
targets = {}
for line in read(os.path.join(logs, "benchmarks.tsv")).splitlines():
    name, outcome, rc, secs = line.split("\t")
    parsed = last_json_object(read(os.path.join(logs, name + ".json")))
    if outcome == "not_run":
        benches[name] = {"error": "not run: time budget spent"}
    elif int(rc) == 0 and parsed is not None:
        benches[name] = parsed
    else:
        benches[name] = {"error": exit_text(rc) if int(rc) != 0 else "no JSON on stdout",
                         "seconds": float(secs), "stderr_tail": tail(name + ".log")}
    checks[name] = {"pass": "error" not in benches[name], "seconds": float(secs)}
    if "error" in benches[name]:
        checks[name]["reason"] = benches[name]["error"]
    if name == "train_bench" and "error" not in benches[name]:
        report = benches[name]
        if isinstance(report.get("mfu"), (int, float)):
            targets["train_bench_mfu"] = {"value": report["mfu"], "target": ">= 0.35",
                                          "met": report["mfu"] >= 0.35}
        # Peak device memory against the sum of what the trainer keeps (parameters, gradients,
        # optimizer state, activations), where train_bench reports both.
        peak, kept = report.get("peak_memory_bytes"), report.get("expected_memory_bytes")
        if isinstance(peak, (int, float)) and isinstance(kept, (int, float)) and kept > 0:
            targets["train_bench_peak_memory"] = {
                "peak_bytes": peak, "kept_bytes": kept, "ratio": peak / kept,
                "target": "within 10% of the sum", "met": abs(peak / kept - 1) <= 0.10}
summary["bench"] = benches
summary["checks"] = checks
summary["targets"] = targets
summary["passed"] = bool(checks) and all(c.get("pass") for c in checks.values())
summary["seconds"] = round(seconds, 1)
# One line per key: it stays readable, and short enough to survive a terminal's tail.
print("{\n" + ",\n".join(" %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in summary.items())
      + "\n}")
sys.exit(0 if summary["passed"] else 1)
EOF
}

# --- main -----------------------------------------------------------------------------------------

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  compare-losses) shift; compare_losses "$@" ;;
  run-unpacked)  # the bundle's run.sh: an unpacked bundle folder, then LOG_DIR
    shift
    if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage_error "run-unpacked takes DIR [LOG_DIR]"; fi
    run_unpacked "$@"
    ;;
  -h | --help | help) usage ;;
  "") usage_error "a subcommand is needed" ;;
  *) usage_error "unknown subcommand: $1" ;;
esac
