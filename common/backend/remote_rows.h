// A forward pass's CPU-resident rows, grouped by the attention service that
// holds their KV: each layer sends one request per service (q and the new
// token's k and v of every row it holds) and takes their attention outputs
// back. Shared by the backends that offload (cpu, cuda); they differ only
// in where the rows are (f32 activations in host memory, or bf16 rows
// copied from the device into pinned memory).
//
//   RemoteRows rows({.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128});
//   rows.Clear();
//   rows.Add(sequence.remote, position, row);          // per CPU-resident row
//   rows.Start(layer, DType::kBF16, qkv, qkv_stride);  // sends
//   ... the other sub-batch or the local attention runs ...
//   rows.Finish(timeout, DType::kBF16, out, out_stride, timing);  // o is in out

#ifndef TRIDENT_COMMON_BACKEND_REMOTE_ROWS_H_
#define TRIDENT_COMMON_BACKEND_REMOTE_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/backend/model_backend.h"
#include "common/numeric/dtype.h"
#include "common/transport/attention/remote_attention.h"

namespace trident::backend {

// The offload fields of one step sequence, as the offloading backends take
// them: sub_batch 1 only for CPU-resident sequences (and nothing above 1),
// and a CPU-resident sequence decodes one token a step. INVALID_ARGUMENT
// saying which.
absl::Status ValidateOffloadFields(const StepSequence& s);

class RemoteRows {
 public:
  struct Shape {
    int32_t num_q_heads = 0;
    int32_t num_kv_heads = 0;
    int32_t head_dim = 0;
    // Format on the wire (f32 exact, bf16 half the bytes).
    transport::attention::WireDType wire = transport::attention::WireDType::kF32;
  };

  RemoteRows() = default;
  explicit RemoteRows(const Shape& shape) : shape_(shape) {}
  void set_shape(const Shape& shape) { shape_ = shape; }

  // Forgets the rows of the last step (keeps the buffers).
  void Clear();
  // Row `row` (an index into the arrays Start and Finish are given) decodes
  // the token at `position` of the sequence `remote` names.
  void Add(const RemoteKv& remote, int32_t position, int64_t row);
  bool empty() const { return num_rows_ == 0; }
  int64_t size() const { return num_rows_; }

  // Sends layer `layer`'s request to each service: row r's q is at
  // qkv + r * qkv_stride elements of `dtype` (f32 or bf16), its k right
  // after q (num_q_heads * head_dim elements on) and its v after k. On a
  // failure the requests already sent stay in flight: Finish still waits
  // for them. UNAVAILABLE with the failing service in the payload
  // (RemoteAttentionFailure).
  absl::Status Start(int32_t layer, numeric::DType dtype, const void* qkv, int64_t qkv_stride);

  // Waits for every request Start sent; on success writes row r's o at
  // out + r * out_stride elements of `dtype`, converted (bf16 rows on a bf16
  // wire go as they are, both ways). Adds each
  // request's round trip and the time it stood waiting here to `timing`.
  // The first failure (RemoteAttentionFailure), after waiting for all.
  absl::Status Finish(absl::Duration timeout, numeric::DType dtype, void* out, int64_t out_stride,
                      RemoteAttentionTiming& timing);

 private:
  struct Group {
    transport::attention::RemoteAttention* service = nullptr;
    std::vector<int64_t> rows;
    std::vector<uint64_t> handles;
    std::vector<int32_t> positions;
    std::vector<float> q, k, v, out;  // Gathered rows; o before the scatter.
    // bf16 rows sent as they are: q, k and v read in place when the group's
    // rows are consecutive (else gathered into qkv_bf16); o received into
    // out_bf16 before the scatter.
    std::vector<uint16_t> qkv_bf16, out_bf16;
    bool bf16 = false;
    transport::attention::RemoteAttention::Ticket ticket = 0;
    bool started = false;
    absl::Time started_at;
  };

  // Start's call for `g` with bf16 rows on a bf16 wire (no conversion).
  void PrepareBf16(Group& g, const uint16_t* qkv, int64_t qkv_stride,
                   transport::attention::AttentionCall& call);
  // Start's call for `g` otherwise: rows gathered and converted to f32.
  void GatherF32(Group& g, numeric::DType dtype, const void* qkv, int64_t qkv_stride,
                 transport::attention::AttentionCall& call);

  Shape shape_;
  std::vector<Group> groups_;
  int64_t num_rows_ = 0;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_REMOTE_ROWS_H_
