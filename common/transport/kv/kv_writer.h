#ifndef TRIDENT_COMMON_TRANSPORT_KV_KV_WRITER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_KV_WRITER_H_

// Writes one sequence's KV cache, layer by layer, from this process's paged
// KV cache into the blocks a decode worker reserved for it (a
// trident.v1.KvDestination, from Decode.ReserveKv), with UCX puts.
//
// Both sides use the layout of common/kv/kv_layout.h: a block's K entries are
// followed by its V entries, so one block of one layer is one contiguous
// block_stride_bytes range on either side, and a run of blocks whose ids are
// consecutive on both sides is one contiguous range too. WriteLayer sends
// each such run as ONE put ("collating"); a freshly allocated reservation
// written from a freshly allocated local sequence is then one put per layer:
//
//   destination block_ids  [40 41 42 | 7 | 8 9]     local [3 4 5 | 9 | 20 21]
//   puts per layer         [  one    | one | one ]  (7 -> 8 is consecutive
//                                                    remotely, 9 -> 20 not
//                                                    locally: a new run)

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"
#include "common/transport/ucx_worker.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// One put of a layer: `length_bytes` from local offset `local_offset_bytes`
// (from the local cache base) to `remote_address`, through region `region`.
struct KvPut {
  uint64_t local_offset_bytes = 0;
  uint64_t remote_address = 0;
  uint64_t length_bytes = 0;
  int region = 0;

  friend bool operator==(const KvPut&, const KvPut&) = default;
};

// How a KvWriter moves bytes.
enum class KvWriteMode {
  // One-sided RMA puts into the destination's registered regions, then a
  // flush. For lanes where the target takes no part (RDMA, cuda_ipc, cma).
  kPut,
  // Active messages (Endpoint::Send, id kKvMessageId), each carrying a
  // KvMessageHeader; the receiver checks each against a live reservation and
  // copies it into the blocks. For lanes where UCX emulates RMA through the
  // target (tcp, posix, sysv, self): there a writer dying mid-put can crash
  // the target on UCX 1.13, a sender dying mid-message cannot. Delivery is
  // confirmed by the receiver counting bytes (CommitKvRequest.message_bytes).
  kMessage,
};

// The mode for an endpoint's lane (Endpoint::lane()): kPut for lanes with
// one-sided RMA, kMessage for the emulated ones and for an unknown lane.
KvWriteMode WriteModeForLane(absl::string_view lane);

// Whether KV messages over `lane` go by rendezvous (Endpoint::Send's
// `rendezvous`): on shared-memory lanes (posix, sysv, cma, xpmem, knem) the
// receiver then fetches each message straight into a buffer of its own, one
// copy where an eager message costs UCX's reassembly and then ours. Eager
// elsewhere (tcp: there the receiver never replies inside UCX).
bool RendezvousForLane(absl::string_view lane);

// KvRegion.rkey of a region that takes KV messages only: its owner cannot
// register its KV pool with UCX (device memory, UCX without CUDA support)
// and copies each message in through host staging. Not a UCX rkey: a
// KvWriter in kPut mode refuses it.
inline constexpr absl::string_view kMessagesOnlyRkey = "trident:kv-messages-only";

// The mode for writing into `destination` over `lane`: kMessage when a
// region takes messages only (kMessagesOnlyRkey), else WriteModeForLane.
KvWriteMode WriteModeFor(const trident::v1::KvDestination& destination, absl::string_view lane);

// The active-message id of KV writes.
inline constexpr uint16_t kKvMessageId = 0x4b56;  // "KV"

// The header of a KV message: which reservation, and where in the receiver's
// registered region the message's bytes go (as a put's remote address
// would). Fixed 24-byte little-endian encoding: magic, 4 reserved bytes (zero),
// reservation id, remote address.
struct KvMessageHeader {
  uint64_t reservation_id = 0;
  uint64_t remote_address = 0;

  std::string Encode() const;
  // INVALID_ARGUMENT for a header of the wrong size or magic, or with
  // nonzero reserved bytes.
  static absl::StatusOr<KvMessageHeader> Decode(absl::string_view bytes);
};

// Checks that a write of `length` bytes at byte `offset` of a KV cache laid
// out by `spec` covers whole blocks of one layer, each of them in `blocks`:
// what a receiver verifies before copying a KV message into its cache.
// INVALID_ARGUMENT naming what is wrong otherwise.
absl::Status CheckKvWriteRange(const kv::KvCacheSpec& spec, uint64_t offset, uint64_t length,
                               absl::Span<const int32_t> blocks);

// Checks that `destination` can receive KV computed with `local_spec`:
// FAILED_PRECONDITION naming the field ("destination.layout.head_dim") when
// its layout differs from this model's (dims, dtype, block size and layout,
// block stride, value offset; the layer stride may differ, as the decode
// pool's block count does); INVALID_ARGUMENT naming the field when it is
// malformed: num_tokens < 1, block_ids not ceil(num_tokens / block_size)
// long, a negative block id or one past a region's layer stride, a layer no
// region holds, a region that does not contain every block it must hold, or
// an empty rkey.
absl::Status ValidateKvDestination(const kv::KvCacheSpec& local_spec,
                                   const trident::v1::KvDestination& destination);

// The puts that write `layer` of the blocks `local_block_ids[i] ->
// destination.block_ids(i)`, collated as the file comment shows, in block
// order. REQUIRES: ValidateKvDestination(local_spec, destination).ok(),
// 0 <= layer < num_layers, local_block_ids.size() == block_ids_size().
std::vector<KvPut> PlanLayerPuts(const kv::KvCacheSpec& local_spec,
                                 const trident::v1::KvDestination& destination, int32_t layer,
                                 absl::Span<const int32_t> local_block_ids);

// Checks the arguments of a layer write (KvWriter::WriteLayer): INVALID_ARGUMENT
// if `layer` is out of range, `local_block_ids` does not have one entry per
// destination block, or names a block outside the local cache.
// REQUIRES: ValidateKvDestination(local_spec, destination).ok().
absl::Status CheckLayerBlocks(const kv::KvCacheSpec& local_spec,
                              const trident::v1::KvDestination& destination, int32_t layer,
                              absl::Span<const int32_t> local_block_ids);

// The bytes of one KV message: `max_message_bytes` rounded down to whole
// blocks of `block_stride_bytes`, at least one block.
uint64_t KvMessageBytes(uint64_t block_stride_bytes, uint64_t max_message_bytes);

// `puts` split, in order, into pieces of at most `message_bytes` (a multiple
// of the block stride, e.g. from KvMessageBytes): the messages of
// KvWriteMode::kMessage. REQUIRES: message_bytes > 0.
std::vector<KvPut> SplitKvPuts(absl::Span<const KvPut> puts, uint64_t message_bytes);

// Writes one sequence's KV into one destination. Create once per transfer;
// call WriteLayer for each layer as it is computed (in any order, several at
// once if wanted). Thread-safe; the callbacks run on the UcxWorker's progress
// thread and may outlive the writer.
class KvWriter {
 public:
  // Validates `destination` (see ValidateKvDestination) and unpacks its
  // regions' rkeys against `endpoint`, which must lead to
  // destination.endpoint (the caller keeps one endpoint per peer
  // incarnation). `local_base` is the first byte of a KV cache laid out by
  // `local_spec`, inside memory registered with the endpoint's worker; it
  // must outlive every WriteLayer callback. Errors: those of validation, and
  // those of Endpoint::UnpackRkey (as INVALID_ARGUMENT naming
  // "destination.regions[i].rkey", or UNAVAILABLE); FAILED_PRECONDITION in
  // kPut mode for a region that takes messages only (kMessagesOnlyRkey).
  //
  // In KvWriteMode::kMessage no rkey is unpacked and each collated put
  // becomes one or more messages of at most `max_message_bytes` (rounded
  // down to whole blocks, at least one block), sent by rendezvous where
  // RendezvousForLane(endpoint->lane()).
  // In kMessage mode, `more_endpoints` (other lanes to the same peer: see
  // TransportEndpoint.lane_worker_addresses) carry messages too, in turn with
  // `endpoint`.
  static absl::StatusOr<std::unique_ptr<KvWriter>> Create(
      const kv::KvCacheSpec& local_spec, const void* local_base, std::shared_ptr<Endpoint> endpoint,
      const trident::v1::KvDestination& destination, KvWriteMode mode = KvWriteMode::kPut,
      uint64_t max_message_bytes = 4 << 20,
      std::vector<std::shared_ptr<Endpoint>> more_endpoints = {});

  // Posts the puts for `layer` of the blocks `local_block_ids` (one local
  // block per destination block, in token order) and then a flush; `done`
  // runs once, when all of them have completed at the peer (OK) or with the
  // first error: UNAVAILABLE if the peer failed. In kMessage mode: posts the
  // messages; `done` runs when they were sent (the receiver confirms
  // delivery by its byte count). INVALID_ARGUMENT (without
  // posting anything) if `layer` is out of range, local_block_ids does not
  // have one entry per destination block, or names a block outside the local
  // cache. REQUIRES: the local blocks hold the layer's KV until `done` runs.
  void WriteLayer(int32_t layer, absl::Span<const int32_t> local_block_ids, DoneCallback done);

  // Puts posted and their bytes (KvTransferDone.messages and, once every
  // layer is done, sent_bytes).
  int64_t messages_posted() const { return stats_->messages_posted.load(); }
  int64_t bytes_posted() const { return stats_->bytes_posted.load(); }
  // Bytes of layers whose writes completed OK (KvTransferProgress).
  int64_t bytes_completed() const { return stats_->bytes_completed.load(); }
  int32_t layers_completed() const { return stats_->layers_completed.load(); }
  // The endpoint's lane (KvTransferDone.lane).
  const std::string& lane() const { return endpoint_->lane(); }
  KvWriteMode mode() const { return mode_; }

 private:
  // Shared with in-flight callbacks, which may outlive the writer.
  struct Stats {
    std::atomic<int64_t> messages_posted{0};
    std::atomic<int64_t> bytes_posted{0};
    std::atomic<int64_t> bytes_completed{0};
    std::atomic<int32_t> layers_completed{0};
  };

  KvWriter(const kv::KvCacheSpec& local_spec, const void* local_base,
           std::shared_ptr<Endpoint> endpoint, trident::v1::KvDestination destination,
           std::vector<std::shared_ptr<RemoteKey>> rkeys, KvWriteMode mode,
           uint64_t max_message_bytes, std::vector<std::shared_ptr<Endpoint>> more_endpoints);

  const kv::KvCacheSpec local_spec_;
  const char* const local_base_;
  const std::shared_ptr<Endpoint> endpoint_;
  const trident::v1::KvDestination destination_;
  // One per destination region.
  const std::vector<std::shared_ptr<RemoteKey>> rkeys_;
  const KvWriteMode mode_;
  // Messages go by rendezvous (RendezvousForLane).
  const bool rendezvous_;
  const uint64_t max_message_bytes_;
  // Lanes for messages: endpoint_ and the others, in turn from next_lane_.
  const std::vector<std::shared_ptr<Endpoint>> message_endpoints_;
  size_t next_lane_ = 0;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_KV_WRITER_H_
