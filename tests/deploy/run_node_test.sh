#!/usr/bin/env bash
# Runs one Node.js test of tests/deploy with the npm packages of its folder.
#
#   run_node_test.sh SOURCE_DIR WORK_DIR SCRIPT [ARGS...]
#
# SOURCE_DIR holds package.json and package-lock.json; the packages are installed with `npm ci`
# into WORK_DIR (a folder of the build tree, so the source tree stays clean), again only when the
# lock file changed. SCRIPT (relative to SOURCE_DIR) then runs with WORK_DIR/node_modules on
# NODE_PATH and WORK_DIR as the working directory. Exit code 77 (ctest's SKIP_RETURN_CODE) when
# Node.js itself is missing.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: run_node_test.sh SOURCE_DIR WORK_DIR SCRIPT [ARGS...]" >&2
  exit 2
fi
source_dir=$1
work_dir=$2
script=$3
shift 3

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "run_node_test.sh: node and npm are not installed: run scripts/setup.sh" >&2
  exit 77
fi

mkdir -p "$work_dir"
# ctest may run several tests of one folder at once: one installs, the others wait for it.
exec 9>"$work_dir/.npm-install.lock"
flock 9
if ! cmp -s "$source_dir/package-lock.json" "$work_dir/package-lock.json" ||
   [ ! -d "$work_dir/node_modules" ]; then
  cp "$source_dir/package.json" "$source_dir/package-lock.json" "$work_dir/"
  echo "run_node_test.sh: npm ci in $work_dir"
  if ! (cd "$work_dir" && npm ci --no-audit --no-fund --loglevel=error); then
    rm -f "$work_dir/package-lock.json"  # install again next time
    echo "run_node_test.sh: npm ci failed in $work_dir" >&2
    exit 1
  fi
fi
flock -u 9

cd "$work_dir"
NODE_PATH="$work_dir/node_modules" exec node "$source_dir/$script" "$@"
