#!/usr/bin/env bash
# scripts/runtime-deps.sh on the binaries the build made, as the image build runs it: every
# library they load must come from a package it prints or from one every base image has (checked
# here with dpkg -L, independently of the script's dpkg -S). Then a program with a library no
# package owns, and one whose library is missing: both must fail, naming the library.
#
#   runtime_deps_test.sh REPO_DIR BIN_DIR [PROVIDED_DIR]
#
# PROVIDED_DIR: where this machine has libraries from outside the package manager (a CUDA toolkit
# unpacked from NVIDIA's archive); the CUDA images get them as packages.
set -euo pipefail

repo=$1
bin=$2
provided=${3:-}
script=$repo/scripts/runtime-deps.sh
binaries=("$bin/moetrain" "$bin/moetrain-coordinator" "$bin/moetrain-worker")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "runtime_deps_test.sh: not a dpkg system; the image build runs on one" >&2
  exit 77
fi

args=()
[ -z "$provided" ] || args=(--provided-by "$provided")
"$script" "${args[@]}" "${binaries[@]}" >"$scratch/packages" 2>"$scratch/stderr" ||
  fail "runtime-deps.sh failed: $(cat "$scratch/stderr")"
echo "runtime packages of the three binaries:"
sed 's/^/  /' "$scratch/packages"
[ -s "$scratch/packages" ] || fail "it printed no package"
[ "$(sort -u "$scratch/packages")" = "$(cat "$scratch/packages")" ] ||
  fail "the list is not sorted and unique"

# Every printed package is installed here, and the base set is what a minimal image has.
while read -r package; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null | grep -q '^ii' ||
    fail "it printed $package, which is not installed"
done <"$scratch/packages"
for package in libc6 libgcc-s1 libstdc++6; do
  ! grep -qx "$package" "$scratch/packages" || fail "it printed $package, which every base image has"
done

# Independently: the files of the printed packages, plus the Essential packages, apt and their
# dependencies as `apt-cache depends --recurse` sees them, cover every library ldd lists.
mapfile -t essential < <(dpkg-query -W -f='${db:Status-Abbrev} ${Essential} ${Package}\n' |
  awk '$1 ~ /^ii/ && $2 == "yes" { print $3 }')
mapfile -t base < <(apt-cache depends --recurse --installed --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${essential[@]}" apt 2>/dev/null |
  grep -v '^ ' | sed 's/:.*//' | sort -u)
mapfile -t printed <"$scratch/packages"
for package in "${printed[@]}" "${base[@]}"; do
  dpkg-query -L "$package" 2>/dev/null || true
done | grep -E '\.so(\.|$)' | while read -r file; do
  [ -e "$file" ] && readlink -f "$file"
done | sort -u >"$scratch/files"
missing=0
for binary in "${binaries[@]}"; do
  while read -r library; do
    [ -n "$library" ] || continue
    case $library in "$provided"/*) [ -n "$provided" ] && continue ;; esac
    if ! grep -qxF "$(readlink -f "$library")" "$scratch/files"; then
      echo "FAIL: $(basename "$binary") loads $library, from none of the packages" >&2
      missing=1
    fi
  done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
done
[ $missing -eq 0 ] || exit 1

# A library that no package owns, then one the loader cannot find.
cat >"$scratch/lib.c" <<'EOF'
int moetrain_test_value(void) { return 7; }
EOF
cat >"$scratch/main.c" <<'EOF'
int moetrain_test_value(void);
int main(void) { return moetrain_test_value() == 7 ? 0 : 1; }
EOF
if ! command -v cc >/dev/null 2>&1; then
  echo "no C compiler: the failure cases are not checked" >&2
  exit 0
fi
mkdir "$scratch/lib"
cc -shared -fPIC -o "$scratch/lib/libmoetraintest.so" "$scratch/lib.c"
cc -o "$scratch/program" "$scratch/main.c" -L"$scratch/lib" -lmoetraintest -Wl,-rpath,"$scratch/lib"
"$scratch/program" || fail "the test program does not run"

if "$script" "$scratch/program" >/dev/null 2>"$scratch/stderr"; then
  fail "a library owned by no package was accepted"
fi
grep -q "libmoetraintest.so (needed by program) belongs to no installed package" "$scratch/stderr" ||
  fail "the unowned library is not named: $(cat "$scratch/stderr")"

"$script" --provided-by "$scratch/lib" "$scratch/program" >"$scratch/packages" 2>"$scratch/stderr" ||
  fail "--provided-by did not leave the library out: $(cat "$scratch/stderr")"
grep -q "libmoetraintest.so: provided by the base image" "$scratch/stderr" ||
  fail "--provided-by does not say what it left out"

rm "$scratch/lib/libmoetraintest.so"
if "$script" "$scratch/program" >/dev/null 2>"$scratch/stderr"; then
  fail "a missing library was accepted"
fi
grep -q "program needs libmoetraintest.so, which the loader does not find" "$scratch/stderr" ||
  fail "the missing library is not named: $(cat "$scratch/stderr")"

if "$script" >/dev/null 2>&1; then fail "no arguments were accepted"; fi
echo "ok"
