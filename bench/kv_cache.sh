#!/usr/bin/env bash
# The KV-cache benchmarks (kvbench, bench/kvbench): what prefix caching and
# its DRAM tier buy, each against its own control in the same run.
#
#   bench/kv_cache.sh PART [MODEL_DIR] [DEVICE]
#
# PART:
#   chat    multi-turn chat (shared system prompt, each turn carrying the
#           history) on one worker in role both, caching on and off, at each
#           session rate of RATES; with caching on, an uncached control
#           (each request's uncached tokens alone, same send times).
#   disagg  the same chat through a router, one prefill and one decode
#           worker on DEVICE, caching on and off, at RATE.
#   tier    the DRAM tier: a worker whose KV pool holds GPU_POOL_TOKENS,
#           prompts several times that, an attention service with a block
#           store; TTFT of a miss, a GPU hit and a DRAM hit, and the fetch
#           bandwidth against ucx_perftest's on the same transport.
#   trace   the Mooncake-shaped trace through a router with 1, 2 and 4
#           prefill workers, KV-aware and load-only routing: hit rate
#           against the trace's ideal.
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json. DEVICE: cuda:0
# (default) or cpu. Environment: OUT (logs and JSON), BIN_DIR (the built
# programs; else bazel-bin, else PATH), SESSIONS (60), RATES ("0.5 1 2"),
# RATE (1), WORKER_FLAGS (more flags for every worker), TRACE_FLAGS (more
# kvbench flags for the trace), GPU_POOL_TOKENS (16384), TIER_PROMPTS (16),
# TIER_PROMPT_TOKENS (4096), MAX_MODEL_LEN (8192), ATTENTION_LANES (4: UCX
# lanes between the tier's worker and its attention service); for trace:
# TRACE_WORKERS ("1 2 4"), TRACE_AWARE ("true false"), TRACE_TIER_MB (0: no
# DRAM tier; else the prefill workers share a block store of that size).
set -euo pipefail
part=${1:?usage: bench/kv_cache.sh chat|disagg|tier|trace [MODEL_DIR] [DEVICE]}
model_dir=${2:-/tmp/llama3-8b}
device=${3:-cuda:0}
out=${OUT:-$(mktemp -d)}
bin=${BIN_DIR:-bazel-bin}
sessions=${SESSIONS:-60}
max_len=${MAX_MODEL_LEN:-8192}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
ensure_model "$model_dir"
read -r -a extra <<<"${WORKER_FLAGS:-}"
stop_all_on_exit

worker() {
  local name=$1 role=$2 fraction=$3
  shift 3
  start "$name" "$(tool services/worker/worker)" --model="$model_dir" --role="$role" \
      --device="$device" --worker_id="$name" --gpu_memory_fraction="$fraction" \
      --max_model_len="$max_len" "${extra[@]}" "$@"
}

kvbench() {
  local label=$1
  shift
  "$(tool bench/kvbench/kvbench)" --json_out="$out/$label.json" "$@" | tee "$out/$label.txt" |
      sed "s/^/$label /"
}

chat_flags=(--mode=chat --sessions="$sessions" --system_tokens=1500 --min_turns=3 --max_run_s="${MAX_RUN_S:-60}"
            --max_turns=6 --user_tokens=80 --output_tokens=150 --think_s=1 --seed=1)

case "$part" in
  chat)
    for caching in true false; do
      worker both both 0.9 --prefix_caching="$caching" --kv_transport=none
      for rate in ${RATES:-0.5 1 2}; do
        control=()
        [[ "$caching" == true ]] && control=(--uncached_control)
        kvbench "chat-caching-$caching-rate-$rate" --target="127.0.0.1:$PORT_both" \
            "${chat_flags[@]}" --session_rate="$rate" "${control[@]}"
      done
      stop
    done
    ;;
  disagg)
    for caching in true false; do
      # A worker's --gpu_memory_fraction counts what the device holds already.
      worker prefill prefill 0.44 --prefix_caching="$caching"
      worker decode decode 0.88 --prefix_caching="$caching"
      start router "$(tool services/router/router)" --model="$model_dir" \
          --prefill_workers="127.0.0.1:$PORT_prefill" --decode_workers="127.0.0.1:$PORT_decode" \
          --load_interval_ms=50 --admission=false --max_model_len="$max_len"
      kvbench "disagg-caching-$caching" --target="127.0.0.1:$PORT_router" "${chat_flags[@]}" \
          --session_rate="${RATE:-1}"
      echo "decode worker: blocks not sent thanks to its cache" \
          "$(metric "$METRICS_decode" trident_worker_kv_transfer_cached_blocks_total)"
      stop; stop; stop
    done
    ;;
  tier)
    pool=${GPU_POOL_TOKENS:-16384}
    start attention "$(tool services/attention/attention)" --kv_budget_mb=24576 \
        --kv_store_mb=20480 --threads="${ATTENTION_THREADS:-4}" --lanes="${ATTENTION_LANES:-4}"
    worker both both 0.9 --kv_transport=none --gpu_kv_cache_tokens="$pool" \
        --attention_services="127.0.0.1:$PORT_attention" --attention_lanes="${ATTENTION_LANES:-4}" \
        --offload_low_watermark=0 \
        --offload_min_context_tokens=0 --offload_pipeline=never ${TIER_FLAGS:-}
    kvbench tier --target="127.0.0.1:$PORT_both" --mode=tier \
        --tier_prompts="${TIER_PROMPTS:-16}" --tier_prompt_tokens="${TIER_PROMPT_TOKENS:-4096}"
    bytes=$(metric "$METRICS_both" trident_worker_kv_tier_fetched_bytes_total)
    seconds=$(metric "$METRICS_both" trident_worker_kv_tier_fetch_seconds_total)
    written=$(metric "$METRICS_both" trident_worker_kv_tier_written_bytes_total)
    skipped=$(metric "$METRICS_both" trident_worker_kv_tier_skipped_total)
    echo "tier: fetched $bytes bytes in $seconds s (hits left to compute: $skipped);" \
        "written through $written bytes"
    # With TIER_FLAGS=--offload_min_context_tokens=1 every sequence moves to
    # the store's service for CPU attention: the prefix tokens it read in
    # place there, against those copied.
    in_place=$(metric "$METRICS_both" 'trident_worker_offload_moved_tokens_total{how="in_place"}')
    copied=$(metric "$METRICS_both" 'trident_worker_offload_moved_tokens_total{how="copied"}')
    echo "moved to CPU attention: $in_place tokens read in place, $copied copied"
    wait_s=$(metric "$METRICS_both" 'trident_worker_kv_tier_fetch_stage_seconds_total{stage="wait"}')
    copy_s=$(metric "$METRICS_both" 'trident_worker_kv_tier_fetch_stage_seconds_total{stage="copy"}')
    get_s=$(metric "$METRICS_attention" 'trident_attention_store_request_seconds_sum{op="get"}')
    gets=$(metric "$METRICS_attention" 'trident_attention_store_request_seconds_count{op="get"}')
    echo "fetch stages: $wait_s s waiting for replies, $copy_s s copying into the pool;" \
        "the store copied $gets gets out in $get_s s"
    # The ceiling: UCX active messages of the tier's size (8 MiB) between two
    # processes on this host, over the transport UCX picks here.
    perftest=$(tool ucx_perftest)
    (UCX_TLS='^sysv' UCX_MM_ERROR_HANDLING=y "$perftest" -t ucp_am_bw -s 8388608 -n 200 -e \
        >"$out/perftest-server.log" 2>&1 &)
    sleep 1
    UCX_TLS='^sysv' UCX_MM_ERROR_HANDLING=y "$perftest" 127.0.0.1 -t ucp_am_bw -s 8388608 -n 200 -e \
        >"$out/perftest.log" 2>&1 || true
    python3 - "$out/perftest.log" "$bytes" "$seconds" <<'EOF'
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^\s*Final:", l)]
ceiling = float(rows[-1][6]) * 1.048576e6 if rows else float("nan")  # bw_overall, MB/s (2^20)
fetch = float(sys.argv[2]) / float(sys.argv[3]) if float(sys.argv[3]) > 0 else float("nan")
print(f"tier: fetch {fetch/1e9:.2f} GB/s against ucx_perftest ucp_am_bw {ceiling/1e9:.2f} GB/s "
      f"(ratio {fetch/ceiling:.2f})")
EOF
    ;;
  trace)
    read -r -a trace_flags <<<"${TRACE_FLAGS:-}"
    for n in ${TRACE_WORKERS:-1 2 4}; do
      for aware in ${TRACE_AWARE:-true false}; do
        [[ $n == 1 && $aware == false ]] && continue
        # TRACE_TIER_MB > 0: the prefill workers share a DRAM tier (an
        # attention service's block store of that size), fetching every hit.
        tier=()
        if (( ${TRACE_TIER_MB:-0} > 0 )); then
          start attention "$(tool services/attention/attention)" \
              --kv_budget_mb=$(( TRACE_TIER_MB + 256 )) --kv_store_mb="$TRACE_TIER_MB" --threads=1 \
              --lanes=2
          tier=(--attention_services="127.0.0.1:$PORT_attention" --offload_min_context_tokens=0
                --offload_low_watermark=0 --kv_tier_always_fetch)
        fi
        prefill=()
        for i in $(seq 1 "$n"); do
          # Cumulative: a worker's fraction counts what the device holds.
          worker "p$i" prefill "$(python3 -c "print(round(0.88 * $i / ($n + 1), 3))")" "${tier[@]}"
          port_var="PORT_p$i"
          prefill+=("127.0.0.1:${!port_var}")
        done
        worker decode decode 0.88
        start router "$(tool services/router/router)" --model="$model_dir" \
            --prefill_workers="$(IFS=,; echo "${prefill[*]}")" \
            --decode_workers="127.0.0.1:$PORT_decode" --load_interval_ms=50 --admission=false \
            --max_model_len="$max_len" --kv_aware_routing="$aware"
        kvbench "trace-$n-aware-$aware" --target="127.0.0.1:$PORT_router" --mode=trace \
            --sessions="$sessions" --seed=1 "${trace_flags[@]}"
        for ((i = 0; i < n + 2 + (${#tier[@]} > 0 ? 1 : 0); ++i)); do stop; done
      done
    done
    ;;
  *)
    echo "unknown part $part" >&2
    exit 2
    ;;
esac
echo "logs and reports in $out"
