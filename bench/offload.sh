#!/usr/bin/env bash
# NEO-style offload end to end on one GPU: a worker (role both) whose KV
# pool is capped to hold CAP sequences serves REQUESTS_PER_CAP x CAP
# requests that arrive at once, GPU-only (the rest wait for blocks) and
# with a CPU attention service on this host taking the sequences the pool
# cannot hold (asymmetric pipelining, --offload_pipeline). Same model, same run, per
# cap: output tokens/s, TPOT, goodput and how many requests met the TPOT
# SLO; the service's measured attention bandwidth; the ideal gain that
# bandwidth allows: 1 + (CPU KV bytes per step it can hide under a
# GPU-only step) / (GPU KV bytes per step); and R, the most any schedule can
# reach once the round trips and per-sequence costs the worker calibrated
# are counted (one batch, or two sub-batches as NEO pipelines them).
#
#   bench/offload.sh [MODEL_DIR] [DEVICE]
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json. Environment:
# CAPS (sequences the GPU pool holds, "2 4 8"), PROMPT_TOKENS (2048),
# OUTPUT_TOKENS (128), TPOT_SLO_MS (50), PIPELINE (auto), ATTN_THREADS (12),
# KEEP_THROUGHPUT (false: the offload run's --offload_keep_throughput, which
# moves a sequence only while the planned step stays as fast per sequence),
# MAX_STEP_MS (0: the offload run's --offload_max_step_time in ms, which
# moves a sequence only while the planned decode step stays within it),
# BACKGROUND_MOVES (true: the offload run's --offload_background_moves, which
# copies a move's KV while the engine keeps stepping), MOVE_THREADS (2: its
# --offload_move_threads, moves copied at once), REQUESTS_PER_CAP (2:
# requests per sequence the pool holds, all arriving at once), ATTN_KV_MB (the
# service's --kv_budget_mb; default room for every sequence twice over, which
# a host whose NUMA node has less memory cannot give), WORKER_FLAGS
# (more flags for both workers, e.g. --generated_weights with a model
# written by make_model --weights=false), OUT, BIN_DIR.
set -euo pipefail
model_dir=${1:-/tmp/llama3-8b}
device=${2:-cuda:0}
caps=${CAPS:-2 4 8}
prompt=${PROMPT_TOKENS:-2048}
output=${OUTPUT_TOKENS:-128}
slo=${TPOT_SLO_MS:-50}
pipeline=${PIPELINE:-auto}
threads=${ATTN_THREADS:-12}
keep=${KEEP_THROUGHPUT:-false}
max_step_ms=${MAX_STEP_MS:-0}
background=${BACKGROUND_MOVES:-true}
move_threads=${MOVE_THREADS:-2}
per_cap=${REQUESTS_PER_CAP:-2}
out=${OUT:-$(mktemp -d)}
bin=${BIN_DIR:-bazel-bin}
mkdir -p "$out"
pids=()
source "$(dirname "$0")/common.sh"
stop_all_on_exit
ensure_model "$model_dir"
# Per token of context: K and V of every layer, bf16.
kv_per_token=$(python3 -c "
import json; c = json.load(open('$model_dir/config.json'))
hd = c.get('head_dim') or c['hidden_size'] // c['num_attention_heads']
print(c['num_hidden_layers'] * 2 * c['num_key_value_heads'] * hd * 2)")
max_len=$((prompt + output + 16))
per_seq=$(((max_len + 15) / 16 * 16))

run() {  # run LABEL CAP [WORKER FLAGS...]: one load; its JSON in $out/LABEL.json
  local label=$1 cap=$2
  shift 2
  start worker "$(tool services/worker/worker)" --model="$model_dir" --role=both \
      --device="$device" --worker_id="$label" --gpu_kv_cache_tokens=$((cap * per_seq)) \
      --max_model_len="$max_len" --max_batch_tokens="$((prompt * 2))" ${WORKER_FLAGS:-} "$@"
  "$(tool bench/loadgen/loadgen)" --target="127.0.0.1:$PORT_worker" --rate=1000 \
      --num_requests=$((per_cap * cap)) --prompt_tokens="fixed:$prompt" \
      --output_tokens="fixed:$output" --tpot_slo_ms="$slo" --seed=1 --progress=false \
      --json_out="$out/$label.json" >"$out/$label.txt" 2>&1
  for m in 'trident_worker_offload_decisions_total{decision="moved"}' \
      'trident_worker_offload_decisions_total{decision="held"}' trident_worker_pipelined_steps_total \
      trident_worker_cpu_attention_seconds_total trident_worker_cpu_attention_exposed_seconds_total \
      trident_worker_step_hook_seconds_total trident_worker_decode_step_seconds_sum \
      trident_worker_decode_step_seconds_count; do
    echo "$m $(metric "$METRICS_worker" "$m")"
  done >"$out/$label.metrics"
  stop
  mv "$out/worker.log" "$out/$label.worker.log"
}

echo "model $model_dir on $device; $prompt-token prompts, $output output tokens, TPOT SLO $slo ms;" \
  "offload pipeline $pipeline, keep throughput $keep, max step ${max_step_ms} ms," \
  "background moves $background ($move_threads at once)"
for cap in $caps; do
  run "gpu-$cap" "$cap"
  start attention "$(tool services/attention/attention)" \
      --kv_budget_mb="${ATTN_KV_MB:-$((2 * per_cap * cap * per_seq * kv_per_token >> 20))}" \
      --threads="$threads"
  run "offload-$cap" "$cap" --attention_services="127.0.0.1:$PORT_attention" \
      --offload_min_context_tokens=0 --offload_pipeline="$pipeline" \
      --offload_keep_throughput="$keep" --offload_max_step_time="${max_step_ms}ms" \
      --offload_background_moves="$background" --offload_move_threads="$move_threads"
  for m in trident_attention_bytes_read_total trident_attention_kernel_seconds_sum \
      trident_attention_requests_total; do
    echo "$m $(metric "$METRICS_attention" "$m")"
  done >"$out/attention-$cap.metrics"
  stop
  python3 - "$out" "$cap" "$prompt" "$output" "$kv_per_token" "$per_cap" "$model_dir" <<'PY'
import json, sys
out, cap, prompt, output, kv_tok, per_cap = (sys.argv[1], *map(int, sys.argv[2:7]))
def load(label):
    r = json.load(open(f"{out}/{label}.json"))
    m = dict(l.split() for l in open(f"{out}/{label}.metrics"))
    return r, {k: float(v) for k, v in m.items()}
def metrics(path):
    return {k: float(v) for k, v in (l.split() for l in open(path))}
g, gm = load(f"gpu-{cap}")
o, om = load(f"offload-{cap}")
a = metrics(f"{out}/attention-{cap}.metrics")
for label, r in (("gpu-only", g), ("offload", o)):
    q, t = r["requests"], r["throughput"]
    tpot = r["latency_ms"]["tpot"]
    ttft = r["latency_ms"]["ttft"]
    print(f"cap {cap:3d} {label:>9}: {t['output_tokens_per_s']:8.1f} output tok/s, TPOT p50 "
          f"{tpot['p50']:6.1f} p90 {tpot['p90']:6.1f} ms, TTFT p50 {ttft['p50']:7.1f} p90 "
          f"{ttft['p90']:7.1f} ms, goodput {t['goodput_rps']:.3f} req/s, TPOT SLO met "
          f"{r['slo']['met']}/{per_cap * cap}, completed {q['completed']}, failed {q['failed']}")
cpu_bw = a["trident_attention_bytes_read_total"] / max(a["trident_attention_kernel_seconds_sum"], 1e-9)
moved = int(om.get('trident_worker_offload_decisions_total{decision="moved"}', 0))
# A service that served no moved sequence read only its calibration: the
# ideal takes the bandwidth it reached at an earlier cap of this run.
import glob, os
bw_note = ""
if moved > 0:
    open(f"{out}/service-bw-{cap}", "w").write(str(cpu_bw))
else:
    earlier = [float(open(f).read()) for f in glob.glob(f"{out}/service-bw-*")]
    if earlier:
        cpu_bw = max(earlier)
        bw_note = " (no moves: an earlier cap's)"
def step_ms(m):
    return 1e3 * m.get("trident_worker_decode_step_seconds_sum", 0) / max(
        m.get("trident_worker_decode_step_seconds_count", 0), 1)
# GPU-only: `cap` sequences decode per step at mean context prompt + output/2,
# in its mean decode step (its TPOT also holds the waits for the prefills of
# requests arriving at once).
ctx = prompt + output / 2
step = step_ms(gm) / 1e3
gpu_bytes = cap * ctx * kv_tok
hidden = min((per_cap - 1) * cap * ctx * kv_tok, cpu_bw * step)
ideal = 1 + hidden / gpu_bytes
gain = o["throughput"]["output_tokens_per_s"] / max(g["throughput"]["output_tokens_per_s"], 1e-9)
hid = 1 - om.get("trident_worker_cpu_attention_exposed_seconds_total", 0) / max(
    om.get("trident_worker_cpu_attention_seconds_total", 0), 1e-9)
held = int(om.get('trident_worker_offload_decisions_total{decision="held"}', 0))
# R, the most a scheduler can reach with the round trips counted: T the
# GPU-only step, L layers, r the calibrated round trip of one layer's
# request, c one CPU sequence's service time for a whole step (the
# calibrated attention scaled to the mean context, plus its per-sequence
# cost, every layer), C CPU sequences beside the B the pool holds. One batch
# takes T + L r + C c; two sub-batches max(2T, 2 L r + C c); moving nothing,
# T for B: R = max(1, max over C of (B + C) T / (B min(...))).
import re
L = json.load(open(f"{sys.argv[7]}/config.json"))["num_hidden_layers"]
cal = None
for line in open(f"{out}/offload-{cap}.worker.log", errors="replace"):
    m = re.search(r"round trip ([0-9.e+-]+) us, attention over ([0-9]+) tokens ([0-9.e+-]+) us "
                  r"more, ([0-9.e+-]+) us per sequence", line)
    if m:
        cal = [float(x) for x in m.groups()]
bound_note = "R: no calibration in the worker's log"
if cal:
    r_layer = cal[0] * 1e-6
    c_seq = L * (cal[2] * 1e-6 * ctx / max(cal[1], 1) + cal[3] * 1e-6)
    best, best_c = 1.0, 0
    for C in range(1, (per_cap - 1) * cap + 1):
        t = min(step + L * r_layer + C * c_seq, max(2 * step, 2 * L * r_layer + C * c_seq))
        if (cap + C) * step / (cap * t) > best:
            best, best_c = (cap + C) * step / (cap * t), C
    # Measured: the whole run's output tokens/s against GPU-only's (the same
    # prompts, so their prefills weigh the same in both).
    bound_note = (f"R {best:.2f}x (at C = {best_c}; T {1e3 * step:.1f} ms, r {1e6 * r_layer:.0f} us "
                  f"x {L} layers, c {1e3 * c_seq:.2f} ms); offload/GPU-only {gain:.2f}x "
                  f"-> {gain / best:.2f} of R")
print(f"cap {cap:3d}: {bound_note}")
print(f"cap {cap:3d}: offload/GPU-only {gain:.2f}x, ideal {ideal:.2f}x -> {gain / ideal:.2f} of ideal; "
      f"service attention {cpu_bw / 1e9:.1f} GB/s{bw_note}; {moved} moves, {held} held, "
      f"{int(om.get('trident_worker_pipelined_steps_total', 0))} pipelined steps, "
      f"CPU attention hidden {100 * hid:.0f}%; decode step mean {step_ms(gm):.1f} ms GPU-only, "
      f"{step_ms(om):.1f} ms offload; loop stalled for moves "
      f"{1e3 * om.get('trident_worker_step_hook_seconds_total', 0):.0f} ms")
PY
done
echo "logs and reports in $out"
