#!/usr/bin/env bash
# engine/model, engine/moe, engine/train and engine/fp8 compose ops (docs/engine.md): they call
# no backend directly, use no thread pool or OpenMP, and read no tensor's elements on the host, so
# that a device backend plugs in under engine/ops without touching them. This greps for the ways
# that rule breaks and names every line that breaks it.
#
#   layering_test.sh SOURCE_DIR     checks the tree (exit 1 naming each violation)
#   layering_test.sh --self-test    checks that a planted violation of each kind is caught
set -u

# The data loaders and the checkpoint files read and write host memory by nature: tokens come
# from files, tensors go to files. Everything else reaches elements only through ops. (parallel.cc
# packs host numbers, not tensors, for the ranks' sums; fp8_state.cc updates the FP8 amax
# histories and scales on the host from their copies there, once per step, and builds the
# checkpoint's host tensor of them.)
HOST_IO_FILES='engine/train/(data|synthetic|token_file|safetensors|checkpoint)\.cc'
HOST_NUMBER_FILES='engine/(train/parallel|fp8/fp8_state)\.cc'

# In a subshell: the cd stays inside.
check_tree() (
  local src=$1 found=0 hits
  cd "$src" || return 2
  local dirs=(engine/model engine/moe engine/train engine/fp8)
  # A backend, its thread pool or OpenMP, anywhere in the four folders.
  hits=$(grep -rnE 'cpu::|engine/backend/cpu/|ThreadPool|ParallelFor|#pragma omp|<omp\.h>|immintrin' \
    "${dirs[@]}")
  if [ -n "$hits" ]; then
    echo "calls below the op layer (use an op of engine/ops with the layer's ExecContext):"
    echo "$hits"
    found=1
  fi
  # Host reads and writes of tensor elements.
  hits=$(grep -rnE '\.data<|std::(memcpy|memset|copy|fill)\b' "${dirs[@]}" |
    grep -vE "^($HOST_IO_FILES|$HOST_NUMBER_FILES):")
  if [ -n "$hits" ]; then
    echo "host access to tensor elements (compose ops; copy to the host with ops::CopyTensor):"
    echo "$hits"
    found=1
  fi
  return $found
)

self_test() {
  local dir status=0
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  local here
  here=$(cd "$(dirname "$0")/../.." && pwd)
  for plant in 'ops::Gemm(ctx_, {}); cpu::Gemm({});' 'DefaultThreadPool().ParallelFor(1, 1, f);' \
               '#pragma omp parallel for' 'float x = t.data<float>()[0];' \
               'std::memcpy(out.raw(), in.raw(), 64);'; do
    rm -rf "$dir/engine"
    mkdir -p "$dir/engine"
    cp -r "$here/engine/model" "$here/engine/moe" "$here/engine/train" "$here/engine/fp8" \
      "$dir/engine/"
    if ! check_tree "$dir" >/dev/null; then
      echo "self-test: the tree copy fails before anything was planted"
      return 1
    fi
    echo "$plant" >>"$dir/engine/moe/moe_layer.cc"
    if (check_tree "$dir" >/dev/null); then
      echo "self-test: a planted '$plant' was not caught"
      status=1
    fi
  done
  # The host-I/O files may read elements.
  rm -rf "$dir/engine" && mkdir -p "$dir/engine"
  cp -r "$here/engine/model" "$here/engine/moe" "$here/engine/train" "$here/engine/fp8" \
    "$dir/engine/"
  echo 'float x = t.data<float>()[0];' >>"$dir/engine/train/data.cc"
  if ! (check_tree "$dir" >/dev/null); then
    echo "self-test: element access in a data loader was refused"
    status=1
  fi
  [ $status -eq 0 ] && echo "self-test: every planted violation was caught"
  return $status
}

if [ "${1:-}" = "--self-test" ]; then
  self_test
  exit $?
fi
if [ $# -ne 1 ]; then
  echo "usage: layering_test.sh SOURCE_DIR | --self-test" >&2
  exit 2
fi
if check_tree "$1"; then
  echo "engine/model, engine/moe, engine/train and engine/fp8 compose ops only"
  exit 0
fi
exit 1
