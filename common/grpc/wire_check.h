#ifndef TRIDENT_COMMON_GRPC_WIRE_CHECK_H_
#define TRIDENT_COMMON_GRPC_WIRE_CHECK_H_

// Parsing of request messages that says what is wrong with a bad one.
//
// gRPC's generated handlers answer a request that fails to parse with
// UNIMPLEMENTED and no message (the code of an unknown method). Services
// that take raw requests parse them here instead: a request that does not
// parse is INVALID_ARGUMENT naming the field at fault and the problem
// (invalid UTF-8 in a string field, a truncated or malformed field, nesting
// deeper than protobuf allows), with a google.rpc.BadRequest detail.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/grpc/reactors.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"

namespace trident {

// Nesting limit of messages within messages, as protobuf's parser.
inline constexpr int kMaxMessageNesting = 100;

// OK if `bytes` is a well-formed serialization of `descriptor`'s message;
// else INVALID_ARGUMENT naming the first field at fault, e.g.
// "sampling.logit_bias[2].key" or "stop.stop_strings[1]" (fields the
// descriptor does not know are named by number, "field 17").
absl::Status CheckWireFormat(absl::string_view bytes,
                             const google::protobuf::Descriptor& descriptor);

// Parses `bytes` into `message` (cleared first); INVALID_ARGUMENT as
// CheckWireFormat's when it is not a well-formed `message`.
absl::Status ParseRequest(absl::string_view bytes, google::protobuf::Message* message);
absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// Serializes `message` into `buffer` (replacing what it held); INTERNAL if
// it cannot be.
absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* buffer);

// A raw unary handler's body: parses `request` as a `Request`, runs
// `handle(const Request&, Response*) -> absl::Status` and, when it
// succeeds, serializes its response into `response`; the call finishes with
// the first failure (a parse failure names its field).
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* FinishRawUnary(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer& request,
                                         grpc::ByteBuffer* response, Handle&& handle) {
  Request parsed;
  absl::Status status = ParseRequest(request, &parsed);
  if (status.ok()) {
    Response out;
    status = handle(static_cast<const Request&>(parsed), &out);
    if (status.ok()) status = SerializeResponse(out, response);
  }
  return FinishUnary(context, status);
}

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_WIRE_CHECK_H_
