// Bandwidth of the paged KV append against a device-to-device copy of the
// same bytes, measured in the same run: the copy's GB/s is the ceiling the
// append's GB/s is read against. Llama-3-8B shapes: 8 kv heads of 128,
// block_size 16, tokens spread over blocks in a shuffled order. BM_KvAppend
// stores bf16; BM_KvAppendFp8 quantizes to the FP8 E4M3 cache (bytes: bf16
// K and V read, a byte per element and a 4-byte scale per row written).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;
constexpr int64_t kRow = kKvHeads * kHeadDim;
constexpr int64_t kWidth = 6 * kRow;  // Fused qkv row, GQA 4:1.

// The device slots of `tokens` tokens spread over their blocks in a shuffled
// order (seed 3).
int64_t* ShuffledSlots(int64_t tokens) {
  const int64_t num_blocks = (tokens + kBlockSize - 1) / kBlockSize;
  std::vector<int64_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::mt19937 rng(3);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t)
    slots[t] = blocks[t / kBlockSize] * kBlockSize + t % kBlockSize;
  int64_t* d_slots = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d_slots), slots.size() * 8);
  cudaMemcpy(d_slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice);
  return d_slots;
}

void BM_KvAppend(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t num_blocks = (tokens + kBlockSize - 1) / kBlockSize;
  const int64_t block_stride = 2 * kRow * kBlockSize;
  void* cache = nullptr;
  void* qkv = nullptr;
  int64_t* d_slots = ShuffledSlots(tokens);
  cudaMalloc(&cache, static_cast<size_t>(num_blocks * block_stride * 2));
  cudaMalloc(&qkv, static_cast<size_t>(tokens * kWidth * 2));
  const uint16_t* k = static_cast<const uint16_t*>(qkv) + 4 * kRow;
  const KvAppendArgs args{.kv = {.base = cache,
                                 .num_blocks = num_blocks,
                                 .block_size = kBlockSize,
                                 .num_kv_heads = kKvHeads,
                                 .head_dim = kHeadDim,
                                 .block_stride_elems = block_stride,
                                 .value_offset_elems = kRow * kBlockSize},
                          .k = k,
                          .k_stride = kWidth,
                          .v = k + kRow,
                          .v_stride = kWidth,
                          .slots = d_slots,
                          .num_tokens = tokens};
  // K and V read, then written.
  testing::TimeOnDevice(state, static_cast<size_t>(tokens * kRow * 2 * 2 * 2),
                        [&] { (void)LaunchKvAppend(args, nullptr); });
  cudaFree(cache);
  cudaFree(qkv);
  cudaFree(d_slots);
}

void BM_KvAppendFp8(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t num_blocks = (tokens + kBlockSize - 1) / kBlockSize;
  const int64_t half = kRow * kBlockSize;  // Bytes of a block's K (or V).
  const int64_t scale_bytes = int64_t{2} * kKvHeads * kBlockSize * 4;
  const int64_t block_stride = 2 * half + scale_bytes;
  void* cache = nullptr;
  void* qkv = nullptr;
  int64_t* d_slots = ShuffledSlots(tokens);
  cudaMalloc(&cache, static_cast<size_t>(num_blocks * block_stride));
  cudaMalloc(&qkv, static_cast<size_t>(tokens * kWidth * 2));
  cudaMemset(qkv, 0x3c, static_cast<size_t>(tokens * kWidth * 2));
  const uint16_t* k = static_cast<const uint16_t*>(qkv) + 4 * kRow;
  const KvAppendFp8Args args{.kv = {.base = cache,
                                    .num_blocks = num_blocks,
                                    .block_size = kBlockSize,
                                    .num_kv_heads = kKvHeads,
                                    .head_dim = kHeadDim,
                                    .block_stride_bytes = block_stride,
                                    .value_offset_bytes = half,
                                    .scale_offset_bytes = 2 * half},
                             .k = k,
                             .k_stride = kWidth,
                             .v = k + kRow,
                             .v_stride = kWidth,
                             .slots = d_slots,
                             .num_tokens = tokens};
  if (const absl::Status status = LaunchKvAppendFp8(args, nullptr); !status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  const int64_t bytes = tokens * (kRow * 2 * 2 + kRow * 2 + int64_t{2} * kKvHeads * 4);
  testing::TimeOnDevice(state, static_cast<size_t>(bytes),
                        [&] { (void)LaunchKvAppendFp8(args, nullptr); });
  cudaFree(cache);
  cudaFree(qkv);
  cudaFree(d_slots);
}

void BM_CopyCeiling(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0) * kRow * 2 * 2);
  void* src = nullptr;
  void* dst = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  testing::TimeOnDevice(state, 2 * bytes,
                        [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(src);
  cudaFree(dst);
}

BENCHMARK(BM_KvAppend)->UseManualTime()->Arg(1)->Arg(64)->Arg(4096);
BENCHMARK(BM_KvAppendFp8)->UseManualTime()->Arg(1)->Arg(64)->Arg(4096);
BENCHMARK(BM_CopyCeiling)->UseManualTime()->Arg(1)->Arg(64)->Arg(4096);

}  // namespace
}  // namespace trident::kernels::cuda
