#!/usr/bin/env bash
# Builds a trident_cc_fuzzer target with clang + libFuzzer + ASan/UBSan and runs it.
#
#   tools/fuzz.sh //common/model:safetensors_header_fuzzer [seconds]
#
# The build uses its own output base ($HOME/.cache/trident-fuzz-base, override
# with TRIDENT_FUZZ_OUTPUT_BASE) so the normal gcc build's cache is untouched,
# and creates no bazel-* symlinks in the workspace. The seed corpus
# <package>/testdata/fuzz/<name without _fuzzer>/ (override with FUZZ_CORPUS)
# is copied to a scratch directory, which also receives new inputs and crash
# artifacts; the checkout is never written. Runs for <seconds> (default 60),
# prints libFuzzer's final stats, and exits non-zero if the fuzzer found a
# crash (or failed to build). Extra libFuzzer flags: FUZZ_FLAGS="-jobs=1 ...".
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" != //*:* ]]; then
  echo "usage: $0 //package:fuzzer_target [seconds]" >&2
  exit 2
fi
target="$1"
seconds="${2:-60}"
if ! [[ "${seconds}" =~ ^[0-9]+$ ]]; then
  echo "$0: seconds must be a whole number, got '${seconds}'" >&2
  exit 2
fi

cd "$(dirname "$0")/.."
output_base="${TRIDENT_FUZZ_OUTPUT_BASE:-${HOME}/.cache/trident-fuzz-base}"
bazel_fuzz=(bazel "--output_base=${output_base}")
build_flags=(--config=fuzz --jobs=2 --symlink_prefix=/)

"${bazel_fuzz[@]}" build "${build_flags[@]}" "${target}"
bin_dir="$("${bazel_fuzz[@]}" info "${build_flags[@]}" bazel-bin 2>/dev/null)"

package="${target#//}"
package="${package%%:*}"
name="${target##*:}"
binary="${bin_dir}/${package}/${name}"
if [[ ! -x "${binary}" ]]; then
  echo "$0: built ${target} but found no binary at ${binary}" >&2
  exit 1
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/trident-fuzz-${name}.XXXXXX")"
mkdir -p "${scratch}/corpus" "${scratch}/artifacts"
seeds="${FUZZ_CORPUS:-${package}/testdata/fuzz/${name%_fuzzer}}"
if [[ -d "${seeds}" ]]; then
  cp -r "${seeds}/." "${scratch}/corpus/"
else
  echo "$0: no seed corpus at ${seeds}; starting empty" >&2
fi

echo "fuzzing ${target} for ${seconds}s; corpus, log and artifacts in ${scratch}" >&2
set +e
# shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags.
"${binary}" -max_total_time="${seconds}" -print_final_stats=1 \
  -artifact_prefix="${scratch}/artifacts/" ${FUZZ_FLAGS:-} "${scratch}/corpus" \
  >"${scratch}/fuzz.log" 2>&1
status=$?
set -e

# The last progress line ("#N DONE cov: ... exec/s: ...") and the summary.
grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "${scratch}/fuzz.log" | tail -n 1 || true
grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "${scratch}/fuzz.log" || true

if [[ "${TRIDENT_FUZZ_KEEP_SERVER:-0}" != 1 ]]; then
  "${bazel_fuzz[@]}" shutdown >/dev/null 2>&1 || true
fi

if [[ ${status} -ne 0 ]]; then
  echo "FUZZER FAILED (exit ${status}); last lines of ${scratch}/fuzz.log:" >&2
  tail -n 40 "${scratch}/fuzz.log" >&2
  ls -l "${scratch}/artifacts" >&2
  exit 1
fi
echo "no crash in ${seconds}s" >&2
