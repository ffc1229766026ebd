#!/usr/bin/env bash
# The Dockerfiles of deploy/docker against the repository, since no Docker engine builds them
# here: what they COPY and RUN exists, they configure CMake as the Makefile does, they build and
# copy exactly the binaries CMake makes, base images are pinned, the runtime user is not root, the
# CUDA and CPU files take the same steps, and the Kubernetes overlays use the tags they document.
#
#   dockerfile_test.sh REPO_DIR BIN_DIR
set -euo pipefail

repo=$1
bin=$2
binaries=(moetrain moetrain-coordinator moetrain-worker)
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
words() { tr '\n' ' ' <<<"$1" | sed 's/ $//'; }  # a list on one line, for messages

# A Dockerfile as instructions: continuation lines joined, comments and blank lines dropped.
instructions() {
  sed -e '/^[[:space:]]*#/d' "$1" | sed -e ':a' -e '/\\$/{N;s/\\\n[[:space:]]*/ /;ba' -e '}' |
    sed -e '/^[[:space:]]*$/d' -e 's/[[:space:]]\+/ /g'
}

# The Makefile's configure and build recipes, with its variables as the Dockerfiles spell them.
make_configure=$(grep -E '^\s+cmake -S ' "$repo/Makefile" | sed -e 's/^[[:space:]]*//' \
  -e 's/\$(BUILD_DIR)/build/g' -e 's/\$(CMAKE_FLAGS)/${CMAKE_FLAGS}/g')
make_build=$(grep -E '^\s+cmake --build ' "$repo/Makefile" | sed -e 's/^[[:space:]]*//' \
  -e 's/\$(BUILD_DIR)/build/g' -e 's/ -j \$(JOBS)//')
if [ -z "$make_configure" ] || [ -z "$make_build" ]; then fail "no cmake commands found in the Makefile"; fi
version=$(sed -n 's/^project(moetrain VERSION \([0-9.]*\).*/\1/p' "$repo/CMakeLists.txt")

for name in "${binaries[@]}"; do
  [ -x "$bin/$name" ] || fail "$bin/$name: CMake did not build it"
  grep -rqE "add_executable\(${name}[ )]" "$repo"/*/CMakeLists.txt ||
    fail "no add_executable($name) in the CMake files"
done

declare -A variant_flag=([Dockerfile]=ON [Dockerfile.cpu]=OFF)
for file in Dockerfile Dockerfile.cpu; do
  path=$repo/deploy/docker/$file
  [ -f "$path" ] || { fail "$path is missing"; continue; }
  text=$(instructions "$path")
  stages=()
  while read -r _ image _ stage; do
    if [[ " ${stages[*]} " != *" $image "* ]]; then
      [[ $image =~ :[A-Za-z0-9._-]*[0-9][A-Za-z0-9._-]*$ ]] || fail "$file: FROM $image: not pinned to a version tag"
      [[ $image != *:latest ]] || fail "$file: FROM $image: the tag latest"
    fi
    [ -z "$stage" ] || stages+=("$stage")
  done < <(grep -E '^FROM ' <<<"$text" | sed -E 's/^FROM (--[^ ]+ )*//' | awk '{print "FROM", $1, $2, $3}')
  for role in build runtime cli worker coordinator; do
    [[ " ${stages[*]} " == *" $role "* ]] || fail "$file: no stage '$role'"
  done

  # COPY from the build context: every source exists.
  while read -r line; do
    read -ra words <<<"${line#COPY }"
    for source in "${words[@]:0:${#words[@]}-1}"; do
      [ -e "$repo/$source" ] || fail "$file: COPY $source: not in the repository"
    done
  done < <(grep -E '^COPY ' <<<"$text" | grep -v -- '--from=')
  # Scripts it runs exist and are executable.
  for script in $(grep -E '^RUN ' <<<"$text" | grep -oE 'scripts/[A-Za-z0-9_.-]+' | sort -u); do
    [ -x "$repo/$script" ] || fail "$file: runs $script, which is not an executable file"
  done
  grep -qxF "RUN scripts/setup.sh" <<<"$text" || fail "$file: does not run scripts/setup.sh"

  # CMake as the Makefile runs it; CUDA on or off as the variant says.
  grep -qF -- "$make_configure" <<<"$text" || fail "$file: does not configure with '$make_configure'"
  grep -qF -- "$make_build" <<<"$text" || fail "$file: does not build with '$make_build'"
  grep -qxF "ARG CMAKE_FLAGS=-DMOETRAIN_WITH_CUDA=${variant_flag[$file]}" <<<"$text" ||
    fail "$file: CMAKE_FLAGS is not -DMOETRAIN_WITH_CUDA=${variant_flag[$file]}"
  grep -qE '^option\(MOETRAIN_WITH_CUDA ' "$repo/CMakeLists.txt" || fail "CMakeLists.txt has no option MOETRAIN_WITH_CUDA"

  # The binaries built, handed to runtime-deps.sh and copied out are the three CMake makes.
  expected=$(printf '%s\n' "${binaries[@]}" | sort)
  built=$(grep -oE 'cmake --build build --target [a-z -]+' <<<"$text" | sed 's/.*--target //' | tr ' ' '\n' |
    sed '/^$/d' | sort)
  [ "$built" = "$expected" ] || fail "$file: builds '$(words "$built")', not '$(words "$expected")'"
  resolved=$(grep -E 'runtime-deps.sh' <<<"$text" | grep -oE 'build/bin/[a-z-]+' | sed 's|build/bin/||' | sort)
  [ "$resolved" = "$expected" ] || fail "$file: runtime-deps.sh sees '$(words "$resolved")'"
  copied=$(grep -E '^COPY --from=build ' <<<"$text" | grep -oE '/src/build/bin/[a-z-]+' | sed 's|.*/||' | sort)
  [ "$copied" = "$expected" ] || fail "$file: copies '$(words "$copied")' into the image"
  grep -qE '^RUN apt-get update .*xargs -a /usr/share/moetrain/runtime-packages .*apt-get install' <<<"$text" ||
    fail "$file: the runtime stage does not install what runtime-deps.sh printed"

  # One entry point per role; a numeric user that is not root.
  for pair in cli:moetrain worker:moetrain-worker coordinator:moetrain-coordinator; do
    stage=${pair%%:*}
    entry=$(awk -v s="$stage" '/^FROM /{cur=$NF} cur==s && /^ENTRYPOINT /' <<<"$text")
    [ "$entry" = "ENTRYPOINT [\"${pair#*:}\"]" ] || fail "$file: stage $stage: '$entry'"
  done
  user=$(grep -E '^USER ' <<<"$text" | tail -n 1 | awk '{print $2}')
  [[ ${user%%:*} =~ ^[0-9]+$ && ${user%%:*} -ne 0 ]] || fail "$file: USER '$user' is not a numeric non-root user"
done

# The CUDA and CPU files take the same steps: they differ in base images, CMAKE_FLAGS and the lines
# that bring in CUDA (each of which names CUDA or NVIDIA).
strip_variant() {
  instructions "$1" | grep -vE '^(FROM [^ ]+ AS (build|runtime)|ARG CMAKE_FLAGS=)' | grep -viE 'cuda|nvidia'
}
if ! diff <(strip_variant "$repo/deploy/docker/Dockerfile") \
          <(strip_variant "$repo/deploy/docker/Dockerfile.cpu") >/dev/null; then
  fail "Dockerfile and Dockerfile.cpu differ beyond their base images and CMAKE_FLAGS:"
  diff <(strip_variant "$repo/deploy/docker/Dockerfile") \
       <(strip_variant "$repo/deploy/docker/Dockerfile.cpu") >&2 || true
fi

# The build context leaves out local builds and the git history.
for pattern in .git build '**/node_modules'; do
  grep -qxF "$pattern" "$repo/.dockerignore" 2>/dev/null || fail ".dockerignore does not leave out $pattern"
done

# The overlays deploy the tags the images are built with: VERSION-cpu and VERSION-cuda.
for pair in cpu:cpu gpu:cuda; do
  kustomization=$repo/deploy/k8s/overlays/${pair%%:*}/kustomization.yaml
  tags=$(sed -n 's/^[[:space:]]*newTag:[[:space:]]*//p' "$kustomization" | sort -u)
  [ "$tags" = "$version-${pair#*:}" ] || fail "$kustomization: image tags '$(words "$tags")', not '$version-${pair#*:}'"
done

[ $failures -eq 0 ] || { echo "$failures failures" >&2; exit 1; }
echo "ok: deploy/docker/Dockerfile and Dockerfile.cpu match the Makefile, CMake and the overlays"
