// The messages of the attention data plane (decode worker <-> CPU attention
// service), one UCX active message each way per (layer, batch):
//
//   request  id kAttentionRequestMessageId
//     header  RequestHeader
//     data    num_sequences x SequenceEntry          (16 bytes each), then
//             num_sequences x [q | k | v]            (wire dtype), where
//             q is [num_q_heads][head_dim], k and v [num_kv_heads][head_dim]:
//             the sequence's query and its new token's key and value, at
//             SequenceEntry.position.
//   reply    id kAttentionReplyMessageId
//     header  ReplyHeader, then the error message (at most kMaxErrorBytes)
//     data    OK: num_sequences x o [num_q_heads][head_dim] (wire dtype),
//             in request order; an error: empty.
//
// The service appends each k/v at its position, attends over positions
// [0, position] of the sequence, and answers o.
//
// An append-only request (flags & kAppendOnly) carries [k | v] rows only,
// and may name a sequence once per token: it writes KV (a prompt's, or a
// sequence's migrated from a decode worker's cache) without attending, and
// its OK reply has no data. A prompt write (flags kAppendOnly | kPromptWrite)
// is an append-only request from a session other than the owner's (the
// prefill worker that computed the prompt): it names sequences by handle
// and carries their write key (AdmitSequenceResponse.write_key) in place of
// the owner's incarnation, and is refused once the owner has attended.
//
// A block-store request (flags & kBlocks) moves whole KV blocks of the
// service's block store (services/attention/kv_store/block_store.h) under
// a ticket from Attention.ReserveBlocks or LookupBlocks: write_key carries
// the ticket, layer the first block of the ticket it covers, num_sequences
// the count of blocks; the shape fields are 0. With kAppendOnly it is a
// put: its data is the blocks' bytes, and its OK reply has none. Without,
// a get: it has no data, and its OK reply's data is the blocks' bytes.
// Integers are little-endian
// (both ends are x86-64); the structs are copied byte for byte.
//
// Decoding checks every size against the header and the data length, so a
// truncated or inconsistent message is an INVALID_ARGUMENT, never a read
// past the buffer.

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_ATTENTION_WIRE_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_ATTENTION_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::transport::attention {

inline constexpr uint16_t kAttentionRequestMessageId = 0x4151;  // "AQ"
inline constexpr uint16_t kAttentionReplyMessageId = 0x4152;    // "AR"
inline constexpr uint32_t kRequestMagic = 0x31514154;           // "TAQ1"
inline constexpr uint32_t kReplyMagic = 0x31524154;             // "TAR1"
// Requests with at least this much data go by rendezvous (the service
// fetches them straight into its buffer, zero-copy where the transport
// allows); smaller ones eagerly, in one message.
inline constexpr size_t kRendezvousBytes = size_t{64} << 10;
inline constexpr uint16_t kWireVersion = 2;
inline constexpr size_t kMaxErrorBytes = 256;
// Bounds that keep one message's sizes far from overflow.
inline constexpr int32_t kMaxSequencesPerRequest = 4096;
inline constexpr int32_t kMaxHeads = 1024;
inline constexpr int32_t kMaxHeadDim = 256;

// RequestHeader.flags and ReplyHeader.flags.
inline constexpr uint8_t kAppendOnly = 1;
// With kAppendOnly: a prompt write, authorized by RequestHeader.write_key.
inline constexpr uint8_t kPromptWrite = 2;
// Moves block-store blocks (see above); with kAppendOnly, a put.
inline constexpr uint8_t kBlocks = 4;

// Element format of q, k, v and o on the wire.
enum class WireDType : uint8_t { kF32 = 1, kBF16 = 3 };

struct RequestHeader {
  uint32_t magic = kRequestMagic;
  uint16_t version = kWireVersion;
  WireDType dtype = WireDType::kF32;
  uint8_t flags = 0;
  // Chosen by the requester, echoed by the reply.
  uint64_t request_id = 0;
  // The requester's incarnation (its session's): names where the reply goes
  // and must own every sequence named.
  uint64_t owner_incarnation = 0;
  int32_t layer = 0;
  int32_t num_sequences = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // The requester's lane the request came from; the reply goes back on it.
  int32_t lane = 0;
  // kPromptWrite: the sequences' write key; else 0.
  uint64_t write_key = 0;
};
static_assert(sizeof(RequestHeader) == 56);

struct SequenceEntry {
  uint64_t handle = 0;   // AdmitSequenceResponse.handle.
  int32_t position = 0;  // The new token's position (context = position + 1).
  int32_t reserved = 0;
};
static_assert(sizeof(SequenceEntry) == 16);

struct ReplyHeader {
  uint32_t magic = kReplyMagic;
  uint16_t version = kWireVersion;
  WireDType dtype = WireDType::kF32;
  uint8_t flags = 0;
  uint64_t request_id = 0;
  // An absl::StatusCode; OK when the data holds o.
  int32_t status_code = 0;
  int32_t num_sequences = 0;
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;
};
static_assert(sizeof(ReplyHeader) == 32);

size_t WireElementSize(WireDType dtype);
absl::string_view WireDTypeName(WireDType dtype);

// Elements of one entry's row: [q | k | v], or [k | v] when append-only.
inline int64_t QkvRowElements(const RequestHeader& h) {
  const int32_t q_heads = (h.flags & kAppendOnly) != 0 ? 0 : h.num_q_heads;
  return int64_t{q_heads + 2 * h.num_kv_heads} * h.head_dim;
}
// Bytes of a request's data, and of an OK reply's data.
size_t RequestDataBytes(const RequestHeader& header);
size_t ReplyDataBytes(const ReplyHeader& header);

// A decoded request; views into the message's bytes.
struct RequestView {
  RequestHeader header;
  absl::Span<const SequenceEntry> sequences;  // May be unaligned-safe copies:
  // sequences point into `data`, which UCX aligns to 8 bytes at least.
  const char* rows = nullptr;  // num_sequences x [q | k | v].
  // A block put's bytes (rows points at them); 0 otherwise.
  size_t block_bytes = 0;
};

// The header of a block-store request: a put of `count` blocks (its data
// count * block bytes) or a get.
RequestHeader BlockRequestHeader(bool put, uint64_t ticket, int32_t first, int32_t count,
                                 uint64_t owner_incarnation, int32_t lane);

// Decodes a request message. INVALID_ARGUMENT naming what is wrong: a bad
// magic or version, a dtype other than f32/bf16, counts out of bounds
// (num_sequences 1..kMaxSequencesPerRequest, heads 1..kMaxHeads with
// num_q_heads a multiple of num_kv_heads, head_dim 1..kMaxHeadDim), or a
// data length that is not RequestDataBytes(header). `data` must be 8-byte
// aligned (INVALID_ARGUMENT otherwise) and outlive the view.
absl::StatusOr<RequestView> DecodeRequest(absl::string_view header, absl::string_view data);

// Decodes a reply's header and error message: INVALID_ARGUMENT for a bad
// magic/version/dtype, or, when OK, a data length that is not
// ReplyDataBytes(header).
struct ReplyView {
  ReplyHeader header;
  std::string error;
};
absl::StatusOr<ReplyView> DecodeReply(absl::string_view header, size_t data_bytes);

// The header bytes of a reply: its struct, then `error` cut to
// kMaxErrorBytes.
std::string EncodeReplyHeader(const ReplyHeader& header, absl::string_view error);
// The header bytes of a request.
std::string EncodeRequestHeader(const RequestHeader& header);

// Converts `n` elements between float and the wire format.
void ToWire(WireDType dtype, const float* src, char* dst, size_t n);
void FromWire(WireDType dtype, const char* src, float* dst, size_t n);

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_ATTENTION_WIRE_H_
