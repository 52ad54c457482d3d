#!/usr/bin/env bash
# promtool accepts the Prometheus configuration and its rules.
set -euo pipefail
dir="$(dirname "$0")"
if [ -d "${TEST_SRCDIR:-}/trident/deploy/prometheus" ]; then dir="$TEST_SRCDIR/trident/deploy/prometheus"; fi
promtool check config "$dir/prometheus.yml"
promtool check rules "$dir/trident-rules.yml"
promtool test rules "$dir/trident-rules_test.yml"
