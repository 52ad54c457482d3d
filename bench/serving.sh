#!/usr/bin/env bash
# Serving through the router on one GPU, colocated: one worker in role both
# (no KV transport: the router runs each request there in one Decode call),
# ShareGPT-like lengths (lognormal prompts, median 150 tokens, sigma 1;
# outputs median 120, sigma 0.8; both clipped to [16, 1024]; generated
# exactly), Poisson arrivals at each of RATES for PHASE_S seconds (the first
# WARMUP_S left out), admission off (every request is served: the sweep
# shows where latency gives). Prints per rate the requests served, output
# tokens/s, TTFT, TPOT and ITL p50/p90/p99 and goodput at the stated SLOs,
# and the worker's decode graphs: captured at start-up, captured since
# (must stay 0), replayed, and steps that had none. Where gnuplot is
# installed, bench/plot_serving.sh then draws goodput against rate and the
# TTFT and TPOT CDFs into OUT.
#
#   bench/serving.sh [MODEL_DIR] [DEVICE]
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json. Environment:
# RATES ("2 8 32"), PHASE_S (40), WARMUP_S (5), TTFT_SLO_MS (300),
# TPOT_SLO_MS (25), SEED (20261128), OUT (logs and JSON reports), BIN_DIR
# (the built programs; else bazel-bin, else PATH), WORKER_FLAGS (extra
# worker flags).
set -euo pipefail
model_dir=${1:-/tmp/llama3-8b}
device=${2:-cuda:0}
rates=${RATES:-2 8 32}
phase=${PHASE_S:-40}
warmup=${WARMUP_S:-5}
ttft_slo=${TTFT_SLO_MS:-300}
tpot_slo=${TPOT_SLO_MS:-25}
seed=${SEED:-20261128}
out=${OUT:-$(mktemp -d)}
bin=${BIN_DIR:-bazel-bin}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
ensure_model "$model_dir"
stop_all_on_exit

sharegpt_lengths "$out/lengths.csv" "$seed" 8192

# shellcheck disable=SC2086
start worker "$(tool services/worker/worker)" --model="$model_dir" --role=both \
    --device="$device" --worker_id=worker --gpu_memory_fraction=0.9 --max_model_len=2048 \
    ${WORKER_FLAGS:-}
graphs_at_start=$(metric "$METRICS_worker" trident_worker_cuda_graphs)
start router "$(tool services/router/router)" --model="$model_dir" \
    --workers="127.0.0.1:$PORT_worker" --admission=false --max_model_len=2048
grep -h "decode graphs at start-up" "$out/worker.log" || true
echo "model $model_dir on $device, colocated behind the router, ${phase} s a rate" \
    "(first ${warmup} s left out), SLO TTFT ${ttft_slo} ms / TPOT ${tpot_slo} ms"
printf '%-6s %6s %8s %20s %20s %20s %9s %9s\n' rate served "tok/s" \
    "TTFT p50/p90/p99" "TPOT p50/p90/p99" "ITL p50/p90/p99" goodput "ITL p99/p50"
for rate in $rates; do
  label="rate$rate"
  "$(tool bench/loadgen/loadgen)" --target="127.0.0.1:$PORT_router" --rate="$rate" \
      --duration_s="$phase" --warmup_s="$warmup" --prompt_tokens="csv:$out/lengths.csv" \
      --output_tokens="csv:$out/lengths.csv" --ttft_slo_ms="$ttft_slo" \
      --tpot_slo_ms="$tpot_slo" --seed="$seed" --progress=false \
      --json_out="$out/$label.json" --requests_csv="$out/$label.csv" >"$out/$label.txt" 2>&1
  python3 - "$out/$label.json" "$rate" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
q, lat = r["requests"], r["latency_ms"]
f = lambda k: "/".join(f"{lat[k][p]:.1f}" for p in ("p50", "p90", "p99"))
good = r["throughput"]["goodput_rps"]
tput = r["throughput"]["output_tokens_per_s"]
print(f"{sys.argv[2]:<6} {q['completed']:6d} {tput:8.0f} {f('ttft'):>20} "
      f"{f('tpot'):>20} {f('itl'):>20} {good:9.1f} "
      f"{lat['itl']['p99'] / max(1e-9, lat['itl']['p50']):9.2f}"
      + (f"  ({q['failed']} failed)" if q["failed"] else ""))
EOF
done | tee "$out/summary.txt"
echo "decode graphs: $graphs_at_start at start-up," \
    "$(metric "$METRICS_worker" trident_worker_cuda_graphs) now;" \
    "$(metric "$METRICS_worker" trident_worker_cuda_graph_replays_total) steps replayed," \
    "$(metric "$METRICS_worker" trident_worker_cuda_graph_misses_total) without a graph" |
    tee -a "$out/summary.txt"
if command -v gnuplot >/dev/null; then
  "$(dirname "$0")/plot_serving.sh" "$out" "colocated, $(basename "$model_dir") on $device"
fi
