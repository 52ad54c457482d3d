#!/usr/bin/env bash
# Time to first token of a long prompt served disaggregated (router ->
# prefill worker -> KV over UCX, layer by layer while later layers compute ->
# decode worker) against the same prompt on one worker in role `both`
# (colocated), same model, same machine, same run. Also reports the time to
# the second token, which includes the hand-off: the rest of the transfer,
# the commit and the decode worker's first step.
#
#   bench/disagg_ttft.sh [MODEL_DIR] [PREFILL_DEVICE] [DECODE_DEVICE]
#
# Devices are worker --device values (cuda:0, cuda:1, cpu); with both on one
# GPU each worker gets half of its memory. MODEL_DIR (default
# /tmp/llama3-8b) is written with make_model's llama3-8b preset (random bf16
# weights) when it has no config.json. Environment: PROMPT_TOKENS (8192),
# NUM_REQUESTS (12, the first WARMUP_S seconds' requests left out),
# WARMUP_S (3), RATE (0.5 requests/s, spaced almost evenly so that requests
# never overlap), OUT (a directory for logs and JSON reports), BIN_DIR (the
# built programs; else bazel-bin, else PATH), DISAGG_FLAGS (more flags for
# the prefill and decode workers, e.g. --kv_lanes=1 or --kv_peer_lane=false),
# WORKER_FLAGS (more flags for every worker, e.g. --generated_weights),
# PLACED=1 (a third
# run: the decode worker with a CPU attention service on ATTENTION_THREADS
# (12) cores places every prompt there at reservation, and the prefill
# worker writes its KV there layer by layer instead of into GPU blocks).
set -euo pipefail
model_dir=${1:-/tmp/llama3-8b}
prefill_device=${2:-cuda:0}
decode_device=${3:-$prefill_device}
prompt=${PROMPT_TOKENS:-8192}
requests=${NUM_REQUESTS:-12}
warmup=${WARMUP_S:-3}
rate=${RATE:-0.5}
out=${OUT:-$(mktemp -d)}
bin=${BIN_DIR:-bazel-bin}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
ensure_model "$model_dir"
fraction=0.9
[[ "$prefill_device" == "$decode_device" ]] && fraction=0.44

stop_all_on_exit

worker() {
  local name=$1 role=$2 device=$3
  shift 3
  start "$name" "$(tool services/worker/worker)" --model="$model_dir" --role="$role" \
      --device="$device" --worker_id="$name" --gpu_memory_fraction="$fraction" \
      --max_batch_tokens="$prompt" --max_model_len=$((prompt + 64)) "$@" ${WORKER_FLAGS:-}
}

load() {
  local label=$1 port=$2
  "$(tool bench/loadgen/loadgen)" --target="127.0.0.1:$port" --rate="$rate" --arrival=gamma \
      --gamma_shape=100 --num_requests="$requests" --warmup_s="$warmup" \
      --prompt_tokens="fixed:$prompt" --output_tokens=fixed:2 --seed=1 --progress=false \
      --json_out="$out/$label.json" >"$out/$label.txt" 2>&1
  python3 - "$out/$label.json" "$label" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ttft, e2e = r["latency_ms"]["ttft"], r["latency_ms"]["e2e"]
q = r["requests"]
if q["completed"] != q["measured"] or q["failed"] or q["rejected"] or q["dropped"]:
    raise SystemExit(f"{sys.argv[2]}: not every request completed: {q}")
print(f"{sys.argv[2]:>14}: TTFT p50 {ttft['p50']:8.1f} ms  p90 {ttft['p90']:8.1f} ms   "
      f"second token (E2E of 2) p50 {e2e['p50']:8.1f} ms  p90 {e2e['p90']:8.1f} ms  "
      f"(n={ttft['count']})")
EOF
}

echo "model $model_dir, prompt $prompt tokens, prefill on $prefill_device, decode on $decode_device"
worker both both "$prefill_device" --kv_transport=none
load colocated "$PORT_both" | tee "$out/colocated.summary"
stop

read -r -a disagg_flags <<<"${DISAGG_FLAGS:-}"
worker prefill prefill "$prefill_device" "${disagg_flags[@]}"
worker decode decode "$decode_device" "${disagg_flags[@]}"
start router "$(tool services/router/router)" --model="$model_dir" \
    --prefill_workers="127.0.0.1:$PORT_prefill" --decode_workers="127.0.0.1:$PORT_decode" \
    --load_interval_ms=50 --admission=false --max_model_len=$((prompt + 64)) --log_level=debug
load disaggregated "$PORT_router" | tee "$out/disaggregated.summary"
grep -h "lane" "$out"/prefill.log "$out"/decode.log | head -3 || true
if [[ "${PLACED:-0}" == 1 ]]; then
  stop  # router
  stop  # decode
  start attention "$(tool services/attention/attention)" \
      --kv_budget_mb=$(( (prompt + 64) * 256 >> 10 )) --threads="${ATTENTION_THREADS:-12}"
  worker decode decode "$decode_device" "${disagg_flags[@]}" \
      --attention_services="127.0.0.1:$PORT_attention" --offload_min_context_tokens=1
  start router "$(tool services/router/router)" --model="$model_dir" \
      --prefill_workers="127.0.0.1:$PORT_prefill" --decode_workers="127.0.0.1:$PORT_decode" \
      --load_interval_ms=50 --admission=false --max_model_len=$((prompt + 64)) --log_level=debug
  load placed "$PORT_router" | tee "$out/placed.summary"
  echo "placed at the service: $(grep -c 'placed request' "$out/decode.log" || true) requests;" \
      "prompt-writer sessions: $(grep -c 'writing CPU-placed prompts' "$out/prefill.log" || true)"
  python3 - "$out/disaggregated.json" "$out/placed.json" <<'EOF'
import json, sys
def p50(path, name):
    return json.load(open(path))["latency_ms"][name]["p50"]
d, p = p50(sys.argv[1], "ttft"), p50(sys.argv[2], "ttft")
d2, p2 = p50(sys.argv[1], "e2e"), p50(sys.argv[2], "e2e")
print(f"placed on the CPU vs GPU decode: TTFT p50 {p:.1f} vs {d:.1f} ms; "
      f"second token p50 {p2:.1f} vs {d2:.1f} ms")
EOF
fi
python3 - "$out/colocated.json" "$out/disaggregated.json" <<'EOF'
import json, sys
def p50(path, name):
    return json.load(open(path))["latency_ms"][name]["p50"] / 1e3
c, d = p50(sys.argv[1], "ttft"), p50(sys.argv[2], "ttft")
c2, d2 = p50(sys.argv[1], "e2e"), p50(sys.argv[2], "e2e")
print(f"TTFT overhead of disaggregation: {100*(d/c-1):+.1f}% (p50 {d*1e3:.1f} vs {c*1e3:.1f} ms); "
      f"second token: {100*(d2/c2-1):+.1f}% (p50 {d2*1e3:.1f} vs {c2*1e3:.1f} ms)")
EOF
# The router's per-request timeline (debug log), from the decision: first
# token, KV transfer done, second token.
python3 - "$out/router.log" <<'EOF'
import re, statistics, sys
rows = [l for l in open(sys.argv[1]) if "actual ttft_ms" in l]
def ms(name):
    found = (re.search(name + r" ([0-9.]+)", l) for l in rows)
    v = [float(m.group(1)) for m in found if m]
    return statistics.median(v) if v else float("nan")
print(f"router timeline p50 over {len(rows)} requests: first token {ms('actual ttft_ms'):.1f} ms, "
      f"transfer done {ms('transfer_done_ms'):.1f} ms, second token {ms('second_token_ms'):.1f} ms")
EOF
echo "logs and reports in $out"
