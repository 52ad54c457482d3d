#ifndef TRIDENT_COMMON_NUMA_NUMA_ARENA_H_
#define TRIDENT_COMMON_NUMA_NUMA_ARENA_H_

// The KV memory of a CPU attention service: one large anonymous mapping whose
// pages all live on one NUMA node, allocated and faulted in once at start-up,
// and an allocator of contiguous byte ranges inside it.
//
//   TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<numa::NumaArena> arena,
//                            numa::NumaArena::Create(topology, {.node = node,
//                                                              .capacity_bytes = budget,
//                                                              .prefault_pool = pool.get()}));
//   ucx_worker.Register(arena->base(), arena->capacity_bytes());  // once
//   TRIDENT_ASSIGN_OR_RETURN(numa::ByteRange range, arena->Allocate(sequence_bytes));
//   char* kv = arena->Pointer(range);
//   ...
//   TRIDENT_RETURN_IF_ERROR(arena->Free(range));
//
// Placement: the mapping carries mbind(MPOL_BIND, {node}) (MPOL_MF_STRICT),
// which takes precedence over any thread's memory policy, so every page
// lands on `node` whichever thread first touches it, or the fault fails.
// Creation touches every page (pre-faulting), so no request ever pays a page
// fault and the kernel's OOM handling, if the node is short, happens at
// start-up rather than mid-decode. Who touches only changes how fast: pages
// are zeroed by the touching CPU, so pass the node's SpinPool to spread the
// work over its cores; without one the calling thread touches everything
// (bind it to the node first, e.g. BindProcessToNode). Without NUMA support
// (`topology.numa_available()` false) there is no mbind and node 0 is all
// memory.
//
// Huge pages: the mapping is aligned to 2 MiB and advised MADV_HUGEPAGE, so
// with transparent huge pages in `always` or `madvise` mode it is backed by
// 2 MiB pages (fewer TLB misses while attention streams KV); otherwise 4 KiB
// pages. Locking (mlock) is optional; the pages are never swapped out in
// practice on a service host without swap.
//
// Thread-safety: Allocate, Free and the accessors are thread-safe. The arena
// never reads or writes the memory of allocated ranges after creation.
// Lifetime: the destructor unmaps the memory; the caller deregisters it from
// UCX and stops using every range first.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numa/numa_topology.h"
#include "common/numa/range_allocator.h"
#include "common/numa/spin_pool.h"

namespace trident::numa {

struct NumaArenaOptions {
  // The node whose memory backs the arena.
  int node = 0;
  // The byte budget; rounded up to a multiple of the page size (4 KiB) and
  // of `alignment_bytes`.
  int64_t capacity_bytes = 0;
  // Every range's offset and length are multiples of this: a power of two.
  int64_t alignment_bytes = 4096;
  // Advise MADV_HUGEPAGE (ignored where the kernel has no transparent huge
  // pages).
  bool huge_pages = true;
  // mlock the mapping. Fails creation with kResourceExhausted beyond
  // RLIMIT_MEMLOCK (for a process without CAP_IPC_LOCK).
  bool lock = false;
  // Threads that touch the pages at creation, each a slice of whole 2 MiB
  // blocks, if given: Create calls `prefault_pool->Run` once (so it must not
  // be called from inside a Run of that pool). Not owned; used only during
  // Create. Its workers should run on `node`.
  SpinPool* prefault_pool = nullptr;
};

class NumaArena {
 public:
  // Maps, binds, advises, pre-faults and optionally locks the arena (a failed
  // MADV_HUGEPAGE only logs a warning).
  //
  // Returns kInvalidArgument if `options.node` does not exist in `topology`
  // (naming the nodes that do), if `capacity_bytes` <= 0 or
  // `alignment_bytes` is not a power of two;
  // kResourceExhausted if the capacity exceeds the node's total memory
  // (numa_node_size64; exceeding its free memory only logs a warning, since
  // page cache is reclaimed on demand), or if mmap, mbind or mlock fail for
  // lack of memory or of RLIMIT_MEMLOCK; kInternal if another system call
  // fails. On error nothing stays mapped.
  static absl::StatusOr<std::unique_ptr<NumaArena>> Create(const NumaTopology& topology,
                                                           const NumaArenaOptions& options);

  NumaArena(const NumaArena&) = delete;
  NumaArena& operator=(const NumaArena&) = delete;
  ~NumaArena();

  // The first byte of the mapping and its length: what to register with UCX.
  // capacity_bytes() is the requested budget after rounding.
  void* base() const { return base_; }
  int64_t capacity_bytes() const { return ranges_.capacity_bytes(); }
  int node() const { return node_; }

  // The address of `range`'s first byte. REQUIRES: `range` lies inside the
  // arena.
  char* Pointer(ByteRange range) const { return static_cast<char*>(base_) + range.offset; }

  // See RangeAllocator: best fit, coalescing, the same errors
  // (kInvalidArgument, kResourceExhausted with requested / free / largest
  // free bytes in the message).
  absl::StatusOr<ByteRange> Allocate(int64_t bytes) { return ranges_.Allocate(bytes); }
  absl::Status Free(ByteRange range) { return ranges_.Free(range); }

  int64_t used_bytes() const { return ranges_.used_bytes(); }
  int64_t free_bytes() const { return ranges_.free_bytes(); }
  int64_t largest_free_range() const { return ranges_.largest_free_range(); }
  int64_t num_free_ranges() const { return ranges_.num_free_ranges(); }

 private:
  NumaArena(void* base, int node, int64_t capacity_bytes, int64_t alignment_bytes);

  void* const base_;
  const int node_;
  RangeAllocator ranges_;
};

}  // namespace trident::numa

#endif  // TRIDENT_COMMON_NUMA_NUMA_ARENA_H_
