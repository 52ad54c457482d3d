#!/usr/bin/env python3
"""Peer numbers for kernels/cuda/paged_prefill_attention: PyTorch SDPA.

Causal prefill of one sequence, 32 q heads / 8 kv heads, head_dim 128, bf16,
contiguous q [1, 32, L, 128] and k, v [1, 8, L, 128], is_causal=True,
enable_gqa=True, under the FLASH_ATTENTION and CUDNN_ATTENTION backends
separately. Timing: CUDA events around each launch after warm-up; the median
is reported. FLOPs count the causal half of both matmuls,
2 * 2 * L * L / 2 * heads * head_dim, the same as the Trident benchmark.

Prints one JSON line per (backend, length); a backend that refuses the shape
prints its error instead. Written for PyTorch 2.11 on an H200.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H200_DENSE_BF16_PEAK_TFLOPS = 989.0
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128


def time_backend(backend, length, warmup, iters):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, NUM_Q_HEADS, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    k = torch.randn(1, NUM_KV_HEADS, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    v = torch.randn_like(k)

    def run():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    with sdpa_kernel(backend):
        for _ in range(warmup):
            run()
        torch.cuda.synchronize()
        times_ms = []
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            stop.synchronize()
            times_ms.append(start.elapsed_time(stop))
    return statistics.median(times_ms)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    backends = {"FLASH_ATTENTION": SDPBackend.FLASH_ATTENTION,
                "CUDNN_ATTENTION": SDPBackend.CUDNN_ATTENTION}
    device = torch.cuda.get_device_name()
    for length in args.lengths:
        flops = 2.0 * 2.0 * length * length / 2.0 * NUM_Q_HEADS * HEAD_DIM
        for name, backend in backends.items():
            record = {"peer": "torch.sdpa", "backend": name, "torch": torch.__version__,
                      "device": device, "seq_len": length, "num_q_heads": NUM_Q_HEADS,
                      "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM}
            try:
                ms = time_backend(backend, length, args.warmup, args.iters)
            except RuntimeError as error:  # The backend refused the shape or GQA.
                record["error"] = str(error).splitlines()[0]
                print(json.dumps(record), flush=True)
                continue
            tflops = flops / (ms * 1e-3) / 1e12
            record.update({"median_ms": round(ms, 4), "tflops": round(tflops, 1),
                           "peak_ratio": round(tflops / H200_DENSE_BF16_PEAK_TFLOPS, 3)})
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
