#!/usr/bin/env bash
# Installs every Debian package Trident builds, tests and runs with. Safe to
# run again: it installs only what is missing, and does nothing (not even an
# `apt-get update`) when everything is present.
#
#   tools/bootstrap.sh            # as root, or with sudo available
set -euo pipefail

PACKAGES=(
  # Build: Bazel (offline, with the shims in third_party/bazel_shims) and a C++20 compiler.
  bazel-bootstrap g++ python3
  # gRPC, protobuf and their code generators; the standard health/reflection protos.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  # Libraries.
  libabsl-dev libnuma-dev numactl libucx-dev ucx-utils libdnnl-dev prometheus-cpp-dev
  libcurl4-openssl-dev nlohmann-json3-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # The Prometheus server that `trident up` starts and the tests query.
  prometheus
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi

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
echo "bootstrap: done"
