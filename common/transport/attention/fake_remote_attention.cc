#include "common/transport/attention/fake_remote_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"

namespace trident::transport::attention {

uint64_t FakeRemoteAttention::Admit() {
  absl::MutexLock lock(&mu_);
  const uint64_t handle = next_handle_++;
  Sequence& s = sequences_[handle];
  s.k.resize(num_layers_);
  s.v.resize(num_layers_);
  return handle;
}

void FakeRemoteAttention::WriteKv(uint64_t handle, int32_t layer, int32_t position, const float* k,
                                  const float* v) {
  absl::MutexLock lock(&mu_);
  StoreLocked(sequences_.at(handle), layer, position, k, v);
}

void FakeRemoteAttention::StoreLocked(Sequence& s, int32_t layer, int32_t position, const float* k,
                                      const float* v) {
  const size_t n = static_cast<size_t>(num_kv_heads_) * head_dim_;
  if (s.k[layer].size() <= static_cast<size_t>(position)) {
    s.k[layer].resize(position + 1);
    s.v[layer].resize(position + 1);
  }
  s.k[layer][position].assign(k, k + n);
  s.v[layer][position].assign(v, v + n);
}

bool FakeRemoteAttention::Release(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  return sequences_.erase(handle) > 0;
}

int FakeRemoteAttention::sequences() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sequences_.size());
}

void FakeRemoteAttention::Kill() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
}

int64_t FakeRemoteAttention::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

void FakeRemoteAttention::Attend(const Sequence& s, int32_t layer, int32_t position, const float* q,
                                 float* out) const {
  const int32_t group = num_q_heads_ / num_kv_heads_;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  std::vector<double> scores(position + 1);
  for (int32_t h = 0; h < num_q_heads_; ++h) {
    const int32_t g = h / group;
    double max_score = -1e300;
    for (int32_t t = 0; t <= position; ++t) {
      double dot = 0;
      for (int32_t d = 0; d < head_dim_; ++d) {
        dot += static_cast<double>(q[h * head_dim_ + d]) * s.k[layer][t][g * head_dim_ + d];
      }
      scores[t] = dot * scale;
      max_score = std::max(max_score, scores[t]);
    }
    double sum = 0;
    for (double& x : scores) sum += x = std::exp(x - max_score);
    for (int32_t d = 0; d < head_dim_; ++d) {
      double acc = 0;
      for (int32_t t = 0; t <= position; ++t) acc += scores[t] * s.v[layer][t][g * head_dim_ + d];
      out[h * head_dim_ + d] = static_cast<float>(acc / sum);
    }
  }
}

absl::StatusOr<RemoteAttention::Ticket> FakeRemoteAttention::Start(const AttentionCall& call) {
  if (call.qkv_bf16 != nullptr) return StartBf16(call);
  absl::MutexLock lock(&mu_);
  if (dead_) return absl::UnavailableError("the fake attention service was killed");
  ++requests_;
  const Ticket ticket = next_ticket_++;
  absl::Status& answer = answers_[ticket];
  if (call.num_q_heads != num_q_heads_ || call.num_kv_heads != num_kv_heads_ ||
      call.head_dim != head_dim_ || call.layer < 0 || call.layer >= num_layers_) {
    answer = absl::InvalidArgumentError("the call's shape is not the fake's");
    return ticket;
  }
  for (size_t i = 0; i < call.handles.size(); ++i) {
    auto it = sequences_.find(call.handles[i]);
    if (it == sequences_.end()) {
      answer =
          absl::NotFoundError(absl::StrCat("sequence handle ", call.handles[i], " is not held"));
      return ticket;
    }
  }
  for (size_t i = 0; i < call.handles.size(); ++i) {
    Sequence& s = sequences_[call.handles[i]];
    const int32_t position = call.positions[i];
    const size_t n = static_cast<size_t>(num_kv_heads_) * head_dim_;
    if (s.k[call.layer].size() <= static_cast<size_t>(position)) {
      s.k[call.layer].resize(position + 1);
      s.v[call.layer].resize(position + 1);
    }
    s.k[call.layer][position].assign(call.k + i * call.k_stride, call.k + i * call.k_stride + n);
    s.v[call.layer][position].assign(call.v + i * call.v_stride, call.v + i * call.v_stride + n);
    for (int32_t t = 0; t <= position; ++t) {
      if (s.k[call.layer][t].empty()) {
        answer = absl::FailedPreconditionError(
            absl::StrCat("position ", t, " of handle ", call.handles[i], " was never written"));
        return ticket;
      }
    }
    Attend(s, call.layer, position, call.q + i * call.q_stride, call.out + i * call.out_stride);
  }
  answer = absl::OkStatus();
  return ticket;
}

absl::StatusOr<RemoteAttention::Ticket> FakeRemoteAttention::StartBf16(const AttentionCall& call) {
  // The same call with f32 rows; o goes back to bf16 once computed (Start
  // answers before it returns).
  const int64_t q = int64_t{call.num_q_heads} * call.head_dim;
  const int64_t kv = int64_t{call.num_kv_heads} * call.head_dim;
  const int64_t row = q + 2 * kv;
  const int64_t n = static_cast<int64_t>(call.handles.size());
  std::vector<float> qkv(n * row), out(n * q);
  for (int64_t i = 0; i < n; ++i) {
    numeric::Bf16ToFloat(call.qkv_bf16 + i * call.qkv_bf16_stride, &qkv[i * row], row);
  }
  AttentionCall f32 = call;
  f32.qkv_bf16 = nullptr;
  f32.out_bf16 = nullptr;
  f32.q = qkv.data();
  f32.k = qkv.data() + q;
  f32.v = qkv.data() + q + kv;
  f32.q_stride = f32.k_stride = f32.v_stride = row;
  f32.out = out.data();
  f32.out_stride = q;
  TRIDENT_ASSIGN_OR_RETURN(const Ticket ticket, Start(f32));
  for (int64_t i = 0; i < n; ++i) {
    numeric::FloatToBf16(&out[i * q], call.out_bf16 + i * call.out_bf16_stride, q);
  }
  return ticket;
}

absl::StatusOr<RemoteAttention::Ticket> FakeRemoteAttention::StartAppend(const KvAppendCall& call) {
  absl::MutexLock lock(&mu_);
  if (dead_) return absl::UnavailableError("the fake attention service was killed");
  ++requests_;
  const Ticket ticket = next_ticket_++;
  absl::Status& answer = answers_[ticket];
  answer = absl::OkStatus();
  for (size_t i = 0; i < call.handles.size(); ++i) {
    auto it = sequences_.find(call.handles[i]);
    if (it == sequences_.end()) {
      answer =
          absl::NotFoundError(absl::StrCat("sequence handle ", call.handles[i], " is not held"));
      return ticket;
    }
    if (call.k_bf16 != nullptr) {
      const size_t n = static_cast<size_t>(call.num_kv_heads) * call.head_dim;
      std::vector<float> k(n), v(n);
      numeric::Bf16ToFloat(call.k_bf16 + i * call.k_stride, k.data(), n);
      numeric::Bf16ToFloat(call.v_bf16 + i * call.v_stride, v.data(), n);
      StoreLocked(it->second, call.layer, call.positions[i], k.data(), v.data());
      continue;
    }
    StoreLocked(it->second, call.layer, call.positions[i], call.k + i * call.k_stride,
                call.v + i * call.v_stride);
  }
  return ticket;
}

absl::Status FakeRemoteAttention::Wait(Ticket ticket, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (dead_) return absl::UnavailableError("the fake attention service was killed");
  auto it = answers_.find(ticket);
  if (it == answers_.end()) return absl::NotFoundError(absl::StrCat("no ticket ", ticket));
  absl::Status status = it->second;
  answers_.erase(it);
  return status;
}

}  // namespace trident::transport::attention
