#include "services/worker/offload/cost_tables.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"

namespace trident::worker {
namespace {

// Best of `repeats` runs of fn (seconds): the least disturbed one.
template <typename Fn>
absl::StatusOr<double> Fastest(int repeats, Fn fn) {
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time start = absl::Now();
    TRIDENT_RETURN_IF_ERROR(fn());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    best = i == 0 ? seconds : std::min(best, seconds);
  }
  return best;
}

// Median of `repeats` runs of fn(i) (seconds): a typical run, for work whose
// runs differ on purpose (each reads other memory).
template <typename Fn>
absl::StatusOr<double> Median(const Clock& clock, int repeats, Fn fn) {
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time start = clock.Now();
    TRIDENT_RETURN_IF_ERROR(fn(i));
    seconds.push_back(absl::ToDoubleSeconds(clock.Now() - start));
  }
  std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
  return seconds[repeats / 2];
}

// One forward pass of `n` sequences of one token at position `position`,
// sequence i on its own run of blocks.
absl::StatusOr<double> TimeDecodeBatch(backend::ModelBackend& backend, int32_t n,
                                       int32_t position) {
  const int32_t bs = backend.kv_capacity().block_size;
  const int32_t per_seq = position / bs + 1;
  std::vector<std::vector<int32_t>> tables(n);
  for (int32_t i = 0; i < n; ++i) {
    tables[i].resize(per_seq);
    std::iota(tables[i].begin(), tables[i].end(), i * per_seq);
  }
  static const int32_t kToken = 1;
  std::vector<backend::StepSequence> batch(n);
  for (int32_t i = 0; i < n; ++i) {
    batch[i].tokens = absl::MakeConstSpan(&kToken, 1);
    batch[i].start_position = position;
    batch[i].block_table = tables[i];
  }
  return Fastest(3, [&] { return backend.Forward(batch, nullptr); });
}

}  // namespace

absl::StatusOr<BackendCosts> MeasureBackendCosts(backend::ModelBackend& backend) {
  const backend::KvCapacity capacity = backend.kv_capacity();
  absl::StatusOr<backend::KvMemory> memory = backend.kv_memory();
  const int32_t layers = memory.ok() ? std::max(1, memory->spec.num_layers) : 1;
  BackendCosts costs;
  std::vector<std::pair<double, double>> linear;
  for (int32_t n : {1, 4, 16, 64, 256}) {
    if (n > capacity.num_blocks) break;
    TRIDENT_ASSIGN_OR_RETURN(double seconds, TimeDecodeBatch(backend, n, 0));
    linear.emplace_back(n, seconds / layers);
  }
  if (linear.empty()) return absl::FailedPreconditionError("no KV block to measure with");
  costs.linear = CostCurve(linear);
  // Attention: 4 sequences at growing contexts, less their linear time.
  std::vector<std::pair<double, double>> attention = {{0, 0}};
  const int32_t n = std::min(4, capacity.num_blocks);
  const int32_t longest =
      std::min(backend.max_model_len() - 1, capacity.num_blocks / n * capacity.block_size - 1);
  for (int32_t context : {256, 1024, 4096, 16384}) {
    if (context > longest) break;
    TRIDENT_ASSIGN_OR_RETURN(double seconds, TimeDecodeBatch(backend, n, context));
    const double above = seconds / layers - costs.linear.At(n);
    attention.emplace_back(static_cast<double>(n) * (context + 1), std::max(0.0, above));
  }
  costs.local_attention = CostCurve(attention);
  return costs;
}

absl::StatusOr<ServiceCosts> MeasureServiceCosts(const ServiceProbe& probe, uint64_t handle,
                                                 absl::Span<const uint64_t> batch_handles) {
  using transport::attention::AttentionCall;
  if (batch_handles.size() == 1 || batch_handles.size() > 512) {
    return absl::InvalidArgumentError(absl::StrCat("a calibration batch of ", batch_handles.size(),
                                                   " sequences: expected none or 2 to 512"));
  }
  const int64_t q_row = int64_t{probe.num_q_heads} * probe.head_dim;
  const int64_t kv_row = int64_t{probe.num_kv_heads} * probe.head_dim;
  // Small finite values: any KV attends to something finite.
  std::vector<float> k(static_cast<size_t>(kv_row) * 512, 0.01f), v(k.size(), 0.02f);
  std::vector<uint64_t> handles(512, handle);
  std::vector<int32_t> positions(512);
  // Every layer, and the timed calls go round them: a layer's KV is cold
  // when it is read again, as in serving (one layer's would stay in the
  // last-level cache and time several times faster).
  const int32_t layers = std::max(1, probe.num_layers);
  for (int32_t layer = 0; layer < layers; ++layer) {
    for (int32_t first = 0; first < probe.max_context; first += 512) {
      const int32_t count = std::min(512, probe.max_context - first);
      for (int32_t i = 0; i < count; ++i) positions[i] = first + i;
      TRIDENT_ASSIGN_OR_RETURN(
          auto ticket,
          probe.channel->StartAppend({.layer = layer,
                                      .num_kv_heads = probe.num_kv_heads,
                                      .head_dim = probe.head_dim,
                                      .dtype = probe.dtype,
                                      .handles = absl::MakeConstSpan(handles).subspan(0, count),
                                      .positions = absl::MakeConstSpan(positions).subspan(0, count),
                                      .k = k.data(),
                                      .k_stride = kv_row,
                                      .v = v.data(),
                                      .v_stride = kv_row}));
      TRIDENT_RETURN_IF_ERROR(probe.channel->Wait(ticket, probe.timeout));
    }
  }
  // One token of each of `request_handles` at `position`, every layer in
  // turn.
  const size_t most = std::max<size_t>(1, batch_handles.size());
  std::vector<float> q(q_row * most, 0.01f), out(q_row * most);
  auto time_request = [&](absl::Span<const uint64_t> request_handles, int32_t position) {
    const std::vector<int32_t> request_positions(request_handles.size(), position);
    return Median(*probe.clock, std::max(5, layers), [&](int i) -> absl::Status {
      TRIDENT_ASSIGN_OR_RETURN(
          auto ticket, probe.channel->Start(AttentionCall{.layer = i % layers,
                                                          .num_q_heads = probe.num_q_heads,
                                                          .num_kv_heads = probe.num_kv_heads,
                                                          .head_dim = probe.head_dim,
                                                          .dtype = probe.dtype,
                                                          .handles = request_handles,
                                                          .positions = request_positions,
                                                          .q = q.data(),
                                                          .q_stride = q_row,
                                                          .k = k.data(),
                                                          .k_stride = kv_row,
                                                          .v = v.data(),
                                                          .v_stride = kv_row,
                                                          .out = out.data(),
                                                          .out_stride = q_row}));
      return probe.channel->Wait(ticket, probe.timeout);
    });
  };
  const uint64_t one_handle[] = {handle};
  auto time_at = [&](int32_t position) { return time_request(one_handle, position); };
  ServiceCosts costs;
  TRIDENT_ASSIGN_OR_RETURN(costs.round_trip_seconds, time_at(0));
  if (batch_handles.size() >= 2) {
    TRIDENT_ASSIGN_OR_RETURN(const double batch, time_request(batch_handles, 0));
    costs.per_sequence_seconds = std::max(0.0, batch - costs.round_trip_seconds) /
                                 static_cast<double>(batch_handles.size() - 1);
  }
  std::vector<std::pair<double, double>> points = {{0, 0}};
  for (int32_t context = 256; context <= probe.max_context; context *= 4) {
    TRIDENT_ASSIGN_OR_RETURN(double seconds, time_at(context - 1));
    points.emplace_back(context, std::max(0.0, seconds - costs.round_trip_seconds));
  }
  costs.attention = CostCurve(points);
  return costs;
}

}  // namespace trident::worker
