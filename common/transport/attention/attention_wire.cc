#include "common/transport/attention/attention_wire.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace trident::transport::attention {
namespace {

absl::Status CheckDType(WireDType dtype) {
  if (dtype == WireDType::kF32 || dtype == WireDType::kBF16) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype ", static_cast<int>(dtype), " is neither f32 (1) nor bf16 (3)"));
}

absl::Status InRange(const char* field, int64_t value, int64_t low, int64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value, "; must be ", low, " to ", high));
}

absl::Status CheckShape(const RequestHeader& h) {
  TRIDENT_RETURN_IF_ERROR(InRange("num_sequences", h.num_sequences, 1, kMaxSequencesPerRequest));
  TRIDENT_RETURN_IF_ERROR(InRange("num_q_heads", h.num_q_heads, 1, kMaxHeads));
  TRIDENT_RETURN_IF_ERROR(InRange("num_kv_heads", h.num_kv_heads, 1, kMaxHeads));
  TRIDENT_RETURN_IF_ERROR(InRange("head_dim", h.head_dim, 1, kMaxHeadDim));
  if (h.num_q_heads % h.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads (", h.num_q_heads,
                                                   ") is not a multiple of num_kv_heads (",
                                                   h.num_kv_heads, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

size_t WireElementSize(WireDType dtype) { return dtype == WireDType::kBF16 ? 2 : 4; }

absl::string_view WireDTypeName(WireDType dtype) {
  return dtype == WireDType::kBF16 ? "bf16" : "f32";
}

size_t RequestDataBytes(const RequestHeader& h) {
  return static_cast<size_t>(h.num_sequences) *
         (sizeof(SequenceEntry) +
          static_cast<size_t>(QkvRowElements(h)) * WireElementSize(h.dtype));
}

size_t ReplyDataBytes(const ReplyHeader& h) {
  if ((h.flags & kAppendOnly) != 0) return 0;
  if ((h.flags & kBlocks) != 0) return 0;  // Checked by the requester.
  return static_cast<size_t>(h.num_sequences) * h.num_q_heads * h.head_dim *
         WireElementSize(h.dtype);
}

RequestHeader BlockRequestHeader(bool put, uint64_t ticket, int32_t first, int32_t count,
                                 uint64_t owner_incarnation, int32_t lane) {
  return RequestHeader{.dtype = WireDType::kF32,
                       .flags = static_cast<uint8_t>(put ? (kBlocks | kAppendOnly) : kBlocks),
                       .owner_incarnation = owner_incarnation,
                       .layer = first,
                       .num_sequences = count,
                       .num_q_heads = 0,
                       .num_kv_heads = 0,
                       .head_dim = 0,
                       .lane = lane,
                       .write_key = ticket};
}

namespace {

absl::StatusOr<RequestView> DecodeBlockRequest(RequestView view, absl::string_view data) {
  const RequestHeader& h = view.header;
  if ((h.flags & kPromptWrite) != 0 || h.write_key == 0) {
    return absl::InvalidArgumentError("a block request carries a ticket and no prompt write");
  }
  TRIDENT_RETURN_IF_ERROR(InRange("num_sequences", h.num_sequences, 1, kMaxSequencesPerRequest));
  TRIDENT_RETURN_IF_ERROR(InRange("layer (first block)", h.layer, 0, int64_t{1} << 30));
  const bool put = (h.flags & kAppendOnly) != 0;
  if (put == data.empty()) {
    return absl::InvalidArgumentError(put ? "a block put carries no blocks"
                                          : "a block get carries data");
  }
  view.rows = data.data();
  view.block_bytes = data.size();
  return view;
}

}  // namespace

absl::StatusOr<RequestView> DecodeRequest(absl::string_view header, absl::string_view data) {
  if (header.size() != sizeof(RequestHeader)) {
    return absl::InvalidArgumentError(absl::StrCat("request header is ", header.size(),
                                                   " bytes; expected ", sizeof(RequestHeader)));
  }
  RequestView view;
  std::memcpy(&view.header, header.data(), sizeof(RequestHeader));
  const RequestHeader& h = view.header;
  if (h.magic != kRequestMagic || h.version != kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("not an attention request of version ",
                                                   kWireVersion, " (magic ", h.magic, ", version ",
                                                   h.version, ")"));
  }
  TRIDENT_RETURN_IF_ERROR(CheckDType(h.dtype));
  if ((h.flags & ~(kAppendOnly | kPromptWrite | kBlocks)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown request flags ", int{h.flags}));
  }
  if ((h.flags & kBlocks) != 0) return DecodeBlockRequest(std::move(view), data);
  const bool prompt_write = (h.flags & kPromptWrite) != 0;
  if (prompt_write && ((h.flags & kAppendOnly) == 0 || h.write_key == 0)) {
    return absl::InvalidArgumentError("a prompt write must be append-only and carry a write key");
  }
  if (!prompt_write && h.write_key != 0) {
    return absl::InvalidArgumentError("only a prompt write carries a write key");
  }
  TRIDENT_RETURN_IF_ERROR(CheckShape(h));
  if (data.size() != RequestDataBytes(h)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request data is ", data.size(), " bytes; its header implies ", RequestDataBytes(h)));
  }
  if (reinterpret_cast<uintptr_t>(data.data()) % alignof(SequenceEntry) != 0) {
    return absl::InvalidArgumentError("request data is not 8-byte aligned");
  }
  view.sequences = absl::MakeConstSpan(reinterpret_cast<const SequenceEntry*>(data.data()),
                                       static_cast<size_t>(h.num_sequences));
  view.rows = data.data() + sizeof(SequenceEntry) * h.num_sequences;
  return view;
}

absl::StatusOr<ReplyView> DecodeReply(absl::string_view header, size_t data_bytes) {
  if (header.size() < sizeof(ReplyHeader) || header.size() > sizeof(ReplyHeader) + kMaxErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reply header is ", header.size(), " bytes; expected ", sizeof(ReplyHeader),
                     " plus at most ", kMaxErrorBytes, " of error message"));
  }
  ReplyView view;
  std::memcpy(&view.header, header.data(), sizeof(ReplyHeader));
  const ReplyHeader& h = view.header;
  if (h.magic != kReplyMagic || h.version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an attention reply of version ", kWireVersion));
  }
  TRIDENT_RETURN_IF_ERROR(CheckDType(h.dtype));
  view.error = std::string(header.substr(sizeof(ReplyHeader)));
  if (h.status_code == 0 && (h.flags & kBlocks) != 0) {
    TRIDENT_RETURN_IF_ERROR(InRange("num_sequences", h.num_sequences, 1, kMaxSequencesPerRequest));
    if (((h.flags & kAppendOnly) != 0) != (data_bytes == 0)) {
      return absl::InvalidArgumentError("a block reply's data does not match its kind");
    }
  } else if (h.status_code == 0 && (h.flags & kAppendOnly) != 0) {
    if (data_bytes != 0) {
      return absl::InvalidArgumentError("an append-only reply carries no data");
    }
  } else if (h.status_code == 0) {
    TRIDENT_RETURN_IF_ERROR(InRange("num_sequences", h.num_sequences, 1, kMaxSequencesPerRequest));
    TRIDENT_RETURN_IF_ERROR(InRange("num_q_heads", h.num_q_heads, 1, kMaxHeads));
    TRIDENT_RETURN_IF_ERROR(InRange("head_dim", h.head_dim, 1, kMaxHeadDim));
    if (data_bytes != ReplyDataBytes(h)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reply data is ", data_bytes, " bytes; its header implies ", ReplyDataBytes(h)));
    }
  }
  return view;
}

std::string EncodeReplyHeader(const ReplyHeader& header, absl::string_view error) {
  std::string bytes(reinterpret_cast<const char*>(&header), sizeof(header));
  const absl::string_view kept = error.substr(0, kMaxErrorBytes);
  bytes.append(kept.data(), kept.size());
  return bytes;
}

std::string EncodeRequestHeader(const RequestHeader& header) {
  return std::string(reinterpret_cast<const char*>(&header), sizeof(header));
}

void ToWire(WireDType dtype, const float* src, char* dst, size_t n) {
  if (dtype == WireDType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  numeric::FloatToBf16(src, reinterpret_cast<uint16_t*>(dst), n);
}

void FromWire(WireDType dtype, const char* src, float* dst, size_t n) {
  if (dtype == WireDType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  numeric::Bf16ToFloat(reinterpret_cast<const uint16_t*>(src), dst, n);
}

}  // namespace trident::transport::attention
