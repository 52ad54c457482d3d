// The attention service's computation of one data-plane request: for every
// sequence named, append the new token's k and v to its KV in the store (at
// the request's position), then decode attention of its q over positions
// [0, position], answered as o in the request's wire format.
//
// Per request: pin the sequences (SequenceStore::Pin: unknown handles,
// another owner's incarnation, positions past the capacity fail the whole
// request), check each sequence's shape against the request, append, run
// the decode-attention kernel over all of them at once (once per block
// layout among them: a sequence over an in-place prefix of the block store
// reads through a block table, in the store's rows layout), unpin.
//
// Called on the data plane's dispatcher thread only (not thread-safe); the
// kernel's threads are the caller-supplied executor's.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_
#define TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "kernels/cpu/decode_attention/decode_attention.h"
#include "services/attention/kv_store/block_store.h"
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
  // Most sequences, and q heads, one request may carry.
  static constexpr int32_t kMaxSequences = 1024;
  static constexpr int32_t kMaxQHeads = 128;
  // Requests with at least this many sequences (or tokens, for append-only
  // ones) convert and append their rows, and convert their answers, on
  // every thread: one sequence's new token touches ~600 cache lines of its
  // cold KV block and its o comes from the cores that merged it, ~20 us a
  // sequence on one thread (the H200 host), against a few us for a round of
  // the pool.
  static constexpr size_t kParallelRows = 4;
  // Block-store gets of at least this many bytes are copied out on every
  // thread: one thread copies ~5.5 GB/s (the H100 host), below what the
  // data plane moves.
  static constexpr size_t kParallelCopyBytes = size_t{1} << 20;

  // `store` must outlive the computer. The kernel's errors
  // (FAILED_PRECONDITION for an ISA this CPU lacks).
  static absl::StatusOr<std::unique_ptr<KvAttentionComputer>> Create(
      SequenceStore* store, Executor executor,
      kernels::cpu::DecodeIsa isa = kernels::cpu::DecodeIsa::kAuto);

  absl::Status Compute(const transport::attention::RequestView& request, char* reply_rows) override;

  // Serves the data plane's block-store requests from `blocks` (must
  // outlive the computer; set before the data plane starts). Without it
  // they are UNIMPLEMENTED.
  void set_block_store(BlockStore* blocks) { blocks_ = blocks; }
  absl::StatusOr<size_t> BlockGetBytes(const transport::attention::RequestView& request) override;
  absl::Status ServeBlocks(const transport::attention::RequestView& request, char* reply) override;

  // KV bytes the kernel read, over every request so far.
  // Thread-safe.
  int64_t kv_bytes_read() const { return kv_bytes_read_.load(std::memory_order_relaxed); }
  // The kernel's instruction set.
  kernels::cpu::DecodeIsa isa() const { return kernel_->isa(); }

 private:
  KvAttentionComputer(SequenceStore* store, Executor executor,
                      std::unique_ptr<kernels::cpu::DecodeAttention> kernel);
  absl::Status CheckShapes(const transport::attention::RequestView& request) const;
  void Append(const transport::attention::RequestView& request);
  // Append's work for entries [begin, end); `raw`: bf16 rows into a bf16
  // store, appended as they are.
  void AppendRange(const transport::attention::RequestView& request, bool raw, size_t begin,
                   size_t end);
  // A block-store get's copies, split across the executor's threads.
  void CopyInParallel(absl::Span<const BlockStore::BlockCopy> copies);
  // Runs fn(begin, end) over [0, n) split across the executor's threads
  // when n >= kParallelRows, else on this thread.
  void ForRanges(size_t n, const std::function<void(size_t, size_t)>& fn);
  absl::Status Attend(const transport::attention::RequestView& request, char* reply_rows);
  // The kernel's view of a sequence's KV geometry.
  static kernels::cpu::DecodeKvLayout KernelLayout(const SequenceLayout& layout);

  SequenceStore* const store_;
  BlockStore* blocks_ = nullptr;
  const Executor executor_;
  // Scratch kept between requests.
  std::vector<uint64_t> handles_;
  std::vector<int32_t> positions_;
  std::vector<PinnedSequence> pinned_;
  const std::unique_ptr<kernels::cpu::DecodeAttention> kernel_;
  std::vector<float> q_, k_, v_, o_;
  std::vector<kernels::cpu::DecodeKvAppend> appends_;
  std::vector<kernels::cpu::DecodeSequence> sequences_;
  std::vector<const void*> tables_;  // Block tables of in-place sequences.
  std::vector<bool> done_;           // Sequences attended (one kernel call per layout).
  std::atomic<int64_t> kv_bytes_read_{0};
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_ATTENTION_COMPUTER_H_
