// The attention service's Prometheus metrics (trident_attention_*):
//
//   trident_attention_sequences                 gauge    sequences held
//   trident_attention_held_tokens               gauge    tokens of KV held
//   trident_attention_held_bytes                gauge    DRAM reserved for KV
//   trident_attention_capacity_bytes            gauge    the KV budget
//   trident_attention_sessions                  gauge    owners with a session
//   trident_attention_requests_total{outcome}   counter  per-layer requests: ok, error
//   trident_attention_bad_messages_total        counter  malformed requests
//   trident_attention_kernel_seconds            histogram one attention request's compute
//   trident_attention_append_seconds            histogram one append-only request's compute
//   trident_attention_queue_seconds             histogram arrival to compute
//   trident_attention_request_sequences         histogram sequences per request
//   trident_attention_bytes_read_total          counter  KV bytes the kernel read
//   trident_attention_freed_sequences_total{cause} counter released, session_ended, idle
//   trident_attention_info{isa,numa_node,threads} gauge 1
//   trident_attention_store_blocks              gauge    block store: readable blocks
//   trident_attention_store_bytes               gauge    bytes its blocks hold
//   trident_attention_store_capacity_bytes      gauge    its budget
//   trident_attention_store_blocks_written_total counter blocks written by puts
//   trident_attention_store_evictions_total     counter  blocks evicted for room
//   trident_attention_store_lookups_total       counter  lookups
//   trident_attention_store_hit_blocks_total    counter  blocks lookups matched
//   trident_attention_store_blocks_read_total   counter  blocks fetched
//   trident_attention_store_request_seconds     histogram the store's copy of one data-plane
//                                                        put or get {op}
//
// Thread-safe: Record runs on the data plane's dispatcher thread, Sample on
// the service's housekeeping thread.

#ifndef TRIDENT_SERVICES_ATTENTION_ATTENTION_METRICS_H_
#define TRIDENT_SERVICES_ATTENTION_ATTENTION_METRICS_H_

#include <cstdint>
#include <string>

#include "common/transport/attention/ucx_attention_server.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/attention/kv_store/block_store.h"
#include "services/attention/kv_store/sequence_store.h"

namespace trident::attention {

class AttentionMetrics {
 public:
  AttentionMetrics(prometheus::Registry& registry, const std::string& isa, int numa_node,
                   int threads);

  // One request answered (or failed) by the data plane.
  void Record(const transport::attention::AttentionRequestRecord& record);
  // The store's occupancy, the data plane's counters and the KV bytes read
  // so far (monotonic totals; the counters follow them).
  void Sample(const SequenceStoreStats& store,
              const transport::attention::AttentionServerCounters& data_plane,
              int64_t kv_bytes_read);
  // The block store's occupancy and totals.
  void SampleBlocks(const BlockStoreStats& blocks);

 private:
  prometheus::Gauge& sequences_;
  prometheus::Gauge& held_tokens_;
  prometheus::Gauge& held_bytes_;
  prometheus::Gauge& in_place_sequences_;
  prometheus::Gauge& in_place_tokens_;
  prometheus::Gauge& capacity_bytes_;
  prometheus::Gauge& sessions_;
  prometheus::Counter& requests_ok_;
  prometheus::Counter& requests_error_;
  prometheus::Counter& bad_messages_;
  prometheus::Histogram& kernel_seconds_;
  prometheus::Histogram& append_seconds_;
  prometheus::Histogram& queue_seconds_;
  prometheus::Histogram& request_sequences_;
  prometheus::Counter& bytes_read_;
  prometheus::Counter& freed_released_;
  prometheus::Counter& freed_session_ended_;
  prometheus::Counter& freed_idle_;
  prometheus::Gauge& store_blocks_;
  prometheus::Gauge& store_bytes_;
  prometheus::Gauge& store_capacity_bytes_;
  prometheus::Counter& store_written_;
  prometheus::Counter& store_evictions_;
  prometheus::Counter& store_lookups_;
  prometheus::Counter& store_hits_;
  prometheus::Counter& store_read_;
  prometheus::Family<prometheus::Histogram>& store_request_seconds_family_;
  prometheus::Histogram& store_put_seconds_;
  prometheus::Histogram& store_get_seconds_;
  BlockStoreStats last_blocks_;
  // The totals the counters were last brought up to.
  int64_t last_bad_messages_ = 0;
  int64_t last_bytes_read_ = 0;
  int64_t last_released_ = 0;
  int64_t last_session_ended_ = 0;
  int64_t last_idle_ = 0;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_ATTENTION_METRICS_H_
