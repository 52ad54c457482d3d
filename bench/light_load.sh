#!/usr/bin/env bash
# False rejections below saturation, on GPUs: one prefill and one decode
# worker behind the router with admission on, ShareGPT-like lengths
# (lognormal prompts, median 150 tokens, sigma 1; outputs median 120, sigma
# 0.8; both clipped to [16, 1024]), Poisson arrivals at each of RATES for
# PHASE_S seconds. The router is started afresh for each phase (cold cost
# models, as after a deploy) and each TTFT calibration: the fixed-factor one
# (--admission_learn_ttft_overhead=false) and the one that learns each
# worker's fixed TTFT overhead (true), on the same schedule (same seed). Far
# below saturation every request can meet its targets, so a refusal there
# is a false one. Prints, per rate and calibration, the requests refused and
# the SLO attainment of those accepted.
#
#   bench/light_load.sh [MODEL_DIR] [PREFILL_DEVICE] [DECODE_DEVICE]
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json. Environment:
# RATES ("16 32 48" requests/s), PHASE_S (30), TTFT_SLO_MS (300),
# TPOT_SLO_MS (25), SEED (20261127), OUT (logs and JSON reports), BIN_DIR
# (the built programs; else bazel-bin, else PATH).
set -euo pipefail
model_dir=${1:-/tmp/llama3-8b}
prefill_device=${2:-cuda:0}
decode_device=${3:-cuda:1}
rates=${RATES:-16 32 48}
phase=${PHASE_S:-30}
ttft_slo=${TTFT_SLO_MS:-300}
tpot_slo=${TPOT_SLO_MS:-25}
seed=${SEED:-20261127}
out=${OUT:-$(mktemp -d)}
bin=${BIN_DIR:-bazel-bin}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
ensure_model "$model_dir"
fraction=0.9
[[ "$prefill_device" == "$decode_device" ]] && fraction=0.44

stop_all_on_exit

sharegpt_lengths "$out/lengths.csv" "$seed" 4096

worker() {
  local name=$1 role=$2 device=$3
  shift 3
  start "$name" "$(tool services/worker/worker)" --model="$model_dir" --role="$role" \
      --device="$device" --worker_id="$name" --gpu_memory_fraction="$fraction" \
      --max_model_len=2048 --kv_transport=ucx "$@"
}

worker prefill prefill "$prefill_device"
worker decode decode "$decode_device"
echo "model $model_dir, prefill on $prefill_device, decode on $decode_device," \
    "targets TTFT ${ttft_slo} ms, TPOT ${tpot_slo} ms, ${phase} s a phase"
printf '%-8s %-10s %9s %9s %9s %11s %10s %10s\n' rate learned measured refused "refused%" \
    attainment "TTFT p99" "TPOT p99"
run_index=0
for rate in $rates; do
  for learn in false true; do
    # Each run its own prompts: the workers outlive the router, and a run that
    # repeated an earlier run's prompts would find them in the prefix cache.
    run_seed=$((seed + run_index))
    run_index=$((run_index + 1))
    start router "$(tool services/router/router)" --model="$model_dir" \
        --prefill_workers="127.0.0.1:$PORT_prefill" --decode_workers="127.0.0.1:$PORT_decode" \
        --admission_learn_ttft_overhead="$learn" --max_model_len=2048
    label="rate$rate-learn-$learn"
    "$(tool bench/loadgen/loadgen)" --target="127.0.0.1:$PORT_router" --rate="$rate" \
        --duration_s="$phase" --prompt_tokens="csv:$out/lengths.csv" \
        --output_tokens="csv:$out/lengths.csv" --ttft_slo_ms="$ttft_slo" \
        --tpot_slo_ms="$tpot_slo" --seed="$run_seed" --progress=false \
        --json_out="$out/$label.json" >"$out/$label.txt" 2>&1
    stop
    python3 - "$out/$label.json" "$rate" "$learn" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
q, lat = r["requests"], r["latency_ms"]
att = r["slo"]["attainment"]
print(f"{sys.argv[2]:<8} {sys.argv[3]:<10} {q['measured']:9d} {q['rejected']:9d} "
      f"{100.0 * q['rejected'] / max(1, q['measured']):8.2f}% "
      f"{'-' if att is None else f'{att:.4f}':>11} {lat['ttft']['p99']:8.1f}ms "
      f"{lat['tpot']['p99']:8.1f}ms" + (f"  ({q['failed']} failed)" if q["failed"] else ""))
EOF
  done
done | tee "$out/summary.txt"
