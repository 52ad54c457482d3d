#ifndef TRIDENT_COMMON_KV_KV_EVENTS_PROTO_H_
#define TRIDENT_COMMON_KV_KV_EVENTS_PROTO_H_

// A batch of KV events as the load stream carries it (trident.v1.KvEvents).

#include <cstdint>
#include <string>

#include "common/kv/kv_event_log.h"
#include "trident/v1/cluster.pb.h"

namespace trident::kv {

// Fills `out` (cleared first) with `batch`, from the cache whose keys are
// computed over `cache_identity` with blocks of `block_size_tokens`, in
// `tier`.
void KvEventsToProto(const KvEventBatch& batch, const std::string& cache_identity,
                     int32_t block_size_tokens, const std::string& tier,
                     trident::v1::KvEvents* out);

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_KV_EVENTS_PROTO_H_
