# Helpers the bench/*.sh scripts share; source it after setting `bin` (the
# built programs' directory) and `out` (logs and reports), and an array
# `pids` that an EXIT trap kills.

# tool PATH: the built program at $bin/PATH, or $bin/NAME, or NAME's file on
# PATH (its full path: a script's shell function of the same name, such as
# serving.sh's `worker`, must not shadow it).
tool() {
  if [[ -x "$bin/$1" ]]; then echo "$bin/$1"; elif [[ -x "$bin/$(basename "$1")" ]]; then
    echo "$bin/$(basename "$1")"; else type -P "$(basename "$1")" || basename "$1"; fi
}

# start NAME BINARY FLAGS...: runs a service on free ports and sets
# PORT_<NAME> (gRPC) and METRICS_<NAME> once it is serving.
start() {
  local name=$1 binary=$2
  shift 2
  local ready="$out/$name.ready"
  rm -f "$ready"
  "$binary" --host=127.0.0.1 --port=0 --metrics_port=0 --ready_fd=3 "$@" \
      3>"$ready" >"$out/$name.log" 2>&1 &
  pids+=($!)
  local waited=0
  until [[ -s "$ready" ]]; do
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "$name exited; its log:" >&2
      tail -20 "$out/$name.log" >&2
      exit 1
    fi
    sleep 0.5
    waited=$((waited + 1))
    if ((waited > 600)); then echo "$name not ready after 300 s" >&2; exit 1; fi
  done
  local port metrics
  port=$(sed -E 's/.*"grpc_port":([0-9]+).*/\1/' "$ready")
  metrics=$(sed -E 's/.*"metrics_port":([0-9]+).*/\1/' "$ready")
  printf -v "PORT_${name}" '%s' "$port"
  printf -v "METRICS_${name}" '%s' "$metrics"
  echo "$name serving on 127.0.0.1:$port" >&2
}

# stop: ends the last service started.
stop() {
  kill "${pids[-1]}" 2>/dev/null || true
  wait "${pids[-1]}" 2>/dev/null || true
  unset 'pids[-1]'
}

# metric PORT NAME: the sum of every sample of NAME (any labels) that the
# service on metrics port PORT exposes; 0 when absent.
metric() {
  curl -s "http://127.0.0.1:$1/metrics" |
      awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.6g\n", s + 0 }'
}

# ensure_model DIR: writes make_model's llama3-8b preset (random bf16 weights)
# into DIR unless it already holds a config.json.
ensure_model() {
  [[ -f "$1/config.json" ]] || "$(tool tools/make_model/make_model)" --preset=llama3-8b --out_dir="$1"
}

# stop_all_on_exit: every service `start` ran is killed when the script ends.
stop_all_on_exit() {
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
}

# sharegpt_lengths FILE SEED ROWS: writes ROWS ShareGPT-like (prompt_tokens,
# output_tokens) rows to FILE for loadgen's csv: lengths: lognormal prompts
# (median 150 tokens, sigma 1) and outputs (median 120, sigma 0.8), both
# clipped to [16, 1024], from SEED.
sharegpt_lengths() {
  python3 - "$1" "$2" "$3" <<'EOF'
import csv, math, random, sys
rng = random.Random(int(sys.argv[2]))
clip = lambda v: max(16, min(1024, int(round(v))))
with open(sys.argv[1], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["prompt_tokens", "output_tokens"])
    for _ in range(int(sys.argv[3])):
        w.writerow([clip(rng.lognormvariate(math.log(150), 1.0)),
                    clip(rng.lognormvariate(math.log(120), 0.8))])
EOF
}
