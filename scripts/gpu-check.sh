#!/usr/bin/env bash
# One command for a short GPU loan. A GPU machine is lent to this project
# rarely and briefly, with the CUDA driver and toolkit, CMake and Python but none of our other
# dependencies, and no network. So the work splits in two:
#
#   gpu-check.sh bundle [--no-build] [BUILD_DIR [OUT_DIR]]    here (defaults: build, gpu-bundle)
#     Builds the CUDA tests and the benchmark, collects them with every shared library they load
#     except glibc's and the CUDA driver's and toolkit's (their ldd closure), and writes
#     OUT_DIR/moetrain-gpu-bundle.tar.xz (under 64 MiB), its .sha256 and MANIFEST.txt. OUT_DIR must
#     be outside the repository or ignored by git (gpu-bundle/ is). --no-build: the build is done.
#   gpu-check.sh run [BUNDLE_DIR [LOG_DIR]]                   there (default: gpu-bundle)
#     Unpacks the bundle into a temporary folder, prints the GPU, driver and clocks, runs every
#     bundled test, then the benchmark, and prints one JSON summary on stdout (progress goes to
#     stderr). Without a GPU it prints "skipped: no GPU (why)" and exits 0. Exit 1 when a test
#     failed or did not run, or when the tests found no usable GPU although nvidia-smi lists one
#     (the benchmark's result or error is in the summary; it does not set the exit status).
#     LOG_DIR, if given, receives every test's log and gtest JSON, the benchmark's output and
#     summary.json.
#
# The CUDA tests are found by name, so new ones join without editing this file: every
# tests/**/*_cuda_test.cc, plus the runtime tests named in RUNTIME_TESTS and LAST_TESTS below.
# The benchmark runs as `moe_layer_bench --device cuda --json`.
#
# Environment of `run` (seconds): GPU_CHECK_TEST_TIMEOUT (one test, 90), GPU_CHECK_TESTS_BUDGET
# (all tests, 150), GPU_CHECK_BENCH_TIMEOUT (200): the whole run fits in about 6 minutes. For
# tests: GPU_CHECK_NVIDIA_SMI (the nvidia-smi to ask), GPU_CHECK_GLIBC_VERSION (this machine's
# glibc, as far as choosing a libstdc++ goes). Of `bundle`: GPU_CHECK_JOBS (build jobs),
# GPU_CHECK_XZ_THREADS (2), GPU_CHECK_XZ_LEVEL (9).
set -euo pipefail

readonly BUNDLE_NAME=moetrain-gpu-bundle
readonly ARCHIVE_NAME=$BUNDLE_NAME.tar.xz
readonly MAX_BUNDLE_BYTES=$((64 * 1024 * 1024))
# GPU tests whose names do not end in _cuda_test: the device query, the CUDA runtime and the NCCL
# communicator (it runs collectives on device memory where a GPU is). Run first, in this order:
# when the runtime is broken, their failures say so before the op tests' do.
readonly RUNTIME_TESTS=(device_query_test exec_context_test caching_allocator_test)
readonly LAST_TESTS=(nccl_communicator_test)
readonly BENCHMARKS=(moe_layer_bench)
readonly BENCH_ARGS=(--device cuda --json)

usage() {
  cat <<'EOF'
usage: gpu-check.sh bundle [--no-build] [BUILD_DIR [OUT_DIR]]   (defaults: build gpu-bundle)
       gpu-check.sh run [BUNDLE_DIR [LOG_DIR]]                  (default: gpu-bundle)
       gpu-check.sh --help

bundle  builds the CUDA tests and moe_layer_bench in BUILD_DIR and writes
        OUT_DIR/moetrain-gpu-bundle.tar.xz (+ .sha256, MANIFEST.txt): the binaries and every
        shared library they load except glibc's and the CUDA driver's and toolkit's.
run     on the GPU machine: unpacks the bundle, prints the GPU, runs the tests and the
        benchmark, prints one JSON summary. Without a GPU: "skipped: no GPU", exit 0.
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
  targets=("${tests[@]}" "${BENCHMARKS[@]}")
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
# Runs the bundled CUDA tests and benchmark from this unpacked folder (see gpu-check.sh):
#   ./run.sh [LOG_DIR]
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/gpu-check.sh" run-unpacked "$here" "$@"
EOF
  chmod +x "$root/run.sh" "$root/gpu-check.sh"
  printf '%s\n' "${tests[@]}" >"$root/tests.txt"
  printf '%s\n' "${BENCHMARKS[@]}" >"$root/benchmarks.txt"
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
  log "staged ${#tests[@]} tests, ${#BENCHMARKS[@]} benchmark," \
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

# The libraries ldd cannot resolve for the bundled binaries, one "binary: library" a line.
unresolved_libraries() {
  local dir=$1 binary
  for binary in "$dir"/bin/*; do
    ldd "$binary" 2>/dev/null | awk -v b="${binary##*/}" '/not found/ { print b ": " $1 }'
  done
}

run_unpacked() {
  local dir=$1 log_dir=${2:-}
  [ -f "$dir/tests.txt" ] || die "$dir is not an unpacked bundle (no tests.txt)"
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

  local -a tests
  mapfile -t tests <"$dir/tests.txt"
  local test_timeout=${GPU_CHECK_TEST_TIMEOUT:-90} budget=${GPU_CHECK_TESTS_BUDGET:-150}
  local tests_started=$SECONDS i=0 name left limit rc t0 outcome seconds
  : >"$logs/tests.tsv"
  for name in "${tests[@]}"; do
    i=$((i + 1))
    left=$((budget - (SECONDS - tests_started)))
    if [ $left -le 0 ]; then
      log "[$i/${#tests[@]}] $name: not run (the tests' ${budget} s are spent)"
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

  local bench bench_rc=0 bench_timeout=${GPU_CHECK_BENCH_TIMEOUT:-200}
  : >"$logs/benchmarks.tsv"
  while read -r bench; do
    [ -n "$bench" ] || continue
    log "$bench ${BENCH_ARGS[*]} (at most $bench_timeout s)"
    bench_rc=0
    t0=$(now)
    timeout -k 10 "$bench_timeout" "$dir/bin/$bench" "${BENCH_ARGS[@]}" \
      >"$logs/$bench.json" 2>"$logs/$bench.log" || bench_rc=$?
    printf '%s\t%s\t%s\n' "$bench" "$bench_rc" "$(since "$t0")" >>"$logs/benchmarks.tsv"
    if [ $bench_rc -ne 0 ]; then
      log "$bench failed (exit $bench_rc); its last lines:"
      tail -n 15 "$logs/$bench.log" | sed 's/^/    /' >&2
    fi
  done <"$dir/benchmarks.txt"

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

# Prints the JSON summary of a run from its logs folder; exit 1 when a test failed or did not run.
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

benches = {}
for line in read(os.path.join(logs, "benchmarks.tsv")).splitlines():
    name, rc, secs = line.split("\t")
    out = read(os.path.join(logs, name + ".json")).strip().splitlines()
    parsed = None
    for candidate in reversed(out):
        if candidate.startswith("{"):
            try:
                parsed = json.loads(candidate)
                break
            except ValueError:
                pass
    if int(rc) == 0 and parsed is not None:
        benches[name] = parsed
    else:
        err = read(os.path.join(logs, name + ".log")).strip().splitlines()[-10:]
        timed_out = " (timed out)" if rc in ("124", "137") else ""
        benches[name] = {"error": "exit %s%s" % (rc, timed_out), "seconds": float(secs),
                         "stderr_tail": err}
# One benchmark: its report itself; several: by name.
summary["bench"] = next(iter(benches.values())) if len(benches) == 1 else benches
summary["seconds"] = round(seconds, 1)
# One line per key: it stays readable, and short enough to survive a terminal's tail.
print("{\n" + ",\n".join(" %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in summary.items())
      + "\n}")
sys.exit(1 if tests["failed"] or tests["not_run"] or tests["gpu_not_usable"] else 0)
EOF
}

# --- main -----------------------------------------------------------------------------------------

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  run-unpacked)  # the bundle's run.sh: an unpacked bundle folder, then LOG_DIR
    shift
    if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage_error "run-unpacked takes DIR [LOG_DIR]"; fi
    run_unpacked "$@"
    ;;
  -h | --help | help) usage ;;
  "") usage_error "a subcommand is needed" ;;
  *) usage_error "unknown subcommand: $1" ;;
esac
