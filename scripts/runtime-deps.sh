#!/usr/bin/env bash
# Prints the packages a runtime image must install to run the given binaries: the owners of the
# shared libraries they load, one name a line, sorted. The build stage of deploy/docker runs it on
# the binaries it built, and the runtime stage installs what it printed, so the list follows the
# build instead of being kept by hand.
#
#   scripts/runtime-deps.sh [--provided-by DIR]... BINARY...
#
# Libraries are found with ldd and mapped to packages with dpkg -S. The packages every Debian and
# Ubuntu base image has (the Essential ones, apt, and what they depend on) are left out.
# --provided-by DIR: libraries under DIR come from elsewhere (say, a CUDA toolkit unpacked outside
# the package manager, that the runtime base image provides); they are named on stderr and left
# out. Exit 1, naming each, when a library is not found or no installed package owns it; exit 2
# for bad usage.
set -euo pipefail

usage() {
  echo "usage: runtime-deps.sh [--provided-by DIR]... BINARY..." >&2
  exit 2
}

provided=()
binaries=()
while [ $# -gt 0 ]; do
  case $1 in
    --provided-by) [ $# -ge 2 ] || usage; provided+=("${2%/}"); shift 2 ;;
    -*) usage ;;
    *) binaries+=("$1"); shift ;;
  esac
done
[ ${#binaries[@]} -gt 0 ] || usage

# Every candidate name a library may be registered under with dpkg: on a merged-/usr system ldd
# reports /lib/x where dpkg may know /usr/lib/x (or the reverse), and the soname link may be the
# only one of the link and its target that dpkg knows.
candidates() {
  local c
  for c in "$1" "$(readlink -f "$1")"; do
    echo "$c"
    case $c in
      /usr/lib/* | /usr/lib64/*) echo "${c#/usr}" ;;
      /lib/* | /lib64/*) echo "/usr$c" ;;
    esac
  done
}

# The packages in every Debian and Ubuntu base image: the Essential ones, apt, and everything they
# depend on, among the installed packages.
base_packages() {
  dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Essential}\t${Pre-Depends}, ${Depends}\n' |
    awk -F'\t' '
      $1 ~ /^ii/ { deps[$2] = $4; if ($3 == "yes" || $2 == "apt") queue[++n] = $2; seen[$2] = ($3 == "yes" || $2 == "apt") }
      END {
        for (i = 1; i <= n; i++) {
          count = split(deps[queue[i]], list, /[,|]/)
          for (j = 1; j <= count; j++) {
            name = list[j]; sub(/\(.*/, "", name); gsub(/[ \t]/, "", name); sub(/:.*/, "", name)
            if (name != "" && (name in deps) && !seen[name]) { seen[name] = 1; queue[++n] = name }
          }
        }
        for (name in seen) if (seen[name]) print name
      }'
}

failed=0
declare -A needed_by=()  # library path → the first binary that needs it
for binary in "${binaries[@]}"; do
  if [ ! -f "$binary" ]; then
    echo "runtime-deps.sh: $binary: no such file" >&2
    failed=1
    continue
  fi
  if ! listing=$(ldd "$binary" 2>&1); then
    echo "runtime-deps.sh: $binary: ldd failed: $listing" >&2
    failed=1
    continue
  fi
  while read -r line; do
    # "libx.so.1 => /path (0x...)", "libx.so.1 => not found", "/lib64/ld-linux... (0x...)",
    # "linux-vdso.so.1 (0x...)" (in the kernel, no file).
    case $line in
      *'=> not found'*)
        echo "runtime-deps.sh: $(basename "$binary") needs ${line%% *}, which the loader does not find" >&2
        failed=1
        continue ;;
      *' => '/*) file=${line#* => }; file=${file%% (*} ;;
      /*) file=${line%% (*} ;;
      *) continue ;;
    esac
    skip=
    for dir in "${provided[@]}"; do
      case $file in "$dir"/*) skip=1 ;; esac
      case $(readlink -f "$file") in "$(readlink -f "$dir")"/*) skip=1 ;; esac
    done
    if [ -n "$skip" ]; then
      [ -n "${needed_by[$file]:-}" ] ||
        echo "runtime-deps.sh: $file: provided by the base image (--provided-by)" >&2
      needed_by[$file]=provided
      continue
    fi
    [ -n "${needed_by[$file]:-}" ] || needed_by[$file]=$(basename "$binary")
  done <<<"$listing"
done

# One dpkg-query for all the names (it reads its whole database each time): lines
# "pkg[:arch][, pkg2...]: /path"; diversions print other lines.
declare -A owner_of=()
libraries=()
for file in "${!needed_by[@]}"; do
  [ "${needed_by[$file]}" = provided ] || libraries+=("$file")
done
if [ ${#libraries[@]} -gt 0 ]; then
  mapfile -t names < <(for file in "${libraries[@]}"; do candidates "$file"; done | sort -u)
  while IFS= read -r line; do
    case $line in diver*) continue ;; esac
    path=${line##*: }
    package=${line%%: /*}
    package=${package%%,*}
    owner_of[$path]=${package%%:*}
  done < <(dpkg-query -S "${names[@]}" 2>/dev/null || true)
fi

declare -A packages=()
for file in "${libraries[@]}"; do
  package=
  while read -r name; do
    if [ -n "${owner_of[$name]:-}" ]; then package=${owner_of[$name]}; break; fi
  done < <(candidates "$file")
  if [ -z "$package" ]; then
    echo "runtime-deps.sh: $file (needed by ${needed_by[$file]}) belongs to no installed package" >&2
    failed=1
    continue
  fi
  packages[$package]=1
done

[ $failed -eq 0 ] || exit 1
declare -A base=()
while read -r package; do base[$package]=1; done < <(base_packages)
for package in "${!packages[@]}"; do
  [ -n "${base[$package]:-}" ] || echo "$package"
done | LC_ALL=C sort
