// The cost tables the pipeline planner reads (pipeline_planner.h), measured
// at start-up on the real backend and the real attention service:
//
//   MeasureBackendCosts: forward passes of synthetic decode batches on the
//     backend's own KV pool (before it serves anything: their KV is
//     scratch): per-layer time of the linear layers vs batch tokens (1-token
//     sequences), and of the attention vs context tokens (what a batch with
//     long contexts adds over the same batch with short ones).
//   MeasureServiceCosts: a calibration sequence admitted at the service,
//     filled by append-only requests, then timed attention requests at
//     growing contexts: the round trip at one token, and the service's time
//     above it vs context tokens; then requests of one token of each of
//     several small sequences against one: the cost of each sequence a
//     request carries beyond its context. The sequences are released after.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_COST_TABLES_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_COST_TABLES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/model_backend.h"
#include "common/time/clock.h"
#include "common/transport/attention/remote_attention.h"
#include "services/worker/offload/pipeline_planner.h"

namespace trident::worker {

struct BackendCosts {
  CostCurve linear;
  CostCurve local_attention;
};

// Runs a few forward passes. REQUIRES: no sequence is in the backend's KV
// pool (its blocks are overwritten); called on a thread that may drive the
// backend. Errors of Forward.
absl::StatusOr<BackendCosts> MeasureBackendCosts(backend::ModelBackend& backend);

struct ServiceCosts {
  CostCurve attention;  // seconds above the round trip vs context tokens
  double round_trip_seconds = 0;
  // Each sequence of a request beyond the first (StepCosts::
  // per_sequence_seconds); 0 without batch handles.
  double per_sequence_seconds = 0;
};

// What the calibration needs of the model and the service: the sequence is
// admitted by `admit` (returns its handle, capacity >= max_context) and
// released by `release`.
struct ServiceProbe {
  transport::attention::RemoteAttention* channel = nullptr;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // The sequence's layers, each filled to max_context and read in turn.
  int32_t num_layers = 1;
  transport::attention::WireDType dtype = transport::attention::WireDType::kBF16;
  int32_t max_context = 2048;
  absl::Duration timeout = absl::Seconds(5);
  // What the requests are timed by.
  const Clock* clock = Clock::Real();
};
// `handle` holds max_context tokens; each of `batch_handles` (capacity >= 1
// token; none, or at least two) is timed at one token, all in one request.
absl::StatusOr<ServiceCosts> MeasureServiceCosts(const ServiceProbe& probe, uint64_t handle,
                                                 absl::Span<const uint64_t> batch_handles = {});

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_COST_TABLES_H_
