// An attention service in process, for tests of the decode side: it holds
// each admitted sequence's KV in fp32 (a map, no paging), appends and
// attends exactly as a service does (fp64 accumulation), and answers at
// once. It can be killed: from then on Start and Wait answer UNAVAILABLE.

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_FAKE_REMOTE_ATTENTION_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_FAKE_REMOTE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/attention/remote_attention.h"

namespace trident::transport::attention {

// Thread-safe.
class FakeRemoteAttention final : public RemoteAttention {
 public:
  FakeRemoteAttention(int32_t num_layers, int32_t num_q_heads, int32_t num_kv_heads,
                      int32_t head_dim)
      : num_layers_(num_layers),
        num_q_heads_(num_q_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim) {}

  // Holds a new sequence; returns its handle.
  uint64_t Admit() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes one token's k and v ([num_kv_heads][head_dim] each) of `layer`
  // at `position` (the prompt's KV, as a prefill worker would).
  void WriteKv(uint64_t handle, int32_t layer, int32_t position, const float* k, const float* v)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool Release(uint64_t handle) ABSL_LOCKS_EXCLUDED(mu_);
  int sequences() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every later Start and Wait fails UNAVAILABLE, as for a dead service.
  void Kill() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t requests() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<Ticket> Start(const AttentionCall& call) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Ticket> StartAppend(const KvAppendCall& call) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(Ticket ticket, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Start for a call with bf16 rows (AttentionCall::qkv_bf16).
  absl::StatusOr<Ticket> StartBf16(const AttentionCall& call) ABSL_LOCKS_EXCLUDED(mu_);
  struct Sequence {
    // [layer][position] -> k row, v row.
    std::vector<std::vector<std::vector<float>>> k, v;
  };
  void StoreLocked(Sequence& s, int32_t layer, int32_t position, const float* k, const float* v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Attend(const Sequence& s, int32_t layer, int32_t position, const float* q, float* out) const;

  const int32_t num_layers_, num_q_heads_, num_kv_heads_, head_dim_;
  mutable absl::Mutex mu_;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Ticket, absl::Status> answers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_FAKE_REMOTE_ATTENTION_H_
