#ifndef TRIDENT_SERVICES_ATTENTION_ATTENTION_MEMBERSHIP_H_
#define TRIDENT_SERVICES_ATTENTION_ATTENTION_MEMBERSHIP_H_

// What an attention service tells the controller (trident.v1.Controller):
// its registration and its heartbeats' load. AttentionServer feeds these to
// a controller_client::ControllerMember.

#include <cstdint>
#include <string>

#include "common/controller_client/member_address.h"
#include "services/attention/kv_store/sequence_store.h"
#include "trident/v1/attention.pb.h"
#include "trident/v1/controller.pb.h"

namespace trident::attention {

// The fixed facts a registration reports.
struct AttentionFacts {
  std::string service_id;
  uint64_t incarnation = 0;
  int32_t numa_node = 0;
  // The kernels' instruction set.
  trident::v1::Isa isa = trident::v1::ISA_UNSPECIFIED;
  int32_t threads = 0;
  int64_t capacity_bytes = 0;
};

// A RegisterRequest for the service, reached at `addresses`. The ISA goes
// by its enum name without the prefix (e.g. "AVX512_BF16").
trident::v1::RegisterRequest AttentionRegisterRequest(
    const AttentionFacts& facts, const controller_client::MemberAddresses& addresses);

// Fills a heartbeat: state SERVING and the store's load. busy_ratio is left
// 0 (the service does not measure its threads' busy time).
void FillAttentionHeartbeat(const SequenceStoreStats& stats,
                            trident::v1::HeartbeatRequest* request);

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_ATTENTION_MEMBERSHIP_H_
