#!/usr/bin/env bash
# SLO admission under overload, with its precise figures: 2 prefill + 2
# decode CPU workers behind a router, open-loop Poisson arrivals at twice the
# cluster's measured capacity, admission on and then off on the same
# schedule (tests/testing/overload_scenario.h). Prints each phase's report
# and a SUMMARY: SLO attainment and goodput with and without admission,
# rejection latency. //tests:overload_test runs the same scenario and
# asserts only what holds on any machine.
#
#   bench/overload.sh [RUNS]      (default 1; each run ~1.5 min)
#
# Environment: SEED (20240611; run k uses SEED + k - 1), OVERLOAD_FACTOR (2),
# OVERLOAD_SECONDS (15), OUT (a directory for logs; default a temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
seed=${SEED:-20240611}
out=${OUT:-$(mktemp -d)}
# CPU workers: the CUDA backend is not needed (--config=cpu).
bazel build -c opt --config=cpu //bench/overload //services/router //services/worker >&2
for ((k = 0; k < runs; k++)); do
  dir="$out/run-$k"
  mkdir -p "$dir"
  echo "== run $((k + 1)) of $runs, seed $((seed + k)), logs in $dir" >&2
  bazel-bin/bench/overload/overload --worker_bin=bazel-bin/services/worker/worker \
    --router_bin=bazel-bin/services/router/router --scratch_dir="$dir" \
    --seed=$((seed + k)) --overload_factor="${OVERLOAD_FACTOR:-2}" \
    --overload_seconds="${OVERLOAD_SECONDS:-15}" | tee "$dir/report.txt" | sed -n '/^SUMMARY/,$p'
done
