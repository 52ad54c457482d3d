#include "common/kv/kv_events_proto.h"

namespace trident::kv {

void KvEventsToProto(const KvEventBatch& batch, const std::string& cache_identity,
                     int32_t block_size_tokens, const std::string& tier,
                     trident::v1::KvEvents* out) {
  out->Clear();
  out->set_cache_identity(cache_identity);
  out->set_block_size_tokens(block_size_tokens);
  out->set_tier(tier);
  out->set_snapshot(batch.snapshot);
  out->set_first_seq(batch.first_seq);
  out->set_last_seq(batch.last_seq);
  out->mutable_key_hi()->Reserve(static_cast<int>(batch.events.size()));
  out->mutable_key_lo()->Reserve(static_cast<int>(batch.events.size()));
  out->mutable_stored()->Reserve(static_cast<int>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    out->add_key_hi(e.key.hi);
    out->add_key_lo(e.key.lo);
    out->add_stored(e.stored);
  }
}

}  // namespace trident::kv
