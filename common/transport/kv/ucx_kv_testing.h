// Test support for UcxKv: one KV transfer between two UcxKv (each on its own
// UcxWorker in this process), from blocks of a sender pool into a
// reservation of a receiver pool, through the production path: Describe ->
// Open -> SendLayer for every layer -> the receiver's message handler ->
// the receiver's byte count (a FakeKvMessageSink standing in for the decode
// worker's reservations). Pools are abstract so the same check runs on
// host memory (ucx_kv_test) and on CUDA device memory (ucx_kv_cuda_test).

#ifndef TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_TESTING_H_
#define TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_TESTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/ucx_kv.h"
#include "gtest/gtest.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport::testing {

// A KV pool a test can fill and read back whole.
class TestPool {
 public:
  virtual ~TestPool() = default;
  virtual backend::KvMemory memory() const = 0;
  virtual void Fill(const std::vector<uint8_t>& bytes) = 0;
  virtual std::vector<uint8_t> Contents() const = 0;
  // A copier for the pool (HostKvCopier, CudaKvCopier, ...).
  virtual absl::StatusOr<std::unique_ptr<backend::KvCopier>> NewCopier() const = 0;
};

// A pool in host memory with a HostKvCopier.
std::unique_ptr<TestPool> NewHostTestPool(const kv::KvCacheSpec& spec);

// One side's settings.
struct Side {
  TestPool* pool = nullptr;
  // Give the UcxKv a copier (pool->NewCopier()).
  bool copier = false;
  bool force_staging = false;
  uint64_t staging_bytes = uint64_t{256} << 20;
  uint64_t staging_slot_bytes = uint64_t{16} << 20;
  uint64_t max_message_bytes = uint64_t{4} << 20;
  // UcxKvOptions::receive_fetches.
  int receive_fetches = UcxKvOptions().receive_fetches;
  // UcxKvOptions::lanes.
  int lanes = 1;
};

struct TransferSetup {
  // UCX_TLS of both workers.
  std::string transports = "posix";
  kv::KvCacheSpec spec;
  Side sender;
  Side receiver;
  int32_t num_tokens = 0;
  // The sender's blocks, in token order; ceil(num_tokens / block_size).
  std::vector<int32_t> local_blocks;
  // The receiver's blocks the reservation gets, in token order.
  std::vector<int32_t> remote_blocks;
};

struct TransferResult {
  bool sender_staged = false;
  bool receiver_staged = false;
  // The receiver's ReserveKv reply (Describe).
  trident::v1::KvDestination destination;
  int64_t message_bytes = 0;
  int64_t bytes_sent = 0;
  int32_t messages = 0;
  int64_t dropped_messages = 0;
  // The receiver's UcxKv::messages_by_lane() after the transfer.
  std::vector<int64_t> messages_by_lane;
};

// Two UcxKv (each on its own UcxWorker) and the receiver's reservations,
// for any number of transfers (benchmarks). Not thread-safe.
class KvTransferPair {
 public:
  // UNAVAILABLE (callers skip) when the transport is not usable here; the
  // errors of UcxKv::Create.
  static absl::StatusOr<std::unique_ptr<KvTransferPair>> Create(const std::string& transports,
                                                                const kv::KvCacheSpec& spec,
                                                                const Side& sender,
                                                                const Side& receiver);
  ~KvTransferPair();

  // Reserves `remote_blocks` for `num_tokens` on the receiver, sends every
  // layer of `local_blocks` and waits (up to a minute) for every byte to
  // arrive; then ends the reservation.
  absl::StatusOr<TransferResult> Transfer(int32_t num_tokens,
                                          const std::vector<int32_t>& local_blocks,
                                          const std::vector<int32_t>& remote_blocks);

  UcxKv& sender() { return *sender_; }
  UcxKv& receiver() { return *receiver_; }

 private:
  struct State;
  explicit KvTransferPair(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  UcxKv* sender_ = nullptr;
  UcxKv* receiver_ = nullptr;
};

// One transfer on a new KvTransferPair.
absl::StatusOr<TransferResult> RunTransfer(const TransferSetup& setup);

// Bytes of `spec`-shaped pools: deterministic from `seed`.
std::vector<uint8_t> RandomPoolBytes(const kv::KvCacheSpec& spec, uint32_t seed);

// Whether `after` (the receiver pool) equals `before` except that for every
// layer, block remote_blocks[i] holds the sender's block local_blocks[i].
::testing::AssertionResult TransferredExactly(const kv::KvCacheSpec& spec,
                                              const std::vector<uint8_t>& sender,
                                              const std::vector<uint8_t>& before,
                                              const std::vector<uint8_t>& after,
                                              const std::vector<int32_t>& local_blocks,
                                              const std::vector<int32_t>& remote_blocks);

// `count` distinct block ids below `num_blocks`: shuffled, with some runs of
// consecutive ids kept (so that collation and splitting both happen).
std::vector<int32_t> ScatteredBlocks(int32_t count, int32_t num_blocks, uint32_t seed);

}  // namespace trident::transport::testing

#endif  // TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_TESTING_H_
