#include "common/backend/remote_rows.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trident::backend {
namespace {

using numeric::DType;

// Converts n elements of `dtype` at `src` to f32.
void ToF32(DType dtype, const void* src, float* dst, int64_t n) {
  numeric::ToFloat(dtype, src, dst, static_cast<size_t>(n));
}

void FromF32(const float* src, DType dtype, void* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else {
    numeric::FloatToBf16(src, static_cast<uint16_t*>(dst), static_cast<size_t>(n));
  }
}

}  // namespace

absl::Status ValidateOffloadFields(const StepSequence& s) {
  if (s.sub_batch != 0 && (s.sub_batch != 1 || s.remote.service == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sub-batch ", s.sub_batch,
                     ": only CPU-resident sequences may form sub-batch 1, and there is no other"));
  }
  if (s.remote.service != nullptr && s.tokens.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CPU-resident sequence decodes one token a step, not ", s.tokens.size()));
  }
  return absl::OkStatus();
}

void RemoteRows::Clear() {
  for (Group& g : groups_) {
    g.rows.clear();
    g.handles.clear();
    g.positions.clear();
    g.started = false;
  }
  num_rows_ = 0;
}

void RemoteRows::Add(const RemoteKv& remote, int32_t position, int64_t row) {
  auto group = std::find_if(groups_.begin(), groups_.end(),
                            [&](const Group& g) { return g.service == remote.service; });
  if (group == groups_.end()) {
    // Reuse a group whose service this step does not use.
    group =
        std::find_if(groups_.begin(), groups_.end(), [](const Group& g) { return g.rows.empty(); });
    if (group == groups_.end()) {
      groups_.emplace_back();
      group = groups_.end() - 1;
    }
    group->service = remote.service;
  }
  group->rows.push_back(row);
  group->handles.push_back(remote.handle);
  group->positions.push_back(position);
  ++num_rows_;
}

absl::Status RemoteRows::Start(int32_t layer, DType dtype, const void* qkv, int64_t qkv_stride) {
  const bool bf16 = dtype == DType::kBF16 && shape_.wire == transport::attention::WireDType::kBF16;
  for (Group& g : groups_) {
    if (g.rows.empty()) continue;
    transport::attention::AttentionCall call{.layer = layer,
                                             .num_q_heads = shape_.num_q_heads,
                                             .num_kv_heads = shape_.num_kv_heads,
                                             .head_dim = shape_.head_dim,
                                             .dtype = shape_.wire,
                                             .handles = g.handles,
                                             .positions = g.positions};
    g.bf16 = bf16;
    if (bf16) {
      PrepareBf16(g, static_cast<const uint16_t*>(qkv), qkv_stride, call);
    } else {
      GatherF32(g, dtype, qkv, qkv_stride, call);
    }
    g.started_at = absl::Now();
    absl::StatusOr<transport::attention::RemoteAttention::Ticket> ticket = g.service->Start(call);
    if (!ticket.ok()) return RemoteAttentionFailure(g.service, ticket.status());
    g.ticket = *ticket;
    g.started = true;
  }
  return absl::OkStatus();
}

void RemoteRows::PrepareBf16(Group& g, const uint16_t* qkv, int64_t qkv_stride,
                             transport::attention::AttentionCall& call) {
  const int64_t q_out = int64_t{shape_.num_q_heads} * shape_.head_dim;
  const int64_t width = q_out + 2 * int64_t{shape_.num_kv_heads} * shape_.head_dim;
  const int64_t n = static_cast<int64_t>(g.rows.size());
  bool consecutive = true;
  for (int64_t i = 1; i < n && consecutive; ++i) consecutive = g.rows[i] == g.rows[0] + i;
  if (consecutive) {
    call.qkv_bf16 = qkv + g.rows[0] * qkv_stride;
    call.qkv_bf16_stride = qkv_stride;
  } else {
    g.qkv_bf16.resize(n * width);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&g.qkv_bf16[i * width], qkv + g.rows[i] * qkv_stride,
                  static_cast<size_t>(width) * sizeof(uint16_t));
    }
    call.qkv_bf16 = g.qkv_bf16.data();
    call.qkv_bf16_stride = width;
  }
  g.out_bf16.resize(n * q_out);
  call.out_bf16 = g.out_bf16.data();
  call.out_bf16_stride = q_out;
}

void RemoteRows::GatherF32(Group& g, DType dtype, const void* qkv, int64_t qkv_stride,
                           transport::attention::AttentionCall& call) {
  const int64_t q_out = int64_t{shape_.num_q_heads} * shape_.head_dim;
  const int64_t kv_out = int64_t{shape_.num_kv_heads} * shape_.head_dim;
  const size_t element = numeric::ElementSize(dtype);
  const int64_t n = static_cast<int64_t>(g.rows.size());
  g.q.resize(n * q_out);
  g.k.resize(n * kv_out);
  g.v.resize(n * kv_out);
  g.out.resize(n * q_out);
  for (int64_t i = 0; i < n; ++i) {
    const char* row = static_cast<const char*>(qkv) + g.rows[i] * qkv_stride * element;
    ToF32(dtype, row, &g.q[i * q_out], q_out);
    ToF32(dtype, row + q_out * element, &g.k[i * kv_out], kv_out);
    ToF32(dtype, row + (q_out + kv_out) * element, &g.v[i * kv_out], kv_out);
  }
  call.q = g.q.data();
  call.q_stride = q_out;
  call.k = g.k.data();
  call.k_stride = kv_out;
  call.v = g.v.data();
  call.v_stride = kv_out;
  call.out = g.out.data();
  call.out_stride = q_out;
}

absl::Status RemoteRows::Finish(absl::Duration timeout, DType dtype, void* out, int64_t out_stride,
                                RemoteAttentionTiming& timing) {
  const int64_t q_out = int64_t{shape_.num_q_heads} * shape_.head_dim;
  const size_t element = numeric::ElementSize(dtype);
  absl::Status first_error;
  for (Group& g : groups_) {
    if (!g.started) continue;
    g.started = false;
    const absl::Time waiting = absl::Now();
    absl::Status waited = g.service->Wait(g.ticket, timeout);
    const absl::Time answered = absl::Now();
    ++timing.requests;
    timing.round_trip_seconds += absl::ToDoubleSeconds(answered - g.started_at);
    timing.exposed_seconds += absl::ToDoubleSeconds(answered - waiting);
    if (!waited.ok()) {
      if (first_error.ok()) first_error = RemoteAttentionFailure(g.service, waited);
      continue;
    }
    for (size_t i = 0; i < g.rows.size(); ++i) {
      char* row = static_cast<char*>(out) + g.rows[i] * out_stride * element;
      if (g.bf16) {
        std::memcpy(row, &g.out_bf16[i * q_out], static_cast<size_t>(q_out) * sizeof(uint16_t));
      } else {
        FromF32(&g.out[i * q_out], dtype, row, q_out);
      }
    }
  }
  return first_error;
}

}  // namespace trident::backend
