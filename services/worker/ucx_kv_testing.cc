#include "services/worker/ucx_kv_testing.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/backend/host_kv_copier.h"
#include "common/status/status_macros.h"
#include "common/time/clock.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/kv_reservations.h"

namespace trident::worker::testing {
namespace {

class HostTestPool final : public TestPool {
 public:
  explicit HostTestPool(const kv::KvCacheSpec& spec) : spec_(spec), bytes_(spec.TotalBytes()) {}
  backend::KvMemory memory() const override {
    backend::KvMemory m;
    m.base = const_cast<uint8_t*>(bytes_.data());
    m.bytes = bytes_.size();
    m.spec = spec_;
    m.usable_blocks = spec_.num_blocks;
    return m;
  }
  void Fill(const std::vector<uint8_t>& bytes) override {
    std::copy(bytes.begin(), bytes.end(), bytes_.begin());
  }
  std::vector<uint8_t> Contents() const override { return bytes_; }
  absl::StatusOr<std::unique_ptr<backend::KvCopier>> NewCopier() const override {
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<backend::HostKvCopier> copier,
                             backend::HostKvCopier::Create(memory()));
    return std::unique_ptr<backend::KvCopier>(std::move(copier));
  }

 private:
  const kv::KvCacheSpec spec_;
  std::vector<uint8_t> bytes_;
};

// Hands out one fixed list of blocks.
class FixedBlocks final : public BlockSource {
 public:
  explicit FixedBlocks(std::vector<int32_t> blocks) : blocks_(std::move(blocks)) {}
  absl::StatusOr<std::vector<int32_t>> Reserve(int32_t num_blocks) override {
    if (num_blocks != static_cast<int32_t>(blocks_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("test reserves ", num_blocks, " blocks; set up for ", blocks_.size()));
    }
    return blocks_;
  }
  absl::Status Free(absl::Span<const int32_t>) override { return absl::OkStatus(); }

 private:
  const std::vector<int32_t> blocks_;
};

absl::StatusOr<UcxKvOptions> OptionsFor(const Side& side) {
  UcxKvOptions options;
  if (side.copier) {
    TRIDENT_ASSIGN_OR_RETURN(options.copier, side.pool->NewCopier());
  }
  options.force_staging = side.force_staging;
  options.staging_bytes = side.staging_bytes;
  options.staging_slot_bytes = side.staging_slot_bytes;
  options.max_message_bytes = side.max_message_bytes;
  return options;
}

}  // namespace

std::unique_ptr<TestPool> NewHostTestPool(const kv::KvCacheSpec& spec) {
  return std::make_unique<HostTestPool>(spec);
}

absl::StatusOr<TransferResult> RunTransfer(const TransferSetup& setup) {
  auto receiver_worker =
      transport::UcxWorker::Create({.transports = setup.transports, .name = "decode"});
  if (!receiver_worker.ok()) {
    return absl::UnavailableError(
        absl::StrCat("UCX transport '", setup.transports,
                     "' is not usable here: ", receiver_worker.status().ToString()));
  }
  auto sender_worker =
      transport::UcxWorker::Create({.transports = setup.transports, .name = "prefill"});
  if (!sender_worker.ok()) return sender_worker.status();

  FixedBlocks source(setup.remote_blocks);
  FakeClock clock;  // Never moves: the lease cannot end.
  KvReservationOptions reservation_options;
  reservation_options.block_size = setup.spec.block_size;
  KvReservations reservations(&source, &clock, reservation_options);

  TRIDENT_ASSIGN_OR_RETURN(UcxKvOptions receiver_options, OptionsFor(setup.receiver));
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<UcxKv> receiver,
      UcxKv::Create(receiver_worker->get(), setup.receiver.pool->memory(), "decode-0",
                    /*incarnation=*/7, std::move(receiver_options)));
  receiver->AcceptMessagesFor(&reservations);
  TRIDENT_ASSIGN_OR_RETURN(UcxKvOptions sender_options, OptionsFor(setup.sender));
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<UcxKv> sender,
      UcxKv::Create(sender_worker->get(), setup.sender.pool->memory(), "prefill-0",
                    /*incarnation=*/9, std::move(sender_options)));

  TRIDENT_ASSIGN_OR_RETURN(KvReservations::Reservation reservation,
                           reservations.Reserve("request-0", setup.num_tokens, absl::Minutes(5)));
  TransferResult result;
  result.sender_staged = sender->staged();
  result.receiver_staged = receiver->staged();
  trident::v1::KvDestination& d = result.destination;
  TRIDENT_RETURN_IF_ERROR(receiver->Describe(&d));
  d.set_decode_worker_id("decode-0");
  d.set_decode_incarnation(7);
  d.set_reservation_id(reservation.id);
  d.set_num_tokens(setup.num_tokens);
  for (int32_t b : reservation.blocks) d.add_block_ids(b);

  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<KvTransfer> transfer, sender->Open(d));
  absl::Mutex mu;
  int pending = 0;
  absl::Status first_error;
  for (int32_t layer = 0; layer < setup.spec.num_layers; ++layer) {
    {
      absl::MutexLock lock(&mu);
      ++pending;
    }
    transfer->SendLayer(layer, setup.local_blocks, [&](absl::Status s) {
      absl::MutexLock lock(&mu);
      if (!s.ok() && first_error.ok()) first_error = std::move(s);
      --pending;
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto drained = [&pending]() { return pending == 0; };
    mu.Await(absl::Condition(&drained));
  }
  TRIDENT_RETURN_IF_ERROR(first_error);
  TRIDENT_RETURN_IF_ERROR(reservations.AwaitBytes(reservation.id, transfer->message_bytes(),
                                                  absl::Now() + absl::Minutes(1)));
  result.message_bytes = transfer->message_bytes();
  result.bytes_sent = transfer->bytes_sent();
  result.messages = transfer->messages();
  KvCommit aborted;
  aborted.outcome = KvOutcome::kAborted;
  aborted.error = "test done";
  TRIDENT_RETURN_IF_ERROR(reservations.Commit(reservation.id, aborted));
  result.dropped_messages = receiver->dropped_messages();
  return result;
}

std::vector<uint8_t> RandomPoolBytes(const kv::KvCacheSpec& spec, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(spec.TotalBytes());
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  for (; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  return bytes;
}

::testing::AssertionResult TransferredExactly(const kv::KvCacheSpec& spec,
                                              const std::vector<uint8_t>& sender,
                                              const std::vector<uint8_t>& before,
                                              const std::vector<uint8_t>& after,
                                              const std::vector<int32_t>& local_blocks,
                                              const std::vector<int32_t>& remote_blocks) {
  if (after.size() != before.size()) {
    return ::testing::AssertionFailure() << "pool size changed";
  }
  std::vector<uint8_t> want = before;
  const uint64_t stride = spec.block_stride_bytes();
  for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
    for (size_t i = 0; i < remote_blocks.size(); ++i) {
      std::memcpy(want.data() + spec.KeyOffsetBytes(layer, remote_blocks[i]),
                  sender.data() + spec.KeyOffsetBytes(layer, local_blocks[i]), stride);
    }
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != after[i]) {
      const uint64_t layer = i / spec.layer_stride_bytes();
      const uint64_t block = (i % spec.layer_stride_bytes()) / stride;
      return ::testing::AssertionFailure()
             << "first wrong byte at offset " << i << " (layer " << layer << ", block " << block
             << ", byte " << i % stride << " of the block): want " << int{want[i]} << ", got "
             << int{after[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<int32_t> ScatteredBlocks(int32_t count, int32_t num_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  // Runs of 1 to 4 consecutive ids, the runs shuffled.
  std::vector<std::vector<int32_t>> runs;
  for (int32_t b = 0; b < num_blocks;) {
    const int32_t n = std::min(num_blocks - b, std::uniform_int_distribution<int32_t>(1, 4)(rng));
    runs.emplace_back();
    for (int32_t k = 0; k < n; ++k) runs.back().push_back(b + k);
    b += n;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  std::vector<int32_t> ids;
  for (const auto& run : runs) {
    for (int32_t id : run) {
      if (static_cast<int32_t>(ids.size()) < count) ids.push_back(id);
    }
  }
  return ids;
}

}  // namespace trident::worker::testing
