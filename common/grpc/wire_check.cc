#include "common/grpc/wire_check.h"

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status/error_details.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace trident {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// The most bytes protobuf's parser reads for a tag or a length.
constexpr int kMaxVarint32Bytes = 5;

// Well-formed UTF-8 as protobuf requires of proto3 strings: no overlong
// forms, no surrogates, nothing past U+10FFFF.
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i <= static_cast<size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

const char* WireTypeName(int wire_type) {
  switch (wire_type) {
    case WireFormatLite::WIRETYPE_VARINT:
      return "varint";
    case WireFormatLite::WIRETYPE_FIXED64:
      return "fixed64";
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
      return "length-delimited";
    case WireFormatLite::WIRETYPE_START_GROUP:
      return "start-group";
    case WireFormatLite::WIRETYPE_END_GROUP:
      return "end-group";
    case WireFormatLite::WIRETYPE_FIXED32:
      return "fixed32";
    default:
      return "invalid";
  }
}

// Walks one message's fields from `in` up to its current limit.
class Walker {
 public:
  explicit Walker(const Descriptor& root) : root_(root) {}

  absl::Status Walk(CodedInputStream& in, const Descriptor& type, const std::string& prefix,
                    int depth) {
    absl::flat_hash_map<int, int> occurrences;
    std::string last;  // The field before, for naming a malformed tag.
    while (in.BytesUntilLimit() > 0) {
      const int tag_start = in.CurrentPosition();
      const uint32_t tag = in.ReadTag();
      const int number = static_cast<int>(tag >> 3);
      // CodedInputStream takes tags of up to 10 bytes, protobuf's parser
      // those of up to 5.
      if (tag == 0 || number == 0 || in.CurrentPosition() - tag_start > kMaxVarint32Bytes) {
        const std::string where = last.empty() ? (prefix.empty() ? "(request)" : prefix) : last;
        return Bad(where, last.empty() ? "its first field has a malformed or zero tag"
                                       : "the field after it has a malformed or zero tag");
      }
      const int wire_type = static_cast<int>(tag & 7);
      const FieldDescriptor* field = type.FindFieldByNumber(number);
      std::string name =
          absl::StrCat(prefix, prefix.empty() ? "" : ".",
                       field != nullptr ? field->name() : absl::StrCat("field ", number));
      const bool packed_chunk = field != nullptr && field->is_repeated() && field->is_packable() &&
                                wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
      if (field != nullptr && field->is_repeated() && !packed_chunk) {
        absl::StrAppend(&name, "[", occurrences[number]++, "]");
      }
      if (absl::Status s = Field(in, field, wire_type, name, packed_chunk, depth); !s.ok()) {
        return s;
      }
      last = std::move(name);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(const std::string& field, absl::string_view problem) const {
    return InvalidArgumentForField(
        field, absl::StrCat(problem, " (the request is not a valid ", root_.full_name(), ")"));
  }

  absl::Status Field(CodedInputStream& in, const FieldDescriptor* field, int wire_type,
                     const std::string& name, bool packed_chunk, int depth) {
    if (field != nullptr && !packed_chunk) {
      const int expected = WireFormatLite::WireTypeForFieldType(
          static_cast<WireFormatLite::FieldType>(field->type()));
      if (expected != wire_type) {
        return Bad(name, absl::StrCat("is sent as ", WireTypeName(wire_type),
                                      " but its type is encoded as ", WireTypeName(expected)));
      }
    }
    switch (wire_type) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t value;
        if (!in.ReadVarint64(&value)) return Bad(name, "has a truncated or overlong varint");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        uint64_t value;
        if (!in.ReadLittleEndian64(&value)) return Bad(name, "is truncated");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t value;
        if (!in.ReadLittleEndian32(&value)) return Bad(name, "is truncated");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return LengthDelimited(in, field, name, packed_chunk, depth);
      case WireFormatLite::WIRETYPE_START_GROUP:
      case WireFormatLite::WIRETYPE_END_GROUP:
        return Bad(name, "uses the group wire type, which no field of this API has");
      default:
        return Bad(name, absl::StrCat("has the invalid wire type ", wire_type));
    }
  }

  absl::Status LengthDelimited(CodedInputStream& in, const FieldDescriptor* field,
                               const std::string& name, bool packed_chunk, int depth) {
    // As protobuf's parser reads a length: at most 5 bytes, nothing beyond
    // 32 bits (CodedInputStream::ReadVarint32 takes 10 and drops the rest).
    const int length_start = in.CurrentPosition();
    uint64_t length64;
    if (!in.ReadVarint64(&length64) || in.CurrentPosition() - length_start > kMaxVarint32Bytes ||
        length64 > UINT32_MAX) {
      return Bad(name, "has a malformed length");
    }
    const auto length = static_cast<uint32_t>(length64);
    const int remaining = in.BytesUntilLimit();
    if (remaining < 0 || length > static_cast<uint32_t>(remaining)) {
      return Bad(name, absl::StrCat("is truncated: its length is ", length, " bytes but ",
                                    remaining < 0 ? 0 : remaining, " remain"));
    }
    if (field == nullptr) {
      in.Skip(static_cast<int>(length));
      return absl::OkStatus();
    }
    if (packed_chunk) return PackedChunk(in, *field, name, static_cast<int>(length));
    if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (depth + 1 >= kMaxMessageNesting) {
        return Bad(name, absl::StrCat("nests messages deeper than ", kMaxMessageNesting));
      }
      const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
      absl::Status s = Walk(in, *field->message_type(), name, depth + 1);
      in.PopLimit(limit);
      return s;
    }
    if (field->type() == FieldDescriptor::TYPE_STRING &&
        field->file()->syntax() == FileDescriptor::SYNTAX_PROTO3) {
      std::string value;
      in.ReadString(&value, static_cast<int>(length));
      if (!IsValidUtf8(value)) return Bad(name, "is not valid UTF-8");
      return absl::OkStatus();
    }
    in.Skip(static_cast<int>(length));
    return absl::OkStatus();
  }

  // A packed run of scalars: whole varints, or a multiple of the fixed size.
  absl::Status PackedChunk(CodedInputStream& in, const FieldDescriptor& field,
                           const std::string& name, int length) {
    const int element_wire_type =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(field.type()));
    if (element_wire_type != WireFormatLite::WIRETYPE_VARINT) {
      const int size = element_wire_type == WireFormatLite::WIRETYPE_FIXED64 ? 8 : 4;
      if (length % size != 0) {
        return Bad(name, absl::StrCat("is a packed run of ", length,
                                      " bytes, not a multiple of its elements' ", size));
      }
      in.Skip(length);
      return absl::OkStatus();
    }
    const CodedInputStream::Limit limit = in.PushLimit(length);
    int index = 0;
    while (in.BytesUntilLimit() > 0) {
      uint64_t value;
      if (!in.ReadVarint64(&value)) {
        in.PopLimit(limit);
        return Bad(absl::StrCat(name, "[", index, "]"), "has a truncated or overlong varint");
      }
      ++index;
    }
    in.PopLimit(limit);
    return absl::OkStatus();
  }

  const Descriptor& root_;
};

absl::Status CheckStream(CodedInputStream& in, int size, const Descriptor& descriptor) {
  in.SetRecursionLimit(kMaxMessageNesting);
  const CodedInputStream::Limit limit = in.PushLimit(size);
  absl::Status status = Walker(descriptor).Walk(in, descriptor, "", 0);
  in.PopLimit(limit);
  return status;
}

absl::Status Unparsable(const google::protobuf::Message& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", message.GetDescriptor()->full_name()));
}

}  // namespace

absl::Status CheckWireFormat(absl::string_view bytes, const Descriptor& descriptor) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  return CheckStream(in, static_cast<int>(bytes.size()), descriptor);
}

absl::Status ParseRequest(absl::string_view bytes, google::protobuf::Message* message) {
  message->Clear();
  if (absl::Status s = CheckWireFormat(bytes, *message->GetDescriptor()); !s.ok()) return s;
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Unparsable(*message);
  }
  return absl::OkStatus();
}

absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  message->Clear();
  const size_t size = buffer.Length();
  if (size > static_cast<size_t>(INT32_MAX)) return Unparsable(*message);
  grpc::ByteBuffer walked(buffer);
  {
    grpc::ProtoBufferReader reader(&walked);
    CodedInputStream in(&reader);
    if (absl::Status s = CheckStream(in, static_cast<int>(size), *message->GetDescriptor());
        !s.ok()) {
      return s;
    }
  }
  grpc::ByteBuffer parsed(buffer);
  grpc::ProtoBufferReader reader(&parsed);
  if (!message->ParseFromZeroCopyStream(&reader)) return Unparsable(*message);
  return absl::OkStatus();
}

absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* buffer) {
  buffer->Clear();
  bool own_buffer = false;
  grpc::Status status =
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, buffer, &own_buffer);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat(
        "cannot serialize ", message.GetDescriptor()->full_name(), ": ", status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace trident
