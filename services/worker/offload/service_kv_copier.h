// Copies a sequence's KV from this worker's paged KV pool to a sequence at
// a CPU attention service, with append-only requests of the attention data
// plane: a decode worker's move (attention_offload.h), and a prefill
// worker's write of a CPU-placed prompt (prompt_kv_sender.h).
//
// Per layer: the blocks holding the positions are staged in host memory (a
// host pool is read in place; a device pool is copied through the
// backend's KvCopier), gathered into token-major rows (bf16 as they are
// when the pool and the wire are bf16, else f32) and sent in requests of at
// most kChunkTokens tokens. Every request sent is waited for, even after a
// failure, so that no reply lands in scratch that is reused.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_SERVICE_KV_COPIER_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_SERVICE_KV_COPIER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/transport/attention/remote_attention.h"

namespace trident::worker {

// What to copy: positions [first, last) of the sequence whose KV is in
// `blocks` (token order, covering [0, last)), layers [layer_begin,
// layer_end), to `handle` at the service behind the channel.
struct KvCopyRange {
  absl::Span<const int32_t> blocks;
  int32_t first = 0;
  int32_t last = 0;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;  // 0: every layer.
  uint64_t handle = 0;
  // Nonzero: a prompt write by a session that does not own the sequence.
  uint64_t write_key = 0;
};

// Thread-safe: each thread copies with a Scratch of its own.
class ServiceKvCopier {
 public:
  static constexpr int32_t kChunkTokens = 512;

  // Staging and row buffers kept between copies.
  struct Scratch {
    std::vector<const char*> block_data;
    std::vector<backend::KvRange> ranges;
    std::unique_ptr<backend::HostBuffer> staging;
    std::vector<float> k_rows, v_rows;     // f32 rows,
    std::vector<uint16_t> k_bits, v_bits;  // or bf16 ones.
    std::vector<uint64_t> handles;
    std::vector<int32_t> positions;
  };

  // For `backend`'s KV pool (which must outlive this): its kv_memory()'s
  // errors, and CreateKvCopier's for a device pool.
  static absl::StatusOr<std::unique_ptr<ServiceKvCopier>> Create(
      const backend::ModelBackend& backend);

  // Copies `range` over `channel`, waiting at most `timeout` for each
  // reply. The channel's and the service's errors; INVALID_ARGUMENT for a
  // range the blocks do not cover.
  absl::Status Copy(const KvCopyRange& range, transport::attention::RemoteAttention& channel,
                    absl::Duration timeout, Scratch& scratch) const;

  // The format of the rows on the wire: bf16 for a bf16 pool, else f32.
  transport::attention::WireDType wire_dtype() const { return wire_dtype_; }
  const backend::KvMemory& memory() const { return memory_; }

 private:
  ServiceKvCopier(backend::KvMemory memory, std::unique_ptr<backend::KvCopier> copier);
  // Points scratch.block_data[i] at the i-th block holding positions
  // [first, last) in `layer` (K, then V value_offset_bytes on), in host
  // memory.
  absl::Status StageLayer(absl::Span<const int32_t> blocks, int32_t first, int32_t last,
                          int32_t layer, Scratch& scratch) const;
  // Gathers positions [start, start + n) from the staged blocks (staged
  // from position `first` on) into rows; true when they are bf16 bits.
  bool GatherRows(int32_t first, int32_t start, int32_t n, Scratch& scratch) const;

  const backend::KvMemory memory_;
  const std::unique_ptr<backend::KvCopier> copier_;  // Null for a host pool.
  const transport::attention::WireDType wire_dtype_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_SERVICE_KV_COPIER_H_
