#ifndef TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_O_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_O_DEVICE_H_

// Device code of the output projection fused into the cluster decode kernel
// (nvcc only): the weight ring the bulk copy engine fills (its first stages
// before the kernel waits for the one ahead), the product of each stage's
// rows with the kv head's attention output on tensor cores, and the
// deterministic sum of the kv heads' partials into the residual.

#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {

// The weight ring of one CTA: `o_smem` is the region at kOAttentionBytes
// (barriers, the attention vector, then the stages).
struct ORing {
  const DecodeKernelParams* p;
  unsigned char* o_smem;
  int kv_head;
  int row0;        // the CTA's first row
  int num_stages;  // stages of kORowsPerStage rows the CTA covers
  int rows;        // rows the CTA covers (the last stage may be short)
  int width;       // group * head_dim: the columns of the kv head's heads
  int64_t stage_bytes;

  __device__ __forceinline__ ORing(const DecodeKernelParams& params, unsigned char* smem_o,
                                   int head, int block)
      : p(&params), o_smem(smem_o), kv_head(head) {
    width = params.group * params.head_dim;
    stage_bytes = OStageBytes(width);
    row0 = block * params.o_rows_per_cta;
    const int left = params.o_rows - row0;
    rows = left < 0 ? 0 : (left < params.o_rows_per_cta ? left : params.o_rows_per_cta);
    num_stages = (rows + kORowsPerStage - 1) / kORowsPerStage;
  }

  __device__ __forceinline__ uint64_t* full(int slot) const {
    return reinterpret_cast<uint64_t*>(o_smem) + slot;
  }
  __device__ __forceinline__ __nv_bfloat16* vector() const {
    return reinterpret_cast<__nv_bfloat16*>(o_smem + kOBarrierBytes);
  }
  __device__ __forceinline__ unsigned char* slot_base(int slot) const {
    return o_smem + (kORingOffset - kOAttentionBytes) + slot * stage_bytes;
  }

  // Thread 0, before any other use (a CTA barrier must follow).
  __device__ __forceinline__ void Init() const {
    for (int s = 0; s < p->o_stages; ++s) wgmma::BarrierInit(full(s), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }

  // One warp: the copies of stage s into its slot (s mod o_stages), counted
  // on the slot's barrier. Rows past the weight are not copied.
  __device__ __forceinline__ void Issue(int s, int lane) const {
    const int slot = s % p->o_stages;
    const int first = s * kORowsPerStage;
    const int valid = rows - first < kORowsPerStage ? rows - first : kORowsPerStage;
    const uint32_t row_bytes = static_cast<uint32_t>(width) * 2;
    if (lane == 0) wgmma::BarrierArriveExpectBytes(full(slot), row_bytes * valid);
    __syncwarp();
    if (lane < valid) {
      const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p->o_weight) +
                                 static_cast<int64_t>(row0 + first + lane) * p->o_weight_stride +
                                 static_cast<int64_t>(kv_head) * width;
      wgmma::BulkLoad(slot_base(slot) + lane * (row_bytes + kORowPad), src, row_bytes, full(slot),
                      wgmma::EvictFirstPolicy());
    }
  }

  // Warp `warp` of kNumWarps: its first stages (s = warp mod kNumWarps,
  // below the ring's depth), before the kernel waits.
  template <int kNumWarps>
  __device__ __forceinline__ void Prologue(int warp, int lane) const {
    const int first = num_stages < p->o_stages ? num_stages : p->o_stages;
    for (int s = warp; s < first; s += kNumWarps) Issue(s, lane);
  }

  // Warp `warp`'s stages (s = warp mod kNumWarps): each stage's rows times
  // the attention vector (mma m16n8k16, the vector in every column of B),
  // written to o_partials[kv_head][row]; each slot refilled with the stage
  // o_stages on once the warp has read it.
  template <int kNumWarps>
  __device__ __forceinline__ void Multiply(int warp, int lane) const {
    const int g = lane / 4;
    const int q = lane % 4;
    const uint32_t pitch = static_cast<uint32_t>(width) * 2 + kORowPad;
    const __nv_bfloat16* vec = vector();
    float* out = p->o_partials + static_cast<int64_t>(kv_head) * p->o_rows + row0;
    for (int s = warp; s < num_stages; s += kNumWarps) {
      const int slot = s % p->o_stages;
      wgmma::BarrierWait(full(slot), static_cast<uint32_t>((s / p->o_stages) & 1));
      const uint32_t base = wgmma::SharedAddress(slot_base(slot)) +
                            static_cast<uint32_t>(lane % 16) * pitch +
                            static_cast<uint32_t>(lane / 16) * 16;
      // kChains independent accumulators (the width is a multiple of 128),
      // so the mma chain does not serialize the stage.
      constexpr int kChains = 4;
      float c[kChains][4] = {};
      for (int k0 = 0; k0 < width; k0 += 16 * kChains) {
#pragma unroll
        for (int j = 0; j < kChains; ++j) {
          const int k = k0 + 16 * j;
          uint32_t a[4];
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                       : "r"(base + static_cast<uint32_t>(k) * 2));
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vec + k + 2 * q);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vec + k + 8 + 2 * q);
          asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
              "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
              : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
              : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        }
      }
      // Every column of D is the product: lanes with q == 0 hold rows g
      // and g + 8.
      const int r = s * kORowsPerStage + g;
      if (q == 0 && r < rows) out[r] = (c[0][0] + c[1][0]) + (c[2][0] + c[3][0]);
      if (q == 0 && r + 8 < rows) out[r + 8] = (c[0][2] + c[1][2]) + (c[2][2] + c[3][2]);
      __syncwarp();  // every lane's reads of the slot are done
      if (s + p->o_stages < num_stages) Issue(s + p->o_stages, lane);
    }
  }

  // After every warp's Multiply: the CTA takes its row block's ticket (one
  // thread, after the CTA barrier, as a release), and the last of the
  // num_kv_heads CTAs to arrive adds the partials (kv heads in order, then
  // the bias) to the residual and resets the ticket. Each thread sums four
  // consecutive rows, every partial's load issued before the sums.
  __device__ __forceinline__ void Reduce(int block, bool* last_flag) const {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      const uint32_t ticket = atomicAdd(p->o_tickets + block, 1u);
      const bool last = ticket + 1 == static_cast<uint32_t>(p->num_kv_heads);
      if (last) {
        atomicExch(p->o_tickets + block, 0u);
        __threadfence();
      }
      *last_flag = last;
    }
    __syncthreads();
    if (!*last_flag) return;
    constexpr int kMaxKvHeads = 8;
    const bool vector =
        p->o_rows % 4 == 0 && p->num_kv_heads <= kMaxKvHeads &&
        ((reinterpret_cast<uintptr_t>(p->o_residual) | reinterpret_cast<uintptr_t>(p->o_bias) |
          reinterpret_cast<uintptr_t>(p->o_partials)) &
         15) == 0;
    for (int i = 4 * threadIdx.x; i < rows; i += 4 * blockDim.x) {
      const int row = row0 + i;
      if (vector && i + 4 <= rows) {
        float4 part[kMaxKvHeads];
#pragma unroll
        for (int h = 0; h < kMaxKvHeads; ++h) {
          if (h < p->num_kv_heads) {
            part[h] = __ldcg(reinterpret_cast<const float4*>(
                p->o_partials + static_cast<int64_t>(h) * p->o_rows + row));
          }
        }
        float4 sum = part[0];
#pragma unroll
        for (int h = 1; h < kMaxKvHeads; ++h) {
          if (h < p->num_kv_heads) {
            sum.x += part[h].x;
            sum.y += part[h].y;
            sum.z += part[h].z;
            sum.w += part[h].w;
          }
        }
        if (p->o_bias != nullptr) {
          const float4 bias = *reinterpret_cast<const float4*>(p->o_bias + row);
          sum.x += bias.x;
          sum.y += bias.y;
          sum.z += bias.z;
          sum.w += bias.w;
        }
        float4* const r = reinterpret_cast<float4*>(p->o_residual + row);
        float4 value = *r;
        value.x += sum.x;
        value.y += sum.y;
        value.z += sum.z;
        value.w += sum.w;
        *r = value;
        continue;
      }
      for (int j = row; j < row0 + rows && j < row + 4; ++j) {
        float sum = __ldcg(p->o_partials + j);
        for (int h = 1; h < p->num_kv_heads; ++h) {
          sum += __ldcg(p->o_partials + static_cast<int64_t>(h) * p->o_rows + j);
        }
        if (p->o_bias != nullptr) sum += p->o_bias[j];
        p->o_residual[j] += sum;
      }
    }
  }
};

}  // namespace trident::kernels::cuda::internal

#endif  // __CUDACC__

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_O_DEVICE_H_
