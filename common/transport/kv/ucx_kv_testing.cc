#include "common/transport/kv/ucx_kv_testing.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/backend/host_kv_copier.h"
#include "common/status/status_macros.h"
#include "common/transport/kv/fake_kv_message_sink.h"
#include "common/transport/ucx_worker.h"

namespace trident::transport::testing {
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

absl::StatusOr<UcxKvOptions> OptionsFor(const Side& side, KvMessageSink* sink) {
  UcxKvOptions options;
  options.sink = sink;
  if (side.copier) {
    TRIDENT_ASSIGN_OR_RETURN(options.copier, side.pool->NewCopier());
  }
  options.force_staging = side.force_staging;
  options.staging_bytes = side.staging_bytes;
  options.staging_slot_bytes = side.staging_slot_bytes;
  options.max_message_bytes = side.max_message_bytes;
  options.receive_fetches = side.receive_fetches;
  options.lanes = side.lanes;
  return options;
}

}  // namespace

std::unique_ptr<TestPool> NewHostTestPool(const kv::KvCacheSpec& spec) {
  return std::make_unique<HostTestPool>(spec);
}

// Declared in the order they must be destroyed last-first: the UcxKv
// before their workers, the receiver before the reservations it writes.
struct KvTransferPair::State {
  std::unique_ptr<UcxWorker> receiver_worker;
  std::unique_ptr<UcxWorker> sender_worker;
  kv::KvCacheSpec spec;
  FakeKvMessageSink reservations;
  uint64_t next_reservation = 1;
  std::unique_ptr<UcxKv> receiver;
  std::unique_ptr<UcxKv> sender;
};

KvTransferPair::KvTransferPair(std::unique_ptr<State> state)
    : state_(std::move(state)), sender_(state_->sender.get()), receiver_(state_->receiver.get()) {}

KvTransferPair::~KvTransferPair() = default;

absl::StatusOr<std::unique_ptr<KvTransferPair>> KvTransferPair::Create(
    const std::string& transports, const kv::KvCacheSpec& spec, const Side& sender,
    const Side& receiver) {
  auto state = std::make_unique<State>();
  state->spec = spec;
  auto receiver_worker = UcxWorker::Create({.transports = transports, .name = "decode"});
  if (!receiver_worker.ok()) {
    return absl::UnavailableError(
        absl::StrCat("UCX transport '", transports,
                     "' is not usable here: ", receiver_worker.status().ToString()));
  }
  state->receiver_worker = *std::move(receiver_worker);
  TRIDENT_ASSIGN_OR_RETURN(state->sender_worker,
                           UcxWorker::Create({.transports = transports, .name = "prefill"}));
  TRIDENT_ASSIGN_OR_RETURN(UcxKvOptions receiver_options,
                           OptionsFor(receiver, &state->reservations));
  TRIDENT_ASSIGN_OR_RETURN(
      state->receiver,
      UcxKv::Create(state->receiver_worker.get(), receiver.pool->memory(), "decode-0",
                    /*incarnation=*/7, std::move(receiver_options)));
  TRIDENT_ASSIGN_OR_RETURN(UcxKvOptions sender_options, OptionsFor(sender, /*sink=*/nullptr));
  TRIDENT_ASSIGN_OR_RETURN(
      state->sender, UcxKv::Create(state->sender_worker.get(), sender.pool->memory(), "prefill-0",
                                   /*incarnation=*/9, std::move(sender_options)));
  return std::unique_ptr<KvTransferPair>(new KvTransferPair(std::move(state)));
}

absl::StatusOr<TransferResult> KvTransferPair::Transfer(int32_t num_tokens,
                                                        const std::vector<int32_t>& local_blocks,
                                                        const std::vector<int32_t>& remote_blocks) {
  State& s = *state_;
  const int32_t blocks_needed = (num_tokens + s.spec.block_size - 1) / s.spec.block_size;
  if (static_cast<int32_t>(remote_blocks.size()) != blocks_needed) {
    return absl::InvalidArgumentError(absl::StrCat(num_tokens, " tokens take ", blocks_needed,
                                                   " blocks; the test gave ",
                                                   remote_blocks.size()));
  }
  const uint64_t reservation = s.next_reservation++;
  s.reservations.Add(reservation, remote_blocks);
  TransferResult result;
  result.sender_staged = s.sender->staged();
  result.receiver_staged = s.receiver->staged();
  trident::v1::KvDestination& d = result.destination;
  TRIDENT_RETURN_IF_ERROR(s.receiver->Describe(&d));
  d.set_decode_worker_id("decode-0");
  d.set_decode_incarnation(7);
  d.set_reservation_id(reservation);
  d.set_num_tokens(num_tokens);
  for (int32_t b : remote_blocks) d.add_block_ids(b);

  absl::Status status = [&]() -> absl::Status {
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<KvTransfer> transfer, s.sender->Open(d));
    absl::Mutex mu;
    int pending = 0;
    absl::Status first_error;
    for (int32_t layer = 0; layer < s.spec.num_layers; ++layer) {
      {
        absl::MutexLock lock(&mu);
        ++pending;
      }
      transfer->SendLayer(layer, local_blocks, [&](absl::Status status) {
        absl::MutexLock lock(&mu);
        if (!status.ok() && first_error.ok()) first_error = std::move(status);
        --pending;
      });
    }
    {
      absl::MutexLock lock(&mu);
      auto drained = [&pending]() { return pending == 0; };
      mu.Await(absl::Condition(&drained));
    }
    TRIDENT_RETURN_IF_ERROR(first_error);
    TRIDENT_RETURN_IF_ERROR(s.reservations.AwaitBytes(reservation, transfer->message_bytes(),
                                                      absl::Now() + absl::Minutes(1)));
    result.message_bytes = transfer->message_bytes();
    result.bytes_sent = transfer->bytes_sent();
    result.messages = transfer->messages();
    return absl::OkStatus();
  }();
  s.reservations.End(reservation);
  TRIDENT_RETURN_IF_ERROR(status);
  result.dropped_messages = s.receiver->dropped_messages();
  result.messages_by_lane = s.receiver->messages_by_lane();
  return result;
}

absl::StatusOr<TransferResult> RunTransfer(const TransferSetup& setup) {
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<KvTransferPair> pair,
      KvTransferPair::Create(setup.transports, setup.spec, setup.sender, setup.receiver));
  return pair->Transfer(setup.num_tokens, setup.local_blocks, setup.remote_blocks);
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

}  // namespace trident::transport::testing
