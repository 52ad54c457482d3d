#!/usr/bin/env bash
# Runs Trident's whole test suite on this machine, installing what it needs.
# It builds everything twice, with CUDA where nvcc is installed and with
# CUDA disabled (--config=cpu), then runs every test not tagged `gpu`; then
# the unit tests (every test outside tests/) again under AddressSanitizer and
# UndefinedBehaviorSanitizer, built in an output base of their own so that
# the plain build stays cached. Ends with the line "N passed, N failed"
# (test target runs, the sanitized ones counted apart from the plain ones).
#
#   tools/test.sh [extra bazel test flags]
#
# TRIDENT_SANITIZERS=0 skips the sanitized run.
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
count() { grep -cE "^//[^ ]+ +(\(cached\) )?$1" "$2"; }
bad='(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|FAILED TO BUILD)'
passed=$(count PASSED "$log")
failed=$(count "$bad" "$log")
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # The build or the run broke before any target reported.
fi
rm -f "$log"

if [ "${TRIDENT_SANITIZERS:-1}" != "0" ]; then
  echo "== ASan+UBSan: the unit tests (every test outside tests/)"
  # Its own output base, per checkout (the disk cache is shared), and no
  # bazel-* links: the plain build's stay as they are.
  san_base="${HOME}/.cache/trident-sanitizers/$(pwd -P | md5sum | cut -c1-16)"
  # The CUDA-only tests are incompatible with --config=cpu; requested by name
  # they would be errors.
  units=$(bazel query 'tests(//...) except tests(//tests/...) except tests(//kernels/cuda/...)' \
            2>/dev/null)
  san_log=$(mktemp)
  bazel --output_base="$san_base" test --symlink_prefix=/ --config=cpu --config=asan \
    --config=ubsan --test_tag_filters=-gpu,-benchmark --build_tests_only \
    --nocache_test_results --test_summary=short "$@" -- $units 2>&1 | tee "$san_log"
  san_status=${PIPESTATUS[0]}
  san_passed=$(count PASSED "$san_log")
  san_failed=$(count "$bad" "$san_log")
  if [ "$san_status" -ne 0 ] && [ "$san_failed" -eq 0 ]; then
    san_failed=1
  fi
  rm -f "$san_log"
  # The server of that output base is not needed again.
  bazel --output_base="$san_base" shutdown >/dev/null 2>&1 || true
  echo "ASan+UBSan: ${san_passed} passed, ${san_failed} failed"
  passed=$((passed + san_passed))
  failed=$((failed + san_failed))
  [ "$san_status" -eq 0 ] || status=1
fi

echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
