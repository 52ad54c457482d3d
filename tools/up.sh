#!/usr/bin/env bash
# The main job: installs what Trident needs, builds it, and starts the whole
# cluster on this machine (controller, attention service, workers, router and
# a real Prometheus, all on 127.0.0.1). Stop it with `tools/up.sh down`.
#
#   tools/up.sh            start (or restart) the cluster and show its status
#   tools/up.sh down       stop it
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
bazel build -c opt //tools/cli:trident
trident=bazel-bin/tools/cli/trident

if [ "${1:-}" = "down" ]; then
  exec "$trident" down
fi
# A cluster left from an earlier run is stopped first.
"$trident" down >/dev/null 2>&1 || true
"$trident" up --workers=prefill,decode
echo
"$trident" status
