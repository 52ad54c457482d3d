// The decode worker's side of the attention data plane: one per-layer
// request for a batch of CPU-resident sequences held by one attention
// service, answered with their attention outputs.
//
//   RemoteAttention& service = ...;
//   TRIDENT_ASSIGN_OR_RETURN(auto ticket, service.Start(call));   // sends
//   ... the GPU (or the CPU) runs the other sub-batch's layers ...
//   TRIDENT_RETURN_IF_ERROR(service.Wait(ticket, timeout));      // o is in call.out
//
// Implementations: UcxAttentionClient (ucx_attention_client.h) over UCX;
// FakeRemoteAttention (fake_remote_attention.h), in process, for tests.

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_REMOTE_ATTENTION_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_REMOTE_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/transport/attention/attention_wire.h"

namespace trident::transport::attention {

// One layer's request for a batch of sequences.
struct AttentionCall {
  int32_t layer = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Format on the wire: f32 (exact), or bf16 (half the bytes).
  WireDType dtype = WireDType::kF32;
  // Per sequence: its handle at the service and the new token's position.
  absl::Span<const uint64_t> handles;
  absl::Span<const int32_t> positions;
  // Row i (sequence i): q at q + i * q_stride (num_q_heads * head_dim
  // floats, head-major), k and v at k + i * k_stride and v + i * v_stride
  // (num_kv_heads * head_dim each). Read during Start only.
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  // Where o of row i goes: out + i * out_stride (num_q_heads * head_dim
  // floats). Written before Wait returns OK, never after Wait returns.
  float* out = nullptr;
  int64_t out_stride = 0;
  // Instead of q, k, v and out, with dtype kBF16: row i's [q | k | v] as
  // bf16 bits at qkv_bf16 + i * qkv_bf16_stride, sent as they are, and its o
  // written as bf16 bits at out_bf16 + i * out_bf16_stride (no conversion
  // on either side of the wire).
  const uint16_t* qkv_bf16 = nullptr;
  int64_t qkv_bf16_stride = 0;
  uint16_t* out_bf16 = nullptr;
  int64_t out_bf16_stride = 0;
};

// Writes KV without attending (a prompt's, or a migrated sequence's): entry
// i stores k and v of token positions[i] of sequence handles[i] in `layer`.
// A sequence may appear once per token.
struct KvAppendCall {
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  WireDType dtype = WireDType::kF32;
  absl::Span<const uint64_t> handles;
  absl::Span<const int32_t> positions;
  // Entry i's rows (num_kv_heads * head_dim floats each). Read during
  // StartAppend only.
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  // Instead of k and v, with dtype kBF16: the rows as bf16 bits (at
  // k_bf16 + i * k_stride and v_bf16 + i * v_stride), sent as they are.
  const uint16_t* k_bf16 = nullptr;
  const uint16_t* v_bf16 = nullptr;
  // Nonzero: a prompt write from a session that does not own the sequences
  // (the prefill worker that computed the prompt), authorized by their
  // write key (AdmitSequenceResponse.write_key).
  uint64_t write_key = 0;
};

// Moves blocks [first, first + count) of a block-store ticket (from
// Attention.ReserveBlocks: a put; LookupBlocks: a get). A put's `data`
// (count blocks' bytes) is read during StartBlockPut only; a get's blocks
// land in `out` (`bytes` long) before Wait returns OK, never after Wait
// returns.
struct BlockPutCall {
  uint64_t ticket = 0;
  int32_t first = 0;
  int32_t count = 0;
  const char* data = nullptr;
  size_t bytes = 0;
};
struct BlockGetCall {
  uint64_t ticket = 0;
  int32_t first = 0;
  int32_t count = 0;
  char* out = nullptr;
  size_t bytes = 0;
};

// Thread-safe.
class RemoteAttention {
 public:
  using Ticket = uint64_t;

  virtual ~RemoteAttention() = default;

  // Sends the request (q, k, v are copied or sent before it returns).
  // INVALID_ARGUMENT for a malformed call; UNAVAILABLE when the service is
  // known to be gone.
  virtual absl::StatusOr<Ticket> Start(const AttentionCall& call) = 0;

  // Sends an append-only request; Wait's OK means the KV is written.
  virtual absl::StatusOr<Ticket> StartAppend(const KvAppendCall& call) = 0;

  // Block-store transfers; Wait's OK means the put's blocks are readable at
  // the service, or the get's are in call.out. UNIMPLEMENTED unless
  // overridden.
  virtual absl::StatusOr<Ticket> StartBlockPut(const BlockPutCall& call) {
    (void)call;
    return absl::UnimplementedError("no block store behind this channel");
  }
  virtual absl::StatusOr<Ticket> StartBlockGet(const BlockGetCall& call) {
    (void)call;
    return absl::UnimplementedError("no block store behind this channel");
  }

  // Waits for the request's reply: OK once call.out holds o. The service's
  // error as it reported it (NOT_FOUND for an unknown handle,
  // FAILED_PRECONDITION for a stale incarnation, OUT_OF_RANGE, ...);
  // UNAVAILABLE when the service failed, or DEADLINE_EXCEEDED when it did
  // not answer within `timeout` (out is then never written). Each ticket is
  // waited for once; NOT_FOUND for an unknown ticket.
  virtual absl::Status Wait(Ticket ticket, absl::Duration timeout) = 0;
};

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_REMOTE_ATTENTION_H_
