#include "services/attention/attention_metrics.h"

#include "common/telemetry/metric_families.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trident::attention {
namespace {

// 20 us to ~1.3 s, doubling.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  std::vector<double> bounds;
  for (double b = 20e-6; b < 1.5; b *= 2) bounds.push_back(b);
  return bounds;
}

prometheus::Histogram::BucketBoundaries SequenceBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
}

using telemetry::CounterOf;
using telemetry::GaugeOf;

void Follow(prometheus::Counter& counter, int64_t total, int64_t* last) {
  telemetry::FollowTotal(counter, total, last);
}

}  // namespace

AttentionMetrics::AttentionMetrics(prometheus::Registry& registry, const std::string& isa,
                                   int numa_node, int threads)
    : sequences_(GaugeOf(registry, "trident_attention_sequences", "Sequences whose KV is held.")),
      held_tokens_(GaugeOf(registry, "trident_attention_held_tokens",
                           "Tokens of KV held, over all sequences.")),
      held_bytes_(
          GaugeOf(registry, "trident_attention_held_bytes", "DRAM reserved for sequences' KV.")),
      in_place_sequences_(GaugeOf(registry, "trident_attention_in_place_sequences",
                                  "Sequences reading a prefix in place from the block store.")),
      in_place_tokens_(GaugeOf(registry, "trident_attention_in_place_tokens",
                               "Prefix tokens those sequences read in place (each sequence "
                               "counted: what their copies would hold).")),
      capacity_bytes_(GaugeOf(registry, "trident_attention_capacity_bytes",
                              "The DRAM budget for KV on this NUMA node.")),
      sessions_(
          GaugeOf(registry, "trident_attention_sessions", "Decode workers with an open session.")),
      requests_ok_(CounterOf(registry, "trident_attention_requests_total",
                             "Per-layer attention requests, by outcome.", {{"outcome", "ok"}})),
      requests_error_(CounterOf(registry, "trident_attention_requests_total",
                                "Per-layer attention requests, by outcome.",
                                {{"outcome", "error"}})),
      bad_messages_(
          CounterOf(registry, "trident_attention_bad_messages_total",
                    "Malformed data-plane messages (answered with an error or dropped).")),
      kernel_seconds_(prometheus::BuildHistogram()
                          .Name("trident_attention_kernel_seconds")
                          .Help("Time to compute one per-layer attention request (its "
                                "k/v appends included; append-only requests are "
                                "trident_attention_append_seconds).")
                          .Register(registry)
                          .Add({}, SecondsBuckets())),
      append_seconds_(prometheus::BuildHistogram()
                          .Name("trident_attention_append_seconds")
                          .Help("Time to store one append-only request (a migrated "
                                "sequence's k/v rows), no attention.")
                          .Register(registry)
                          .Add({}, SecondsBuckets())),
      queue_seconds_(prometheus::BuildHistogram()
                         .Name("trident_attention_queue_seconds")
                         .Help("Time a per-layer request waited between arrival and compute.")
                         .Register(registry)
                         .Add({}, SecondsBuckets())),
      request_sequences_(prometheus::BuildHistogram()
                             .Name("trident_attention_request_sequences")
                             .Help("Sequences per per-layer request.")
                             .Register(registry)
                             .Add({}, SequenceBuckets())),
      bytes_read_(CounterOf(registry, "trident_attention_bytes_read_total",
                            "KV bytes the attention kernel read.")),
      freed_released_(CounterOf(registry, "trident_attention_freed_sequences_total",
                                "Sequences freed, by cause.", {{"cause", "released"}})),
      freed_session_ended_(CounterOf(registry, "trident_attention_freed_sequences_total",
                                     "Sequences freed, by cause.", {{"cause", "session_ended"}})),
      freed_idle_(CounterOf(registry, "trident_attention_freed_sequences_total",
                            "Sequences freed, by cause.", {{"cause", "idle"}})),
      store_blocks_(GaugeOf(registry, "trident_attention_store_blocks",
                            "KV blocks the block store (the DRAM tier) holds, readable.")),
      store_bytes_(GaugeOf(registry, "trident_attention_store_bytes",
                           "Bytes the block store's blocks hold (reserved ones included).")),
      store_capacity_bytes_(GaugeOf(registry, "trident_attention_store_capacity_bytes",
                                    "The block store's budget.")),
      store_written_(CounterOf(registry, "trident_attention_store_blocks_written_total",
                               "KV blocks written into the block store.")),
      store_evictions_(CounterOf(registry, "trident_attention_store_evictions_total",
                                 "KV blocks the block store evicted to make room.")),
      store_lookups_(CounterOf(registry, "trident_attention_store_lookups_total",
                               "Block store lookups (one per prompt a worker asked about).")),
      store_hits_(CounterOf(registry, "trident_attention_store_hit_blocks_total",
                            "KV blocks block store lookups matched.")),
      store_read_(CounterOf(registry, "trident_attention_store_blocks_read_total",
                            "KV blocks fetched from the block store.")),
      store_request_seconds_family_(
          prometheus::BuildHistogram()
              .Name("trident_attention_store_request_seconds")
              .Help("Time the block store took to copy one data-plane request's blocks in "
                    "(put) or out (get), on the dispatcher thread.")
              .Register(registry)),
      store_put_seconds_(store_request_seconds_family_.Add({{"op", "put"}}, SecondsBuckets())),
      store_get_seconds_(store_request_seconds_family_.Add({{"op", "get"}}, SecondsBuckets())) {
  GaugeOf(
      registry, "trident_attention_info",
      "The attention service's kernel instruction set, NUMA node and threads.",
      {{"isa", isa}, {"numa_node", absl::StrCat(numa_node)}, {"threads", absl::StrCat(threads)}})
      .Set(1);
}

void AttentionMetrics::Record(const transport::attention::AttentionRequestRecord& record) {
  if (record.blocks) {
    (record.append_only ? store_put_seconds_ : store_get_seconds_)
        .Observe(absl::ToDoubleSeconds(record.compute));
    return;
  }
  (record.status.ok() ? requests_ok_ : requests_error_).Increment();
  (record.append_only ? append_seconds_ : kernel_seconds_)
      .Observe(absl::ToDoubleSeconds(record.compute));
  queue_seconds_.Observe(absl::ToDoubleSeconds(record.queued));
  request_sequences_.Observe(record.num_sequences);
}

void AttentionMetrics::Sample(const SequenceStoreStats& store,
                              const transport::attention::AttentionServerCounters& data_plane,
                              int64_t kv_bytes_read) {
  sequences_.Set(store.sequences);
  held_tokens_.Set(static_cast<double>(store.held_tokens));
  held_bytes_.Set(static_cast<double>(store.held_bytes));
  in_place_sequences_.Set(store.in_place_sequences);
  in_place_tokens_.Set(static_cast<double>(store.in_place_tokens));
  capacity_bytes_.Set(static_cast<double>(store.capacity_bytes));
  sessions_.Set(store.sessions);
  Follow(bad_messages_, data_plane.bad_messages, &last_bad_messages_);
  Follow(bytes_read_, kv_bytes_read, &last_bytes_read_);
  Follow(freed_released_, store.released, &last_released_);
  Follow(freed_session_ended_, store.freed_session_ended, &last_session_ended_);
  Follow(freed_idle_, store.freed_idle, &last_idle_);
}

void AttentionMetrics::SampleBlocks(const BlockStoreStats& blocks) {
  store_blocks_.Set(static_cast<double>(blocks.blocks));
  store_bytes_.Set(static_cast<double>(blocks.bytes));
  store_capacity_bytes_.Set(static_cast<double>(blocks.capacity_bytes));
  Follow(store_written_, blocks.blocks_written_total, &last_blocks_.blocks_written_total);
  Follow(store_evictions_, blocks.evictions_total, &last_blocks_.evictions_total);
  Follow(store_lookups_, blocks.lookups_total, &last_blocks_.lookups_total);
  Follow(store_hits_, blocks.blocks_matched_total, &last_blocks_.blocks_matched_total);
  Follow(store_read_, blocks.blocks_read_total, &last_blocks_.blocks_read_total);
}

}  // namespace trident::attention
