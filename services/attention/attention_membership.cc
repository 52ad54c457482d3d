#include "services/attention/attention_membership.h"

#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trident::attention {

namespace v1 = ::trident::v1;

v1::RegisterRequest AttentionRegisterRequest(const AttentionFacts& facts,
                                             const controller_client::MemberAddresses& addresses) {
  v1::RegisterRequest request;
  v1::AttentionRegistration* attention = request.mutable_attention();
  attention->set_service_id(facts.service_id);
  attention->set_incarnation(facts.incarnation);
  attention->set_address(addresses.address);
  attention->set_metrics_address(addresses.metrics_address);
  attention->set_node_name(addresses.node_name);
  attention->set_numa_node(facts.numa_node);
  absl::string_view isa = v1::Isa_Name(facts.isa);
  absl::ConsumePrefix(&isa, "ISA_");
  attention->set_isa(std::string(isa));
  attention->set_threads(facts.threads);
  attention->set_capacity_bytes(facts.capacity_bytes);
  return request;
}

void FillAttentionHeartbeat(const SequenceStoreStats& stats, v1::HeartbeatRequest* request) {
  request->set_state(v1::SERVING_STATE_SERVING);
  v1::AttentionLoad* load = request->mutable_attention_load();
  load->set_held_bytes(stats.held_bytes);
  load->set_capacity_bytes(stats.capacity_bytes);
  load->set_sequences(stats.sequences);
  load->set_busy_ratio(0);
}

}  // namespace trident::attention
