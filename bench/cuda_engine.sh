#!/usr/bin/env bash
# End-to-end generation on one GPU: Trident's engine on the CUDA backend
# against Hugging Face transformers generate() with a static cache, same
# model, same shapes, same run. Needs make_model and cuda_engine_benchmark
# built with -c opt, and python3 with torch + transformers.
#
#   bench/cuda_engine.sh [MODEL_DIR] [BATCHES]
#
# MODEL_DIR (default /tmp/llama3-8b) is written with make_model's llama3-8b
# preset (random bf16 weights) when it has no config.json.
set -euo pipefail
model_dir=${1:-/tmp/llama3-8b}
batches=${2:-1,16,64}
bin=${BIN_DIR:-bazel-bin}
here=$(cd "$(dirname "$0")" && pwd)
# The built programs, or the same names on PATH.
tool() { [[ -x "$bin/$1" ]] && echo "$bin/$1" || basename "$1"; }
if [[ ! -f "$model_dir/config.json" ]]; then
  "$(tool tools/make_model/make_model)" --preset=llama3-8b --out_dir="$model_dir"
fi
peer=$(mktemp)
python3 "$here/peers/hf_generate_peer.py" --model_dir "$model_dir" --batch "$batches" \
    --prompt_len 512 --new_tokens 128 | tee "$peer"
"$(tool common/backend/cuda/cuda_engine_benchmark)" --model_dir="$model_dir" --batch="$batches" \
    --prompt_len=512 --new_tokens=128 --peer_json="$peer"
