// Feeds arbitrary bytes to the attention data plane's decoders
// (common/transport/attention/attention_wire.h). The input is a two-byte
// header length, the header bytes, then the data, which is copied into a
// buffer of exactly its size (8-byte aligned, so ASan sees any read past
// it).
//
// An accepted request must satisfy the documented bounds, its data length
// must be RequestDataBytes(header), and every sequence entry and row the
// view points to is read (and the rows converted from the wire format). The
// same data one byte off alignment must be refused. A decoded header encodes
// back to the same bytes and decodes again; a header BlockRequestHeader
// builds decodes. An accepted reply must satisfy its bounds and re-encode
// to the same bytes.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/testing/fuzz_input.h"
#include "common/transport/attention/attention_wire.h"

namespace {

namespace aw = trident::transport::attention;

// A copy of `bytes` in a buffer of exactly their size, `offset` bytes into
// a fresh allocation (which is at least 8-byte aligned).
class Buffer {
 public:
  Buffer(absl::string_view bytes, size_t offset)
      : storage_(new char[bytes.size() + offset]), offset_(offset), size_(bytes.size()) {
    if (size_ > 0) std::memcpy(storage_.get() + offset_, bytes.data(), size_);
  }
  absl::string_view view() const { return absl::string_view(storage_.get() + offset_, size_); }

 private:
  std::unique_ptr<char[]> storage_;
  size_t offset_;
  size_t size_;
};

void ExpectInvalid(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) abort();
}

bool InRange(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

// Reads every byte of [p, p + n) into a checksum.
uint8_t Touch(const char* p, size_t n) {
  uint8_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum ^= static_cast<uint8_t>(p[i]);
  return sum;
}

void CheckBlockRequest(const aw::RequestView& v, absl::string_view data) {
  const aw::RequestHeader& h = v.header;
  if ((h.flags & aw::kPromptWrite) != 0 || h.write_key == 0) abort();
  if (!InRange(h.num_sequences, 1, aw::kMaxSequencesPerRequest)) abort();
  if (!InRange(h.layer, 0, int64_t{1} << 30)) abort();
  const bool put = (h.flags & aw::kAppendOnly) != 0;
  if (put == data.empty()) abort();
  if (!v.sequences.empty() || v.block_bytes != data.size()) abort();
  if (put && v.rows != data.data()) abort();
  volatile uint8_t sink = Touch(v.rows, v.block_bytes);
  (void)sink;
}

void CheckSequenceRequest(const aw::RequestView& v, absl::string_view data) {
  const aw::RequestHeader& h = v.header;
  const bool append = (h.flags & aw::kAppendOnly) != 0;
  const bool prompt_write = (h.flags & aw::kPromptWrite) != 0;
  if (prompt_write && (!append || h.write_key == 0)) abort();
  if (!prompt_write && h.write_key != 0) abort();
  if (!InRange(h.num_sequences, 1, aw::kMaxSequencesPerRequest) ||
      !InRange(h.num_q_heads, 1, aw::kMaxHeads) || !InRange(h.num_kv_heads, 1, aw::kMaxHeads) ||
      !InRange(h.head_dim, 1, aw::kMaxHeadDim) || h.num_q_heads % h.num_kv_heads != 0) {
    abort();
  }
  const size_t n = static_cast<size_t>(h.num_sequences);
  const size_t element = h.dtype == aw::WireDType::kBF16 ? 2 : 4;
  const size_t row_elements =
      static_cast<size_t>((append ? 0 : h.num_q_heads) + 2 * h.num_kv_heads) * h.head_dim;
  if (aw::WireElementSize(h.dtype) != element ||
      static_cast<size_t>(aw::QkvRowElements(h)) != row_elements) {
    abort();
  }
  const size_t row_bytes = row_elements * element;
  if (data.size() != aw::RequestDataBytes(h) ||
      data.size() != n * (sizeof(aw::SequenceEntry) + row_bytes)) {
    abort();
  }
  if (v.sequences.size() != n || reinterpret_cast<const char*>(v.sequences.data()) != data.data() ||
      v.rows != data.data() + n * sizeof(aw::SequenceEntry) || v.block_bytes != 0) {
    abort();
  }
  uint64_t sum = 0;
  for (const aw::SequenceEntry& e : v.sequences) {
    sum += e.handle + static_cast<uint64_t>(e.position) + static_cast<uint64_t>(e.reserved);
  }
  std::vector<float> row(row_elements);
  float total = 0;
  for (size_t i = 0; i < n; ++i) {
    const char* r = v.rows + i * row_bytes;
    sum += Touch(r, row_bytes);
    aw::FromWire(h.dtype, r, row.data(), row_elements);
    for (float f : row) total += f;
  }
  volatile uint64_t sink = sum + static_cast<uint64_t>(std::isnan(total));
  (void)sink;
}

void CheckRequest(absl::string_view header, absl::string_view data_bytes) {
  const Buffer aligned(data_bytes, 0);
  const absl::string_view data = aligned.view();
  absl::StatusOr<aw::RequestView> v = aw::DecodeRequest(header, data);
  if (!v.ok()) {
    ExpectInvalid(v.status());
    return;
  }
  const aw::RequestHeader& h = v->header;
  if (header.size() != sizeof(aw::RequestHeader) || h.magic != aw::kRequestMagic ||
      h.version != aw::kWireVersion ||
      (h.dtype != aw::WireDType::kF32 && h.dtype != aw::WireDType::kBF16) ||
      (h.flags & ~(aw::kAppendOnly | aw::kPromptWrite | aw::kBlocks)) != 0) {
    abort();
  }
  const bool blocks = (h.flags & aw::kBlocks) != 0;
  if (blocks) {
    CheckBlockRequest(*v, data);
  } else {
    CheckSequenceRequest(*v, data);
    // The same data off alignment is refused.
    const Buffer misaligned(data_bytes, 1);
    absl::StatusOr<aw::RequestView> off = aw::DecodeRequest(header, misaligned.view());
    if (off.ok()) abort();
    ExpectInvalid(off.status());
  }
  const std::string encoded = aw::EncodeRequestHeader(h);
  if (encoded != header) abort();
  absl::StatusOr<aw::RequestView> again = aw::DecodeRequest(encoded, data);
  if (!again.ok() || std::memcmp(&again->header, &h, sizeof(h)) != 0) abort();
}

// A header BlockRequestHeader builds, with arguments in range, decodes.
void CheckBlockHeader(trident::testing::FuzzInput& in) {
  const bool put = in.Take<uint8_t>() % 2 == 1;
  const uint64_t ticket = in.Take<uint64_t>() | 1;
  const int32_t first = in.Take<int32_t>() & ((1 << 30) - 1);
  const int32_t count = 1 + in.Take<uint16_t>() % aw::kMaxSequencesPerRequest;
  const uint64_t owner = in.Take<uint64_t>();
  const int32_t lane = in.Take<int32_t>();
  const aw::RequestHeader h = aw::BlockRequestHeader(put, ticket, first, count, owner, lane);
  const Buffer data(put ? absl::string_view("blocks!!") : absl::string_view(), 0);
  absl::StatusOr<aw::RequestView> v = aw::DecodeRequest(aw::EncodeRequestHeader(h), data.view());
  if (!v.ok() || v->header.write_key != ticket || v->header.layer != first ||
      v->header.num_sequences != count || v->header.owner_incarnation != owner ||
      v->header.lane != lane || v->block_bytes != data.view().size()) {
    abort();
  }
}

void CheckReply(absl::string_view header, size_t data_bytes) {
  absl::StatusOr<aw::ReplyView> v = aw::DecodeReply(header, data_bytes);
  if (!v.ok()) {
    ExpectInvalid(v.status());
    return;
  }
  const aw::ReplyHeader& h = v->header;
  if (header.size() < sizeof(aw::ReplyHeader) ||
      header.size() > sizeof(aw::ReplyHeader) + aw::kMaxErrorBytes || h.magic != aw::kReplyMagic ||
      h.version != aw::kWireVersion ||
      (h.dtype != aw::WireDType::kF32 && h.dtype != aw::WireDType::kBF16) ||
      v->error != header.substr(sizeof(aw::ReplyHeader))) {
    abort();
  }
  if (h.status_code == 0) {
    const bool append = (h.flags & aw::kAppendOnly) != 0;
    if ((h.flags & aw::kBlocks) != 0) {
      if (!InRange(h.num_sequences, 1, aw::kMaxSequencesPerRequest)) abort();
      if (append != (data_bytes == 0)) abort();
    } else if (append) {
      if (data_bytes != 0 || aw::ReplyDataBytes(h) != 0) abort();
    } else {
      if (!InRange(h.num_sequences, 1, aw::kMaxSequencesPerRequest) ||
          !InRange(h.num_q_heads, 1, aw::kMaxHeads) || !InRange(h.head_dim, 1, aw::kMaxHeadDim)) {
        abort();
      }
      const size_t expected = static_cast<size_t>(h.num_sequences) * h.num_q_heads * h.head_dim *
                              aw::WireElementSize(h.dtype);
      if (data_bytes != expected || aw::ReplyDataBytes(h) != expected) abort();
    }
  }
  const std::string encoded = aw::EncodeReplyHeader(h, v->error);
  if (encoded != header) abort();
  absl::StatusOr<aw::ReplyView> again = aw::DecodeReply(encoded, data_bytes);
  if (!again.ok() || again->error != v->error) abort();
  // An error message is cut to kMaxErrorBytes.
  const std::string long_error(aw::kMaxErrorBytes + 1 + v->error.size(), 'e');
  if (aw::EncodeReplyHeader(h, long_error).size() != sizeof(h) + aw::kMaxErrorBytes) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trident::testing::FuzzInput in(data, size);
  const absl::string_view header = in.TakeBytes(in.Take<uint16_t>() % 512);
  const absl::string_view rest = in.TakeRest();
  CheckRequest(header, rest);
  CheckReply(header, rest.size());
  trident::testing::FuzzInput tail(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  CheckBlockHeader(tail);
  return 0;
}
