#!/usr/bin/env bash
# The main job: installs what Trident needs, builds it, and starts the whole
# disaggregated cluster on this machine (controller, attention service, a
# prefill and a decode worker, the router in front of them and a real
# Prometheus, all on 127.0.0.1). Stop it with `tools/up.sh down`.
#
#   tools/up.sh            start (or restart) the cluster, stream a sample
#                          generation through the router and show the
#                          cluster's status
#   tools/up.sh down       stop it
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
bazel build -c opt //tools/cli:trident
trident=bazel-bin/tools/cli/trident

if [ "${1:-}" = "down" ]; then
  exec "$trident" down
fi
# A cluster left from an earlier run is stopped first. Pass a Hugging Face
# model directory with TRIDENT_MODEL=DIR; the default is a small generated
# random-weight model (real tokens and real math, not meaningful text).
"$trident" down >/dev/null 2>&1 || true
"$trident" up ${TRIDENT_MODEL:+--model="$TRIDENT_MODEL"}
echo
echo "Streaming a sample generation through the router (prefill on worker-0, decode on worker-1):"
"$trident" generate "${TRIDENT_PROMPT:-Once upon a time, in a land far away,}" --max_tokens=48
echo
"$trident" status
