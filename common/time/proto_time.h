// Conversions between absl time types and google.protobuf.Duration /
// Timestamp, as every RPC field that carries a time uses them.

#ifndef TRIDENT_COMMON_TIME_PROTO_TIME_H_
#define TRIDENT_COMMON_TIME_PROTO_TIME_H_

#include <cstdint>

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace trident {

inline absl::Duration DurationFromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

// Seconds and nanos carry the same sign, as Duration requires.
inline void SetProtoDuration(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  out->set_seconds(nanos / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
}

inline void SetProtoTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t nanos = absl::ToUnixNanos(t);
  out->set_seconds(nanos / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
}

inline absl::Time TimeFromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace trident

#endif  // TRIDENT_COMMON_TIME_PROTO_TIME_H_
