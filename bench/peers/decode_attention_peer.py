#!/usr/bin/env python3
"""Peer numbers for kernels/cuda/paged_decode_attention's benchmark.

PyTorch's scaled_dot_product_attention on the same decode shapes as
paged_decode_attention_benchmark (32 q heads, 8 kv heads, head_dim 128, bf16,
one query token per sequence), on contiguous KV tensors [batch, 8, ctx, 128]
(no paging: this favours the peer). Each backend (cuDNN, FlashAttention) is
forced with torch.nn.attention.sdpa_kernel and timed with CUDA events: warmup,
then the median over --samples samples of --reps back-to-back calls. Prints
one JSON line per (backend, shape) with GB/s of K + V bytes, the same byte
count the Trident benchmark uses; a backend that refuses a shape prints its
error instead.

Usage: python3 bench/peers/decode_attention_peer.py [--samples 30] [--reps 10]
"""

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Q_HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
SHAPES = [(1, 32768), (16, 4096), (16, 16384), (64, 4096), (64, 8192), (128, 2048)]
BACKENDS = [("CUDNN_ATTENTION", SDPBackend.CUDNN_ATTENTION),
            ("FLASH_ATTENTION", SDPBackend.FLASH_ATTENTION)]


def time_backend(backend, q, k, v, warmup, samples, reps, gqa=True):
    """Median milliseconds per call of SDPA under `backend`."""
    with sdpa_kernel(backend):
        call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(samples):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                call()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / reps)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"peer": "torch_sdpa", "error": "CUDA not available"}))
        return 1
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    common = {"peer": "torch_sdpa", "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device),
              "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bf16"}
    for batch, context in SHAPES:
        q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, device=device, dtype=torch.bfloat16)
        k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        kv_bytes = 2 * k.numel() * k.element_size()
        reference = None
        for name, backend in BACKENDS:
            row = dict(common, backend=name, batch=batch, context=context, kv_bytes=kv_bytes)
            try:
                ms = time_backend(backend, q, k, v, args.warmup, args.samples, args.reps)
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
                if reference is None:
                    reference = out
                row.update(median_us=ms * 1e3, gb_per_s=kv_bytes / (ms * 1e-3) / 1e9,
                           max_abs_diff_vs_first_backend=(out - reference).abs().max().item())
            except RuntimeError as error:  # The backend refused the shape.
                row.update(error=str(error).splitlines()[0] if str(error) else repr(error))
                refused = True
            else:
                refused = False
            print(json.dumps(row), flush=True)
            if refused and backend == SDPBackend.CUDNN_ATTENTION:
                # cuDNN without enable_gqa: K and V repeated to 32 heads (4x the
                # bytes read); GB/s still counts the 8-head K + V, as a serving
                # stack that materialized the repeat would see it.
                row = dict(common, backend=name + "_KV_REPEATED", batch=batch, context=context,
                           kv_bytes=kv_bytes)
                try:
                    group = Q_HEADS // KV_HEADS
                    k4 = k.repeat_interleave(group, dim=1)
                    v4 = v.repeat_interleave(group, dim=1)
                    ms = time_backend(backend, q, k4, v4, args.warmup, args.samples, args.reps,
                                      gqa=False)
                    row.update(median_us=ms * 1e3, gb_per_s=kv_bytes / (ms * 1e-3) / 1e9)
                    del k4, v4
                except RuntimeError as error:
                    row.update(error=str(error).splitlines()[0] if str(error) else repr(error))
                print(json.dumps(row), flush=True)
        del q, k, v, reference
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
