#!/usr/bin/env bash
# Runs Trident's whole test suite on this machine, installing what it needs.
# It builds everything twice, with CUDA where nvcc is installed and with
# CUDA disabled (--config=cpu), then runs every test not tagged `gpu`.
# Ends with the line "N passed, N failed" (test targets).
#
#   tools/test.sh [extra bazel test flags]
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  echo "== bazel build //... (CUDA targets built with nvcc)"
else
  echo "== bazel build //... (no nvcc here: CUDA targets skipped)"
fi
bazel build //... || { echo "0 passed, 1 failed"; exit 1; }

echo "== bazel build --config=cpu //... (CUDA disabled: CUDA targets skipped)"
bazel build --config=cpu //... || { echo "0 passed, 1 failed"; exit 1; }

echo "== bazel test (every test not tagged gpu)"
log=$(mktemp)
# --nocache_test_results: every run executes every test, even where a clone
# sharing the disk cache already ran the same binaries.
bazel test //... --test_tag_filters=-gpu,-benchmark --build_tests_only \
  --nocache_test_results --test_summary=short "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# Bazel prints one summary line per test target.
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|FAILED TO BUILD)' "$log")
rm -f "$log"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # The build or the run broke before any target reported.
fi
echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
