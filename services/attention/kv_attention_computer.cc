#include "services/attention/kv_attention_computer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"

namespace trident::attention {
namespace {

using transport::attention::FromWire;
using transport::attention::QkvRowElements;
using transport::attention::RequestView;
using transport::attention::ToWire;
using transport::attention::WireElementSize;

// Stores n floats as `dtype` elements at dst.
void StoreElements(numeric::DType dtype, const float* src, char* dst, int64_t n) {
  switch (dtype) {
    case numeric::DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case numeric::DType::kBF16:
      numeric::FloatToBf16(src, reinterpret_cast<uint16_t*>(dst), n);
      return;
    case numeric::DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        reinterpret_cast<uint16_t*>(dst)[i] = numeric::FloatToHalf(src[i]);
      }
      return;
  }
}

// Element (head, token t of the block, dim 0) of K in layer `layer`.
char* KAt(const PinnedSequence& s, int32_t layer, int32_t position, int32_t head) {
  const SequenceLayout& l = *s.layout;
  const int32_t block = position / l.block_size;
  const int32_t slot = position % l.block_size;
  return s.data + layer * l.layer_stride_bytes + block * l.block_stride_bytes +
         (static_cast<int64_t>(head) * l.block_size + slot) * l.head_dim *
             numeric::ElementSize(l.dtype);
}

}  // namespace

KvAttentionComputer::KvAttentionComputer(SequenceStore* store, Executor executor)
    : store_(store), executor_(std::move(executor)) {}

absl::Status KvAttentionComputer::Compute(const RequestView& request, char* reply_rows) {
  const int32_t n = request.header.num_sequences;
  handles_.resize(n);
  positions_.resize(n);
  pinned_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    handles_[i] = request.sequences[i].handle;
    positions_[i] = request.sequences[i].position;
  }
  TRIDENT_RETURN_IF_ERROR(store_->Pin(request.header.owner_incarnation, handles_, positions_,
                                      absl::MakeSpan(pinned_)));
  absl::Cleanup unpin = [this] { store_->Unpin(handles_); };
  TRIDENT_RETURN_IF_ERROR(CheckShapes(request));
  Append(request);
  if ((request.header.flags & transport::attention::kAppendOnly) == 0) {
    Attend(request, reply_rows);
  }
  return absl::OkStatus();
}

absl::Status KvAttentionComputer::CheckShapes(const RequestView& request) const {
  const transport::attention::RequestHeader& h = request.header;
  for (const PinnedSequence& s : pinned_) {
    const SequenceLayout& l = *s.layout;
    const bool append_only = (h.flags & transport::attention::kAppendOnly) != 0;
    if ((!append_only && l.num_q_heads != h.num_q_heads) || l.num_kv_heads != h.num_kv_heads ||
        l.head_dim != h.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence handle ", s.handle, " was admitted with ", l.num_q_heads, " q heads, ",
          l.num_kv_heads, " kv heads and head_dim ", l.head_dim, "; the request has ",
          h.num_q_heads, ", ", h.num_kv_heads, " and ", h.head_dim));
    }
    if (h.layer < 0 || h.layer >= l.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", h.layer, " of sequence handle ",
                                                     s.handle, " is outside its ",
                                                     l.num_layers, " layers"));
    }
  }
  return absl::OkStatus();
}

void KvAttentionComputer::Append(const RequestView& request) {
  const transport::attention::RequestHeader& h = request.header;
  const int64_t row = QkvRowElements(h);
  const bool append_only = (h.flags & transport::attention::kAppendOnly) != 0;
  const int64_t q_elems = append_only ? 0 : int64_t{h.num_q_heads} * h.head_dim;
  const int64_t kv_elems = int64_t{h.num_kv_heads} * h.head_dim;
  const size_t element = WireElementSize(h.dtype);
  q_.resize(static_cast<size_t>(h.num_sequences) * q_elems);
  std::vector<float> kv(2 * kv_elems);
  for (int32_t i = 0; i < h.num_sequences; ++i) {
    const char* wire = request.rows + i * row * element;
    if (!append_only) FromWire(h.dtype, wire, &q_[i * q_elems], q_elems);
    FromWire(h.dtype, wire + q_elems * element, kv.data(), 2 * kv_elems);
    const PinnedSequence& s = pinned_[i];
    const SequenceLayout& l = *s.layout;
    for (int32_t head = 0; head < h.num_kv_heads; ++head) {
      char* k = KAt(s, h.layer, positions_[i], head);
      StoreElements(l.dtype, &kv[head * h.head_dim], k, h.head_dim);
      StoreElements(l.dtype, &kv[kv_elems + head * h.head_dim], k + l.value_offset_bytes,
                    h.head_dim);
    }
  }
}

void KvAttentionComputer::Attend(const RequestView& request, char* reply_rows) {
  const transport::attention::RequestHeader& h = request.header;
  const int64_t q_elems = int64_t{h.num_q_heads} * h.head_dim;
  const int32_t group = h.num_q_heads / h.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(h.head_dim));
  o_.assign(static_cast<size_t>(h.num_sequences) * q_elems, 0.0f);
  const int32_t n = h.num_sequences;
  executor_.run([&](int thread) {
    std::vector<float> key(h.head_dim), value(h.head_dim), scores;
    for (int32_t i = thread; i < n; i += executor_.threads) {
      const PinnedSequence& s = pinned_[i];
      const SequenceLayout& l = *s.layout;
      const int32_t context = positions_[i] + 1;
      scores.resize(context);
      for (int32_t qh = 0; qh < h.num_q_heads; ++qh) {
        const int32_t kvh = qh / group;
        const float* q = &q_[i * q_elems + qh * h.head_dim];
        float max_score = -INFINITY;
        for (int32_t t = 0; t < context; ++t) {
          numeric::ToFloat(l.dtype, KAt(s, h.layer, t, kvh), key.data(), h.head_dim);
          float dot = 0;
          for (int32_t d = 0; d < h.head_dim; ++d) dot += q[d] * key[d];
          scores[t] = dot * scale;
          max_score = std::max(max_score, scores[t]);
        }
        float sum = 0;
        for (int32_t t = 0; t < context; ++t) sum += scores[t] = std::exp(scores[t] - max_score);
        float* o = &o_[i * q_elems + qh * h.head_dim];
        for (int32_t t = 0; t < context; ++t) {
          numeric::ToFloat(l.dtype, KAt(s, h.layer, t, kvh) + l.value_offset_bytes, value.data(),
                           h.head_dim);
          const float p = scores[t] / sum;
          for (int32_t d = 0; d < h.head_dim; ++d) o[d] += p * value[d];
        }
      }
    }
  });
  int64_t bytes = 0;
  for (int32_t i = 0; i < n; ++i) {
    const SequenceLayout& l = *pinned_[i].layout;
    bytes += int64_t{positions_[i] + 1} * 2 * h.num_kv_heads * h.head_dim *
             static_cast<int64_t>(numeric::ElementSize(l.dtype));
  }
  kv_bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  ToWire(h.dtype, o_.data(), reply_rows, o_.size());
}

}  // namespace trident::attention
