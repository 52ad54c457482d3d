#ifndef TRIDENT_COMMON_KV_KV_CACHE_H_
#define TRIDENT_COMMON_KV_KV_CACHE_H_

// Host memory holding a whole KV cache, laid out as kv_layout.h describes.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/macros.h"
#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "common/kv/kv_layout.h"

namespace trident::kv {

// Owns one anonymous memory mapping of `spec.TotalBytes()` bytes. The base is
// page-aligned (so at least 64-byte aligned), and 2 MiB-aligned with
// transparent huge pages requested (madvise MADV_HUGEPAGE) when the cache is
// at least 2 MiB. Pages are zero-filled by the kernel on first touch, so
// creating a large cache is cheap and memory is committed as blocks are
// written. With a NUMA node, pages are bound to that node (libnuma's
// numa_tonode_memory) before anything touches them.
//
// Thread-compatible. The returned pointers stay valid for the cache's
// lifetime; concurrent writers to distinct blocks need no synchronization.
class HostKvCache {
 public:
  // The cache for `spec`, which must pass Validate and have num_blocks >= 1
  // (else INVALID_ARGUMENT naming the field). With `numa_node`, its memory
  // is placed on that node: INVALID_ARGUMENT if the node does not exist,
  // FAILED_PRECONDITION if the system has no NUMA support.
  // RESOURCE_EXHAUSTED if the mapping cannot be made.
  static absl::StatusOr<std::unique_ptr<HostKvCache>> Create(
      const KvCacheSpec& spec, absl::optional<int> numa_node = absl::nullopt);

  ~HostKvCache();
  HostKvCache(const HostKvCache&) = delete;
  HostKvCache& operator=(const HostKvCache&) = delete;

  const KvCacheSpec& spec() const { return spec_; }
  // First byte of the cache (layer 0, block 0, K).
  void* data() const { return base_; }
  // spec().TotalBytes().
  size_t size_bytes() const { return size_bytes_; }
  // The NUMA node the memory is bound to, if one was requested.
  absl::optional<int> numa_node() const { return numa_node_; }

  // Start of `layer`: data() + layer * layer_stride_bytes.
  // REQUIRES: 0 <= layer < num_layers.
  void* LayerBase(int32_t layer) const {
    ABSL_ASSERT(layer >= 0 && layer < spec_.num_layers);
    return base_ + layer * spec_.layer_stride_bytes();
  }
  // K entries of (`layer`, `block`): [num_kv_heads][block_size][head_dim].
  // REQUIRES: 0 <= layer < num_layers, 0 <= block < num_blocks.
  void* KeyBlock(int32_t layer, int32_t block) const {
    ABSL_ASSERT(layer >= 0 && layer < spec_.num_layers);
    ABSL_ASSERT(block >= 0 && block < spec_.num_blocks);
    return base_ + spec_.KeyOffsetBytes(layer, block);
  }
  // V entries of (`layer`, `block`): KeyBlock + value_offset_bytes.
  void* ValueBlock(int32_t layer, int32_t block) const {
    ABSL_ASSERT(layer >= 0 && layer < spec_.num_layers);
    ABSL_ASSERT(block >= 0 && block < spec_.num_blocks);
    return base_ + spec_.ValueOffsetBytes(layer, block);
  }

 private:
  HostKvCache(const KvCacheSpec& spec, char* base, size_t size_bytes, void* mapping,
              size_t mapping_bytes, absl::optional<int> numa_node);

  const KvCacheSpec spec_;
  char* const base_;
  const size_t size_bytes_;
  // What munmap releases: the mapping trimmed to the aligned region.
  void* const mapping_;
  const size_t mapping_bytes_;
  const absl::optional<int> numa_node_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_KV_CACHE_H_
