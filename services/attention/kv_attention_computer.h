// The attention service's computation of one data-plane request: for every
// sequence named, append the new token's k and v to its KV in the store (at
// the request's position), then decode attention of its q over positions
// [0, position], answered as o in the request's wire format.
//
// Per request: pin the sequences (SequenceStore::Pin: unknown handles,
// another owner's incarnation, positions past the capacity fail the whole
// request), check each sequence's shape against the request, append, run
// the decode-attention kernel over all of them at once, unpin.
//
// Called on the data plane's dispatcher thread only (not thread-safe); the
// kernel's threads are the caller-supplied executor's.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_
#define TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "services/attention/kv_store/sequence_store.h"

namespace trident::attention {

// Runs fn(thread_index) for every thread index and returns when all are
// done (a pinned spinning pool in the service; a loop in tests).
struct Executor {
  int threads = 1;
  std::function<void(const std::function<void(int)>&)> run;
};

class KvAttentionComputer final : public transport::attention::AttentionComputer {
 public:
  // `store` must outlive the computer.
  KvAttentionComputer(SequenceStore* store, Executor executor);

  absl::Status Compute(const transport::attention::RequestView& request,
                       char* reply_rows) override;

  // KV bytes the kernel read, over every request so far.
  // Thread-safe.
  int64_t kv_bytes_read() const { return kv_bytes_read_.load(std::memory_order_relaxed); }

 private:
  absl::Status CheckShapes(const transport::attention::RequestView& request) const;
  void Append(const transport::attention::RequestView& request);
  void Attend(const transport::attention::RequestView& request, char* reply_rows);

  SequenceStore* const store_;
  const Executor executor_;
  // Scratch kept between requests.
  std::vector<uint64_t> handles_;
  std::vector<int32_t> positions_;
  std::vector<PinnedSequence> pinned_;
  std::vector<float> q_;
  std::vector<float> o_;
  std::atomic<int64_t> kv_bytes_read_{0};
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_
