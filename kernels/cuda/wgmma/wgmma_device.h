#ifndef TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_DEVICE_H_

// Hopper's warpgroup MMA (wgmma) for nvcc, sm_90a only (a .cu file of a
// trident_cuda_library with archs = ["90a"]): shared-memory matrix
// descriptors for the canonical layout without swizzling, the fences, and
// one m64n64k16 bf16 -> f32 product. The base of the prefill attention and
// FP8 decode kernels to come; kernels/cuda/wgmma's probe test checks the
// encoding against a CPU product.
//
// Layout of a K-major operand (rows of M or N, K contiguous), no swizzle:
// the matrix is cut into core matrices of 8 rows x 16 bytes (8 bf16 along
// K), each stored as 128 contiguous bytes (row r at byte 16 r). The
// descriptor gives the byte distance between core matrices adjacent along K
// (the leading dimension offset) and along M or N (the stride dimension
// offset).
//
// Accumulator fragment of m64nN (128 threads, f32 d[N / 2]): warp w holds
// rows 16 w .. 16 w + 15; lane l, for each 8 columns j: d[4 j] and
// d[4 j + 1] are row 16 w + l / 4, columns 8 j + 2 (l % 4) and + 1; d[4 j +
// 2] and d[4 j + 3] the same columns 8 rows below (mma.sync's m16n8 C
// fragment, repeated along N).

#include <cstdint>

// The accumulator operands of an inline wgmma: "+f" for d[0] .. d[n - 1].
#define TRIDENT_WGMMA_ACCUMULATORS_8(d, i)                                                  \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define TRIDENT_WGMMA_ACCUMULATORS_16(d) \
  TRIDENT_WGMMA_ACCUMULATORS_8(d, 0), TRIDENT_WGMMA_ACCUMULATORS_8(d, 8)
#define TRIDENT_WGMMA_ACCUMULATORS_32(d)                                  \
  TRIDENT_WGMMA_ACCUMULATORS_8(d, 0), TRIDENT_WGMMA_ACCUMULATORS_8(d, 8), \
      TRIDENT_WGMMA_ACCUMULATORS_8(d, 16), TRIDENT_WGMMA_ACCUMULATORS_8(d, 24)
#define TRIDENT_WGMMA_ACCUMULATORS_64(d)                                        \
  TRIDENT_WGMMA_ACCUMULATORS_32(d), TRIDENT_WGMMA_ACCUMULATORS_8(d, 32),        \
      TRIDENT_WGMMA_ACCUMULATORS_8(d, 40), TRIDENT_WGMMA_ACCUMULATORS_8(d, 48), \
      TRIDENT_WGMMA_ACCUMULATORS_8(d, 56)

namespace trident::kernels::cuda::wgmma {

// The 32-bit shared-memory address of a pointer into shared memory.
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The descriptor of a no-swizzle K-major operand at shared address `smem`
// (16-byte aligned); offsets in bytes, multiples of 16.
__device__ __forceinline__ uint64_t NoSwizzleDescriptor(const void* smem, uint32_t leading_bytes,
                                                        uint32_t stride_bytes) {
  const uint32_t address = SharedAddress(smem);
  return static_cast<uint64_t>((address & 0x3ffff) >> 4) |
         (static_cast<uint64_t>((leading_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3fff) << 32);
}

// The descriptor of a 128-byte-swizzled operand at `smem`: rows of 128
// bytes (64 bf16) in atoms of 8 rows (1024 bytes, 1024-byte aligned), the 16
// -byte chunk c of row r stored at chunk c ^ (r % 8). K-major: a row is one
// M (N) index's 64 K values, and a k16 step starts 32 bytes further on;
// MN-major: a row is one K index's 64 M (N) values. stride_bytes is the
// distance between atoms adjacent along M (N) for K-major, along K for
// MN-major; an operand's second atom along the other dimension is addressed
// by a descriptor of its own (the leading offset is not used).
__device__ __forceinline__ uint64_t Swizzle128Descriptor(const void* smem, uint32_t stride_bytes,
                                                         uint32_t leading_bytes = 16) {
  const uint32_t address = SharedAddress(smem);
  return static_cast<uint64_t>((address & 0x3ffff) >> 4) |
         (static_cast<uint64_t>((leading_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3fff) << 32) | (uint64_t{1} << 62);
}

// The descriptor of the operand `bytes` (a multiple of 16) further on in
// shared memory than `descriptor`'s: its address field (bits 0-13) counts
// 16-byte units, and shared memory ends below 256 KiB, so the sum never
// carries out of the field. A loop over k16 steps then adds a constant per
// step instead of building each descriptor from its address.
__device__ __forceinline__ uint64_t DescriptorAt(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a
// 128-byte-swizzled tile of 128-byte rows.
__host__ __device__ __forceinline__ uint32_t Swizzle128Offset(uint32_t row, uint32_t chunk) {
  return row * 128 + ((chunk ^ (row % 8)) * 16);
}

// Shared memory written with ordinary stores, made visible to wgmma's
// (async proxy) reads; a barrier must follow before another thread's wgmma.
__device__ __forceinline__ void FenceSharedForAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Before the first wgmma of a group, and after registers it accumulates into
// were written by other instructions.
__device__ __forceinline__ void Fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

__device__ __forceinline__ void CommitGroup() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void WaitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// d (+)= A B^T for A 64 x 16 and B 64 x 16, both K-major bf16 in shared
// memory (descriptors a and b); `accumulate` false overwrites d. Issued by
// all 128 threads of a warpgroup; asynchronous until CommitGroup and
// WaitGroup.
__device__ __forceinline__ void MmaM64N64K16Bf16(uint64_t a, uint64_t b, float (&d)[32],
                                                 bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : TRIDENT_WGMMA_ACCUMULATORS_32(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// MmaM64N64K16Bf16 for N = 16, 32 or 64 (d[N / 2]): a product whose B
// operand is a few rows (a skinny GEMM's activations).
template <int kN>
__device__ __forceinline__ void MmaM64NK16Bf16(uint64_t a, uint64_t b, float (&d)[kN / 2],
                                               bool accumulate) {
  static_assert(kN == 16 || kN == 32 || kN == 64, "N of 16, 32 or 64");
  if constexpr (kN == 64) {
    MmaM64N64K16Bf16(a, b, d, accumulate);
  } else if constexpr (kN == 32) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, "
        "1, 0, 0;\n"
        "}\n"
        : TRIDENT_WGMMA_ACCUMULATORS_16(d)
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n"
        "}\n"
        : TRIDENT_WGMMA_ACCUMULATORS_8(d, 0)
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
  }
}

// d (+)= A B for A 64 x 16 bf16 in registers (mma.sync's m16n8k16 A
// fragment per warp, warp w holding rows 16 w .. 16 w + 15: a[0] row l / 4,
// columns 2 (l % 4) and + 1; a[1] 8 rows below; a[2] and a[3] the same 8
// columns on) and B 16 x 64 bf16 in shared memory, MN-major (N contiguous):
// core matrices of 8 K rows x 16 bytes (8 N values), the descriptor's
// leading offset between core matrices adjacent along K, its stride offset
// along N.
__device__ __forceinline__ void MmaM64N64K16Bf16RegA(const uint32_t (&a)[4], uint64_t b,
                                                     float (&d)[32], bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1, 1;\n"
      "}\n"
      : TRIDENT_WGMMA_ACCUMULATORS_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same with N = 128 (d[64]): S = Q K^T of a 64-row query slice against a
// 128-key tile.
__device__ __forceinline__ void MmaM64N128K16Bf16(uint64_t a, uint64_t b, float (&d)[64],
                                                  bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : TRIDENT_WGMMA_ACCUMULATORS_64(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// MmaM64N64K16Bf16RegA with N = 128 (d[64]). For a 128-byte-swizzled
// MN-major B the 128 N values span two atoms, `leading_bytes` apart in its
// descriptor (Swizzle128Descriptor's third argument). kMnMajorB false: B is
// K-major instead (N rows of K contiguous values, as in the SS products).
template <bool kMnMajorB = true>
__device__ __forceinline__ void MmaM64N128K16Bf16RegA(const uint32_t (&a)[4], uint64_t b,
                                                      float (&d)[64], bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"
      "}\n"
      : TRIDENT_WGMMA_ACCUMULATORS_64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(kMnMajorB ? 1 : 0));
}

// Shared-memory barriers (mbarrier) for producer / consumer pipelines.

// Before any thread uses it; a CTA barrier must follow.
__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddress(bar)) : "memory");
}

// Waits until the barrier's phase of the given parity (0 for its first
// completion, 1 for its second, 0 again ...) has completed.
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// Arrives on the barrier once every cp.async this thread issued so far has
// landed (the arrival is counted in the barrier's expected count).
__device__ __forceinline__ void CpAsyncArriveOnBarrier(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(SharedAddress(bar))
               : "memory");
}

// Moves registers between the warpgroups of a CTA launched with a register
// cap (__launch_bounds__(threads, 1)): each warpgroup's role one branch.
template <int kRegisters>
__device__ __forceinline__ void IncreaseRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void DecreaseRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Arrives on the barrier and adds `bytes` to the transfer count its phase
// waits for (the bulk copies below complete it).
__device__ __forceinline__ void BarrierArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
}

// The tensor copy engine (TMA): the box of a 2-D tensor map at coordinates
// (inner, outer) into shared memory at `dst`, its bytes counted on `bar`.
// `tensor_map` is the address of a __grid_constant__ CUtensorMap parameter.
__device__ __forceinline__ void TensorLoad2d(void* dst, const void* tensor_map, int32_t inner,
                                             int32_t outer, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(inner), "r"(outer), "r"(SharedAddress(bar))
      : "memory");
}

// TensorLoad2d with an L2 cache policy (EvictFirstPolicy's).
__device__ __forceinline__ void TensorLoad2dHint(void* dst, const void* tensor_map, int32_t inner,
                                                 int32_t outer, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_"
      "hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(inner), "r"(outer), "r"(SharedAddress(bar)),
      "l"(policy)
      : "memory");
}

// An L2 policy for data read once (streamed weights): its lines are the
// first to be evicted, so they do not push out what is read again.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// The bulk copy engine: `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from global memory into shared memory at `dst`, counted on
// `bar`, with the L2 policy `policy`.
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(SharedAddress(dst)),
      "l"(src), "r"(bytes), "r"(SharedAddress(bar)), "l"(policy)
      : "memory");
}

// A barrier across the thread block cluster: every thread of every CTA in
// it (exited threads count as arrived), with release and acquire, so shared
// memory written before it is visible to the cluster's reads after it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// The address of `p` (this CTA's shared memory) in the shared memory of the
// cluster's CTA of rank `rank`, where the same kernel put the same layout.
// Pure: map a base once and offset it.
__device__ __forceinline__ uint32_t ClusterSharedAddress(const void* p, uint32_t rank) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(SharedAddress(p)), "r"(rank));
  return remote;
}

// The f32 at a ClusterSharedAddress.
__device__ __forceinline__ float LoadClusterShared(uint32_t remote) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// The two f32s at an 8-byte aligned ClusterSharedAddress.
__device__ __forceinline__ float2 LoadClusterSharedPair(uint32_t remote) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y)
               : "r"(remote)
               : "memory");
  return v;
}

}  // namespace trident::kernels::cuda::wgmma

#endif  // TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_DEVICE_H_
