#!/usr/bin/env python3
"""PyTorch CPU decode attention at the shapes of decode_attention_benchmark.

The comparison point for //kernels/cpu/decode_attention: one query token per
sequence, 32 q heads / 8 kv heads, head_dim 128, bf16 K and V, batch 1-32,
context 2k-32k, torch.set_num_threads(one per physical core of the affinity
mask). Like the C++ benchmark, each timed call uses the next of enough
distinct KV copies ("layers") that the working set is 4x the LLC (>= 512 MiB), so the
figures are DRAM bandwidth, not cache bandwidth. Prints GB/s of K + V read
(every cached element once).

GQA goes through scaled_dot_product_attention(enable_gqa=True) where torch
has it (2.5+); older versions get K/V expanded with repeat_interleave outside
the timed region, and then read 4x the bytes the GB/s figure counts (noted in
the output as "expanded").

The softmax scale is SDPA's default, 1 / sqrt(head_dim), as in the C++
benchmark.

Run it on the same host in the same session as the C++ benchmark:
    python3 bench/cpu_sdpa_torch.py [--min-time 0.5] [--shapes 1x2048,8x8192]
"""

import argparse
import inspect
import os
import time

import torch
import torch.nn.functional as F

Q_HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
TOKEN_BYTES = 2 * KV_HEADS * HEAD_DIM * 2  # K + V, bf16.


def working_set_bytes():
    """4x the last-level cache, at least 512 MiB: as the C++ benchmark."""
    try:
        llc = max(os.sysconf("SC_LEVEL3_CACHE_SIZE"), 0)
    except (ValueError, OSError):
        llc = 0
    return max(512 << 20, 4 * llc)

MAX_LAYER_BYTES = 1 << 30


def physical_cores():
    """Distinct (package, core) pairs among the CPUs of the affinity mask."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f:
                package = f.read().strip()
            with open(base + "core_id") as f:
                core = f.read().strip()
        except OSError:
            package, core = "cpu", str(cpu)
        cores.add((package, core))
    return len(cores)


def default_shapes():
    shapes = []
    for batch in (1, 4, 8, 32):
        for context in (2048, 8192, 32768):
            if batch * context * TOKEN_BYTES <= MAX_LAYER_BYTES:
                shapes.append((batch, context))
    return shapes


def run_shape(batch, context, min_time, native_gqa):
    layer_bytes = batch * context * TOKEN_BYTES
    layers = max(1, working_set_bytes() // layer_bytes)
    q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, dtype=torch.bfloat16)
    kvs = []
    for _ in range(layers):
        k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, dtype=torch.bfloat16)
        v = torch.randn(batch, KV_HEADS, context, HEAD_DIM, dtype=torch.bfloat16)
        if not native_gqa:
            group = Q_HEADS // KV_HEADS
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        kvs.append((k, v))

    def call(i):
        k, v = kvs[i % layers]
        if native_gqa:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v)

    with torch.inference_mode():
        for i in range(min(layers, 3) + 1):  # Warm-up.
            call(i)
        calls = 0
        start = time.perf_counter()
        while True:
            call(calls)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time and calls >= 3:
                break
    seconds = elapsed / calls
    gbps = batch * context * TOKEN_BYTES / seconds / 1e9
    return seconds, gbps, layers


def has_native_gqa():
    """Whether SDPA takes enable_gqa (torch 2.5+). Its signature is not
    introspectable on some builds (a builtin), so try a tiny call."""
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (ValueError, TypeError):
        pass
    q = torch.zeros(1, 4, 1, 16)
    kv = torch.zeros(1, 2, 1, 16)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per shape")
    parser.add_argument("--shapes", default="", help="comma-separated BATCHxCONTEXT, e.g. 1x2048")
    args = parser.parse_args()
    shapes = default_shapes()
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]

    threads = physical_cores()
    torch.set_num_threads(threads)
    native_gqa = has_native_gqa()
    print(f"torch {torch.__version__}, {threads} threads, "
          f"gqa={'native' if native_gqa else 'expanded (repeat_interleave, 4x bytes read)'}")
    print(f"{'batch':>6} {'context':>8} {'layers':>6} {'ms':>10} {'GB/s':>8}")
    for batch, context in shapes:
        seconds, gbps, layers = run_shape(batch, context, args.min_time, native_gqa)
        print(f"{batch:>6} {context:>8} {layers:>6} {seconds * 1e3:>10.3f} {gbps:>8.2f}")


if __name__ == "__main__":
    main()
