#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_PROTO_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_PROTO_H_

// Conversions from the worker protos to admission's native types, done once
// where a load stream message or a KV layout enters the router.

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/trident/v1/cluster.pb.h"
#include "services/router/admission/worker_load.h"

namespace trident::router::admission {

// Validates and converts a WorkerLoad. kInvalidArgument naming the field
// (e.g. "WorkerLoad.kv_blocks_free: ...") when worker_id is empty, the role
// is unspecified or unknown, a count is negative, kv_blocks_free exceeds
// kv_blocks_total, the throughput is negative or not finite, or the step
// time is negative. A DRAINING or DEAD worker converts with accepting false.
absl::StatusOr<WorkerLoadReport> WorkerLoadReportFromProto(const trident::v1::WorkerLoad& load);

// KV bytes per token of `layout` (keys and values of every layer), for
// TransferModelOptions::bytes_per_token. kInvalidArgument naming the field
// for a non-positive dimension or an unspecified dtype.
absl::StatusOr<int64_t> KvBytesPerTokenFromLayout(const trident::v1::KvLayout& layout);

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_PROTO_H_
