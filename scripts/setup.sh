#!/usr/bin/env bash
# Installs the Debian packages moetrain needs to build and test. Idempotent: packages already
# installed are skipped, and nothing is printed unless something has to be installed or fails.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libdnnl-dev libgtest-dev nlohmann-json3-dev libssl-dev
  libprotobuf-dev protobuf-compiler libyaml-cpp-dev libcli11-dev libsqlite3-dev
  libgrpc++-dev protobuf-compiler-grpc  # proto/ moetrain_grpc: the coordinator and worker services
  libboost-dev  # server/http moetrain_http: /metrics, /healthz, /readyz on Boost.Beast (headers)
  libcpp-httplib-dev  # the tests' HTTP client (tests/server/http_server, tests/integration)
  prometheus-cpp-dev  # server/http metrics: the registry and text exposition (prometheus-cpp::core)
  prometheus  # promtool and the Prometheus server the metrics and service tests run
  openssl  # the TLS test certificates of tests/server/coordinator_server
  libgloo-dev  # engine/comm GlooCommunicator: collectives between CPU ranks over TCP
  chromium  # headless browser of the dashboard page test (tests/deploy)
  clang libclang-rt-dev  # tests/fuzz: libFuzzer, AddressSanitizer and UBSan for the fuzz targets
)
# Node.js runs the deploy tests (Kubernetes schema validation, the browser driver); their npm
# packages are installed by the tests into the build folder. A Node.js from elsewhere (with its
# own npm) is kept: Debian's npm package would conflict with it.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup.sh: missing packages (${missing[*]}) and not root, no sudo: install them first" >&2
  exit 1
fi

echo "setup.sh: installing ${missing[*]}"
log=$(mktemp)
if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
       "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup.sh: apt-get failed" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
