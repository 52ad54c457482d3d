#!/usr/bin/env bash
# Serving through the router: ShareGPT-like lengths (lognormal prompts,
# median 150 tokens, sigma 1; outputs median 120, sigma 0.8; both clipped to
# [16, 1024]; generated exactly), Poisson arrivals at each of RATES for
# PHASE_S seconds (the first WARMUP_S left out), admission off (every
# request is served: the sweep shows where latency gives). Prints per rate
# the requests served, requests/s and output tokens/s completed, TTFT, TPOT
# and ITL p50/p90/p99, goodput at the stated SLOs, ITL p99/p50, the mean E2E
# per output token (NEO's average normalized latency) and the decode
# workers' steps (how many, tokens and decode sequences a step, the shares
# of decode-only and mixed steps and their step times, the share of the
# phase's time, first request to last answer, the decode workers spent
# stepping, the mean time a step's tokens waited to be streamed) and the
# share of prompt tokens the workers' prefix caches held; then the decode
# workers' CUDA graphs: captured at start-up, captured since (must stay 0),
# replayed, and steps that had none. Where gnuplot is installed,
# bench/plot_serving.sh then draws goodput against rate and the TTFT and TPOT
# CDFs into OUT.
#
# TOPOLOGY picks the cluster:
#   colocated (default)  one worker in role both without a KV transport per
#                        device in DEVICES (the router runs each request on
#                        one of them in one Decode call);
#   <N>p<M>d, e.g. 1p1d, 1p2d, 2p1d
#                        N prefill and M decode workers, KV over UCX.
# DEVICES lists the devices the workers take in order (prefill workers
# first); with fewer devices than workers the last one is shared (each
# worker then gets an equal share of its memory). CPU_ATTENTION=1 adds a CPU
# attention service beside the decode workers (or the colocated worker),
# which then offload long sequences as `trident up` does
# (--offload_keep_throughput, background moves).
#
#   bench/serving.sh [MODEL_DIR] [DEVICE]
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json; DEVICE (cuda:0)
# is DEVICES' default. Environment: TOPOLOGY, DEVICES, CPU_ATTENTION (0),
# ATTN_THREADS (12), RATES ("2 8 32"; "inf" sends INF_REQUESTS (800) at
# once, the throughput at an infinite rate), PHASE_S (40), WARMUP_S (5),
# TTFT_SLO_MS (300), TPOT_SLO_MS (25), SEED (20261128; the k-th rate's phase,
# from 0, sends the prompts of SEED + k, so that no phase repeats the prompts
# an earlier one left in the prefix cache), OUT (logs, JSON
# reports, per-request CSVs, plots), BIN_DIR (the built programs; else
# bazel-bin, else PATH), WORKER_FLAGS (extra worker flags), PREFILL_TP and
# DECODE_TP (--tensor_parallel of prefill and of decode or colocated workers,
# 1; a worker at DEVICES' cuda:N with TP t takes cuda:N..N+t-1),
# PROMPT_TOKENS and OUTPUT_TOKENS (loadgen length specs, e.g. fixed:8192;
# default the ShareGPT-like rows), MAX_MODEL_LEN (2048). Disaggregated runs
# end with the lanes the prefill workers' KV transfers took.
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
max_model_len=${MAX_MODEL_LEN:-2048}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
ensure_model "$model_dir"
stop_all_on_exit

sharegpt_lengths "$out/lengths.csv" "$seed" 8192

topology=${TOPOLOGY:-colocated}
read -r -a devices <<<"${DEVICES:-$device}"
if [[ "$topology" == colocated ]]; then
  num_prefill=0
  num_decode=${#devices[@]}
elif [[ "$topology" =~ ^([0-9]+)p([0-9]+)d$ ]]; then
  num_prefill=${BASH_REMATCH[1]}
  num_decode=${BASH_REMATCH[2]}
else
  echo "serving.sh: TOPOLOGY must be colocated or <N>p<M>d (e.g. 1p1d), not $topology" >&2
  exit 2
fi
num_workers=$((num_prefill + num_decode))
# Worker i's device, and its share of that device's memory.
device_of() { local i=$1; ((i < ${#devices[@]})) || i=$((${#devices[@]} - 1)); echo "${devices[$i]}"; }
share_of() {
  local dev=$1 n=0 i
  for ((i = 0; i < num_workers; i++)); do [[ "$(device_of "$i")" == "$dev" ]] && n=$((n + 1)); done
  python3 -c "print(round(0.9 / $n, 3))"
}
offload=()
if [[ "${CPU_ATTENTION:-0}" == 1 ]]; then
  start attention "$(tool services/attention/attention)" --threads="${ATTN_THREADS:-12}"
  offload=(--attention_services="127.0.0.1:$PORT_attention" --offload_keep_throughput
           --offload_min_context_tokens=0)
fi
# worker NAME ROLE INDEX FLAGS...
worker() {
  local name=$1 role=$2 dev
  dev=$(device_of "$3")
  shift 3
  # shellcheck disable=SC2086
  start "$name" "$(tool services/worker/worker)" --model="$model_dir" --role="$role" \
      --device="$dev" --worker_id="$name" --gpu_memory_fraction="$(share_of "$dev")" \
      --max_model_len="$max_model_len" "$@" ${WORKER_FLAGS:-}
}
decoders=()
prefillers=()
if [[ "$topology" == colocated ]]; then
  worker_list=""
  for ((i = 0; i < num_decode; i++)); do
    worker "w$i" both "$i" --tensor_parallel="${DECODE_TP:-1}" "${offload[@]}"
    port_var="PORT_w$i"
    worker_list+="${worker_list:+,}127.0.0.1:${!port_var}"
    decoders+=("w$i")
  done
  route=(--workers="$worker_list")
else
  prefill_list=""
  decode_list=""
  for ((i = 0; i < num_prefill; i++)); do
    worker "p$i" prefill "$i" --kv_transport=ucx --tensor_parallel="${PREFILL_TP:-1}"
    port_var="PORT_p$i"
    prefill_list+="${prefill_list:+,}127.0.0.1:${!port_var}"
    prefillers+=("p$i")
  done
  for ((i = 0; i < num_decode; i++)); do
    worker "d$i" decode $((num_prefill + i)) --kv_transport=ucx \
        --tensor_parallel="${DECODE_TP:-1}" "${offload[@]}"
    port_var="PORT_d$i"
    decode_list+="${decode_list:+,}127.0.0.1:${!port_var}"
    decoders+=("d$i")
  done
  route=(--prefill_workers="$prefill_list" --decode_workers="$decode_list")
fi
# The decode workers' counter $1, summed (or, with WORKERS set, those
# workers').
decode_metric() {
  local total=0 name port_var
  for name in ${WORKERS:-${decoders[@]}}; do
    port_var="METRICS_$name"
    total=$(python3 -c "print($total + $(metric "${!port_var}" "$1"))")
  done
  echo "$total"
}
graphs_at_start=$(decode_metric trident_worker_cuda_graphs)
# The decode workers' step counters, summed: steps, tokens in them, decode
# sequences in steps that had any and those steps, decode-only steps' seconds
# and count, mixed steps' (prompt tokens beside decode sequences), steps
# that took the backlog's raised prompt cap, all steps' seconds, the token
# batches delivered and their time queued; then every worker's prompt tokens
# looked up in its prefix cache and those found.
engine_counters() {
  local m
  for m in trident_worker_engine_steps_total trident_worker_iteration_tokens_sum \
      trident_worker_iteration_decode_sequences_sum trident_worker_iteration_decode_sequences_count \
      trident_worker_decode_step_seconds_sum trident_worker_decode_step_seconds_count \
      trident_worker_mixed_step_seconds_sum trident_worker_mixed_step_seconds_count \
      trident_worker_backlogged_steps_total trident_worker_step_seconds_total \
      trident_worker_token_delivery_batches_total trident_worker_token_delivery_lag_seconds_total; do
    printf '%s ' "$(decode_metric "$m")"
  done
  for m in trident_worker_prefix_cache_queries_total trident_worker_prefix_cache_hits_total; do
    printf '%s ' "$(WORKERS="${prefillers[*]} ${decoders[*]}" decode_metric "$m")"
  done
}
start router "$(tool services/router/router)" --model="$model_dir" "${route[@]}" \
    --admission=false --max_model_len="$max_model_len"
grep -h "decode graphs at start-up" "$out"/*.log || true
echo "model $model_dir, $topology on ${devices[*]}$([[ ${CPU_ATTENTION:-0} == 1 ]] &&
    echo " + CPU attention"), ${phase} s a rate (first ${warmup} s left out)," \
    "SLO TTFT ${ttft_slo} ms / TPOT ${tpot_slo} ms"
printf '%-6s %6s %7s %8s %20s %20s %20s %9s %9s %9s\n' rate served "req/s" "tok/s" \
    "TTFT p50/p90/p99" "TPOT p50/p90/p99" "ITL p50/p90/p99" goodput "ITL p99/p50" "ms/token"
phase_index=0
for rate in $rates; do
  label="rate$rate"
  # Each phase its own prompts: with one seed for all, a phase would open with
  # the prompts the phases before it sent, and the prefix cache would serve
  # them (the engine line below reports the share of prompt tokens it found).
  phase_seed=$((seed + phase_index))
  phase_index=$((phase_index + 1))
  before=$(engine_counters)
  if [[ "$rate" == inf ]]; then
    schedule=(--rate=1000000 --num_requests="${INF_REQUESTS:-800}" --warmup_s=0)
  else
    schedule=(--rate="$rate" --duration_s="$phase" --warmup_s="$warmup")
  fi
  "$(tool bench/loadgen/loadgen)" --target="127.0.0.1:$PORT_router" "${schedule[@]}" \
      --max_inflight=100000 --prompt_tokens="${PROMPT_TOKENS:-csv:$out/lengths.csv}" \
      --output_tokens="${OUTPUT_TOKENS:-csv:$out/lengths.csv}" --ttft_slo_ms="$ttft_slo" \
      --tpot_slo_ms="$tpot_slo" --seed="$phase_seed" --progress=false \
      --json_out="$out/$label.json" --requests_csv="$out/$label.csv" >"$out/$label.txt" 2>&1
  after=$(engine_counters)
  python3 - "$out/$label.json" "$rate" "$before" "$after" "$num_decode" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
q, lat = r["requests"], r["latency_ms"]
f = lambda k: "/".join(f"{lat[k][p]:.1f}" for p in ("p50", "p90", "p99"))
good = r["throughput"]["goodput_rps"]
tput = r["throughput"]["output_tokens_per_s"]
print(f"{sys.argv[2]:<6} {q['completed']:6d} {r['throughput']['request_rps']:7.1f} "
      f"{tput:8.0f} {f('ttft'):>20} "
      f"{f('tpot'):>20} {f('itl'):>20} {good:9.1f} "
      f"{lat['itl']['p99'] / max(1e-9, lat['itl']['p50']):9.2f} "
      f"{lat['normalized_per_token']['mean']:9.2f}"
      + (f"  ({q['failed']} failed)" if q["failed"] else ""))
d = [b - a for a, b in zip(map(float, sys.argv[3].split()), map(float, sys.argv[4].split()))]
steps, tokens, dseqs, dsteps, only_s, only_n, mixed_s, mixed_n, backlogged, step_s, batches, \
    lag_s, queried, found = d
# From the first request sent to the last answer: the measured window and the
# warm-up before it.
wall = r["measured_window_s"] + r["config"]["warmup_s"]
num_decoders = int(sys.argv[5])
if steps > 0:
    print(f"       engine: {steps:.0f} steps, {tokens / steps:.0f} tokens and "
          f"{dseqs / max(1, dsteps):.0f} decode sequences a step; "
          f"{only_n / steps:.0%} decode-only, {1e3 * only_s / max(1, only_n):.2f} ms each; "
          f"{mixed_n / steps:.0%} mixed, {1e3 * mixed_s / max(1, mixed_n):.2f} ms each"
          + (f" ({backlogged / steps:.0%} of steps backlogged)" if backlogged else "") + "; "
          f"prefix cache {found / max(1, queried):.0%} of prompt tokens; "
          f"stepping {step_s / max(1e-9, wall * num_decoders):.0%} of the phase's time; "
          f"tokens streamed {1e3 * lag_s / max(1, batches):.2f} ms after their step")
EOF
done | tee "$out/summary.txt"
echo "decode graphs: $graphs_at_start at start-up," \
    "$(decode_metric trident_worker_cuda_graphs) now;" \
    "$(decode_metric trident_worker_cuda_graph_replays_total) steps replayed," \
    "$(decode_metric trident_worker_cuda_graph_misses_total) without a graph" |
    tee -a "$out/summary.txt"
for ((i = 0; i < num_prefill; i++)); do
  port_var="METRICS_p$i"
  echo "p$i KV transfers by lane: $(curl -s "http://127.0.0.1:${!port_var}/metrics" |
      awk '/^trident_worker_kv_transfers_total\{/ { printf "%s ", $0 }')" |
      tee -a "$out/summary.txt"
done
if [[ "${CPU_ATTENTION:-0}" == 1 ]]; then
  echo "CPU attention: $(decode_metric 'trident_worker_offload_decisions_total{decision="moved"}')" \
      "sequences moved to the service" | tee -a "$out/summary.txt"
fi
if command -v gnuplot >/dev/null; then
  "$(dirname "$0")/plot_serving.sh" "$out" \
      "$topology$([[ ${CPU_ATTENTION:-0} == 1 ]] && echo " + CPU attention"), $(basename "$model_dir") on ${devices[*]}"
fi
