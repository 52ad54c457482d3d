// The attention data plane between two UCX workers of this process: a
// client's per-layer requests reach a server's computer and its answers come
// back into the caller's rows, errors included.

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "common/transport/attention/attention_wire.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport::attention {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// A queued job as NextJobIndex sees it.
struct FakeJob {
  bool is_background = false;
  absl::Time arrived;
  bool background() const { return is_background; }
};

TEST(NextJobIndexTest, PutsWaitBehindAnsweredRequestsForAtMostTheirDelay) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration delay = absl::Milliseconds(20);
  auto queue = [](std::vector<FakeJob> jobs) {
    std::vector<std::unique_ptr<FakeJob>> q;
    for (FakeJob& j : jobs) q.push_back(std::make_unique<FakeJob>(j));
    return q;
  };
  // Oldest first when it waits for an answer.
  EXPECT_EQ(NextJobIndex(queue({{false, t0}, {true, t0}}), t0, delay), 0u);
  // A young put yields to the first request behind it.
  EXPECT_EQ(NextJobIndex(queue({{true, t0}, {true, t0}, {false, t0}}), t0 + delay / 2, delay), 2u);
  // Past its delay it goes first.
  EXPECT_EQ(NextJobIndex(queue({{true, t0}, {false, t0}}), t0 + delay, delay), 0u);
  // Only puts: the oldest.
  EXPECT_EQ(NextJobIndex(queue({{true, t0}, {true, t0}}), t0, delay), 0u);
}

constexpr int32_t kQHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeadDim = 16;
constexpr int32_t kQElems = kQHeads * kHeadDim;
constexpr int32_t kKvElems = kKvHeads * kHeadDim;

// o = q + position + layer + (k[0] + v[0]) of the same row: checkable, and
// it needs every field of the request.
class SumComputer final : public AttentionComputer {
 public:
  absl::Status Compute(const RequestView& request, char* reply_rows) override {
    const RequestHeader& h = request.header;
    {
      absl::MutexLock lock(&mu_);
      layers_.push_back(h.layer);
      if (!fail_with_.ok()) return fail_with_;
    }
    const size_t element = WireElementSize(h.dtype);
    const int64_t row = QkvRowElements(h);
    if ((h.flags & kAppendOnly) != 0) {  // Kept as they came; no reply rows.
      absl::MutexLock lock(&mu_);
      appended_.assign(request.rows, h.num_sequences * row * element);
      return absl::OkStatus();
    }
    std::vector<float> qkv(row);
    std::vector<float> out(kQElems);
    for (int32_t i = 0; i < h.num_sequences; ++i) {
      FromWire(h.dtype, request.rows + i * row * element, qkv.data(), row);
      const float extra = static_cast<float>(request.sequences[i].position + h.layer +
                                             request.sequences[i].handle) +
                          qkv[kQElems] + qkv[kQElems + kKvElems];
      for (int j = 0; j < kQElems; ++j) out[j] = qkv[j] + extra;
      ToWire(h.dtype, out.data(), reply_rows + i * kQElems * element, kQElems);
    }
    return absl::OkStatus();
  }
  // Blocks: a put keeps its bytes under (ticket, first); a get of ticket t
  // answers what (t - 1, first) holds, so a put under ticket 1 is read
  // back with ticket 2. Ticket 9 is unknown.
  absl::StatusOr<size_t> BlockGetBytes(const RequestView& request) override {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find({request.header.write_key - 1, request.header.layer});
    if (it == blocks_.end()) return absl::NotFoundError("no such block ticket");
    return it->second.size();
  }
  absl::Status ServeBlocks(const RequestView& request, char* reply) override {
    const RequestHeader& h = request.header;
    absl::MutexLock lock(&mu_);
    if ((h.flags & kAppendOnly) != 0) {
      blocks_[{h.write_key, h.layer}].assign(request.rows, request.block_bytes);
      return absl::OkStatus();
    }
    const std::string& bytes = blocks_.at({h.write_key - 1, h.layer});
    std::memcpy(reply, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  void FailWith(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(status);
  }
  std::vector<int32_t> layers() {
    absl::MutexLock lock(&mu_);
    return layers_;
  }
  // The rows of the last append-only request, as received.
  std::string appended() {
    absl::MutexLock lock(&mu_);
    return appended_;
  }

 private:
  std::string appended_ ABSL_GUARDED_BY(mu_);
  absl::Mutex mu_;
  std::map<std::pair<uint64_t, int32_t>, std::string> blocks_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> layers_ ABSL_GUARDED_BY(mu_);
};

trident::v1::TransportEndpoint Describe(const UcxLanes& lanes, const std::string& owner,
                                        uint64_t incarnation) {
  trident::v1::TransportEndpoint endpoint;
  endpoint.set_owner_id(owner);
  endpoint.set_incarnation(incarnation);
  lanes.DescribeAddresses(&endpoint);
  return endpoint;
}

class UcxAttentionTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    for (auto* worker : {&service_worker_, &client_worker_}) {
      auto created = UcxWorker::Create({.transports = GetParam(), .name = "attention-test"});
      if (!created.ok()) GTEST_SKIP() << created.status();
      *worker = *std::move(created);
    }
    auto service_lanes = UcxLanes::Create(service_worker_.get(), {.lanes = 2});
    auto client_lanes = UcxLanes::Create(client_worker_.get(), {.lanes = 2});
    ASSERT_THAT(service_lanes.status(), IsOk());
    ASSERT_THAT(client_lanes.status(), IsOk());
    service_lanes_ = *std::move(service_lanes);
    client_lanes_ = *std::move(client_lanes);
    auto server = UcxAttentionServer::Create(service_lanes_.get(), &computer_);
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    auto client = UcxAttentionClient::Create(client_lanes_.get(), kIncarnation);
    ASSERT_THAT(client.status(), IsOk());
    client_ = *std::move(client);
  }

  // Routes the client at the server and returns its channel.
  std::unique_ptr<RemoteAttention> Connect() {
    EXPECT_THAT(server_->AddPeer(Describe(*client_lanes_, "decode-0", kIncarnation)), IsOk());
    auto channel = client_->ForService(Describe(*service_lanes_, "attention-0", 99));
    EXPECT_THAT(channel.status(), IsOk());
    return channel.ok() ? *std::move(channel) : nullptr;
  }

  static constexpr uint64_t kIncarnation = 1234;
  SumComputer computer_;
  std::unique_ptr<UcxWorker> service_worker_;
  std::unique_ptr<UcxWorker> client_worker_;
  std::unique_ptr<UcxLanes> service_lanes_;
  std::unique_ptr<UcxLanes> client_lanes_;
  std::unique_ptr<UcxAttentionServer> server_;
  std::unique_ptr<UcxAttentionClient> client_;
};

struct Rows {
  explicit Rows(int n) : q(n * kQElems), k(n * kKvElems), v(n * kKvElems), out(n * kQElems, -1) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>(i % 37);
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i % 3);
  }
  AttentionCall Call(int32_t layer, const std::vector<uint64_t>& handles,
                     const std::vector<int32_t>& positions, WireDType dtype) {
    return AttentionCall{.layer = layer,
                         .num_q_heads = kQHeads,
                         .num_kv_heads = kKvHeads,
                         .head_dim = kHeadDim,
                         .dtype = dtype,
                         .handles = handles,
                         .positions = positions,
                         .q = q.data(),
                         .q_stride = kQElems,
                         .k = k.data(),
                         .k_stride = kKvElems,
                         .v = v.data(),
                         .v_stride = kKvElems,
                         .out = out.data(),
                         .out_stride = kQElems};
  }
  // What SumComputer answers for row i.
  float Expected(int i, int j, int32_t layer, uint64_t handle, int32_t position) const {
    return q[i * kQElems + j] + static_cast<float>(position + layer + handle) + k[i * kKvElems] +
           v[i * kKvElems];
  }
  std::vector<float> q, k, v, out;
};

TEST_P(UcxAttentionTest, RepliesLandInTheCallersRowsExactlyInF32) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  const std::vector<uint64_t> handles = {7, 8, 9};
  const std::vector<int32_t> positions = {0, 15, 300};
  for (int32_t layer = 0; layer < 4; ++layer) {  // Both lanes, twice.
    Rows rows(3);
    auto ticket = channel->Start(rows.Call(layer, handles, positions, WireDType::kF32));
    ASSERT_THAT(ticket.status(), IsOk());
    ASSERT_THAT(channel->Wait(*ticket, absl::Seconds(30)), IsOk());
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < kQElems; ++j) {
        ASSERT_EQ(rows.out[i * kQElems + j], rows.Expected(i, j, layer, handles[i], positions[i]))
            << "layer " << layer << " row " << i << " element " << j;
      }
    }
  }
  EXPECT_EQ(computer_.layers(), (std::vector<int32_t>{0, 1, 2, 3}));
  AttentionServerCounters counters = server_->counters();
  EXPECT_EQ(counters.requests, 4);
  EXPECT_EQ(counters.sequences, 12);
  EXPECT_EQ(counters.errors, 0);
}

TEST_P(UcxAttentionTest, TwoRequestsInFlightAreAnsweredEachIntoItsOwnRows) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  Rows a(2), b(1);
  const std::vector<uint64_t> ha = {1, 2}, hb = {3};
  const std::vector<int32_t> pa = {4, 5}, pb = {6};
  auto ta = channel->Start(a.Call(0, ha, pa, WireDType::kBF16));
  auto tb = channel->Start(b.Call(0, hb, pb, WireDType::kBF16));
  ASSERT_THAT(ta.status(), IsOk());
  ASSERT_THAT(tb.status(), IsOk());
  ASSERT_THAT(channel->Wait(*tb, absl::Seconds(30)), IsOk());
  ASSERT_THAT(channel->Wait(*ta, absl::Seconds(30)), IsOk());
  for (int j = 0; j < kQElems; ++j) {
    const float want = b.Expected(0, j, 0, 3, 6);
    EXPECT_NEAR(b.out[j], want, std::abs(want) / 64) << j;  // bf16 both ways.
    const float want_a = a.Expected(1, j, 0, 2, 5);
    EXPECT_NEAR(a.out[kQElems + j], want_a, std::abs(want_a) / 64) << j;
  }
  EXPECT_THAT(channel->Wait(*ta, absl::Seconds(1)), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(UcxAttentionTest, TheComputersErrorReachesTheCallerAndLeavesItsRows) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  computer_.FailWith(absl::NotFoundError("sequence handle 7 is not held"));
  Rows rows(1);
  const std::vector<uint64_t> handles = {7};
  const std::vector<int32_t> positions = {0};
  auto ticket = channel->Start(rows.Call(0, handles, positions, WireDType::kF32));
  ASSERT_THAT(ticket.status(), IsOk());
  EXPECT_THAT(channel->Wait(*ticket, absl::Seconds(30)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("handle 7 is not held")));
  EXPECT_EQ(rows.out[0], -1.0f);
  EXPECT_EQ(server_->counters().errors, 1);
}

TEST_P(UcxAttentionTest, ARequestWithNoRouteIsDroppedAndTheCallerTimesOut) {
  auto channel = client_->ForService(Describe(*service_lanes_, "attention-0", 99));
  ASSERT_THAT(channel.status(), IsOk());  // No AddPeer: the server cannot answer.
  Rows rows(1);
  const std::vector<uint64_t> handles = {7};
  const std::vector<int32_t> positions = {0};
  auto ticket = (*channel)->Start(rows.Call(0, handles, positions, WireDType::kF32));
  ASSERT_THAT(ticket.status(), IsOk());
  EXPECT_THAT((*channel)->Wait(*ticket, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(rows.out[0], -1.0f);
}

TEST_P(UcxAttentionTest, MalformedRequestsAreAnsweredOrDroppedNeverComputed) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  auto endpoints = client_lanes_->EndpointsTo(Describe(*service_lanes_, "attention-0", 99));
  ASSERT_THAT(endpoints.status(), IsOk());
  // A readable header with a shape its data does not match: answered.
  RequestHeader header{.request_id = 555,
                       .owner_incarnation = kIncarnation,
                       .num_sequences = 2,
                       .num_q_heads = kQHeads,
                       .num_kv_heads = kKvHeads,
                       .head_dim = kHeadDim};
  const std::string short_data(40, 'x');
  absl::Notification sent_a, sent_b;
  (*endpoints)[0]->Send(kAttentionRequestMessageId, EncodeRequestHeader(header), short_data.data(),
                        short_data.size(), [&](absl::Status) { sent_a.Notify(); });
  // Garbage: dropped.
  (*endpoints)[0]->Send(kAttentionRequestMessageId, "garbage", short_data.data(), short_data.size(),
                        [&](absl::Status) { sent_b.Notify(); });
  sent_a.WaitForNotification();
  sent_b.WaitForNotification();
  // A good request after them, on the same lane, is served after them.
  Rows rows(1);
  const std::vector<uint64_t> handles = {1};
  const std::vector<int32_t> positions = {0};
  auto ticket = channel->Start(rows.Call(0, handles, positions, WireDType::kF32));
  ASSERT_THAT(ticket.status(), IsOk());
  ASSERT_THAT(channel->Wait(*ticket, absl::Seconds(30)), IsOk());
  auto ticket2 = channel->Start(rows.Call(1, handles, positions, WireDType::kF32));
  ASSERT_THAT(ticket2.status(), IsOk());
  ASSERT_THAT(channel->Wait(*ticket2, absl::Seconds(30)), IsOk());
  AttentionServerCounters counters = server_->counters();
  EXPECT_EQ(counters.bad_messages, 2);
  EXPECT_EQ(counters.dropped, 1);
  EXPECT_EQ(counters.errors, 1);
  EXPECT_EQ(counters.requests, 2);
  EXPECT_EQ(computer_.layers(), (std::vector<int32_t>{0, 1}));
}

TEST_P(UcxAttentionTest, ThreadsSendingAndWaitingAtOnceEachGetTheirOwnAnswers) {
  // A waiter's request stays findable while other threads add theirs (the
  // pending table grows and rehashes under it).
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  constexpr int kThreads = 4, kRequestsEach = 40;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<uint64_t> handles = {static_cast<uint64_t>(100 + t)};
      for (int r = 0; r < kRequestsEach; ++r) {
        Rows rows(1);
        const std::vector<int32_t> positions = {r};
        auto ticket = channel->Start(rows.Call(t, handles, positions, WireDType::kF32));
        if (!ticket.ok() || !channel->Wait(*ticket, absl::Seconds(30)).ok() ||
            rows.out[0] != rows.Expected(0, 0, t, handles[0], r)) {
          ++wrong[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(kThreads, 0));
  EXPECT_EQ(server_->counters().requests, kThreads * kRequestsEach);
}

TEST_P(UcxAttentionTest, LargeRequestsGoByRendezvousAndArriveWhole) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  // 1024 rows of 128 f32 elements (q, k, v): 512 KiB, past kRendezvousBytes.
  constexpr int kRows = 1024;
  Rows rows(kRows);
  std::vector<uint64_t> handles(kRows);
  std::vector<int32_t> positions(kRows);
  for (int i = 0; i < kRows; ++i) {
    handles[i] = 1000 + i;
    positions[i] = i;
  }
  ASSERT_GE(static_cast<size_t>(kRows) * (kQElems + 2 * kKvElems) * sizeof(float),
            kRendezvousBytes);
  auto ticket = channel->Start(rows.Call(2, handles, positions, WireDType::kF32));
  ASSERT_THAT(ticket.status(), IsOk());
  ASSERT_THAT(channel->Wait(*ticket, absl::Seconds(30)), IsOk());
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kQElems; ++j) {
      ASSERT_EQ(rows.out[i * kQElems + j], rows.Expected(i, j, 2, handles[i], positions[i]))
          << "row " << i << " element " << j;
    }
  }
  EXPECT_EQ(server_->counters().sequences, kRows);
  EXPECT_EQ(server_->counters().rendezvous, 1);
}

TEST_P(UcxAttentionTest, AppendsSendBf16RowsAsTheyAre) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  const std::vector<uint64_t> handles = {5, 6};
  const std::vector<int32_t> positions = {0, 1};
  // Row i of k at i * 3 * kKvElems (a stride wider than the row).
  std::vector<uint16_t> k(2 * 3 * kKvElems), v(k.size());
  for (size_t j = 0; j < k.size(); ++j) {
    k[j] = static_cast<uint16_t>(0x3f00 + j);
    v[j] = static_cast<uint16_t>(0xbf00 + j);
  }
  KvAppendCall call{.layer = 1,
                    .num_kv_heads = kKvHeads,
                    .head_dim = kHeadDim,
                    .dtype = WireDType::kBF16,
                    .handles = handles,
                    .positions = positions,
                    .k_stride = 3 * kKvElems,
                    .v_stride = 3 * kKvElems};
  call.k_bf16 = k.data();
  call.v_bf16 = v.data();
  auto ticket = channel->StartAppend(call);
  ASSERT_THAT(ticket.status(), IsOk());
  ASSERT_THAT(channel->Wait(*ticket, absl::Seconds(30)), IsOk());
  std::string want;
  for (int i = 0; i < 2; ++i) {
    for (const std::vector<uint16_t>* rows : {&k, &v}) {
      want.append(reinterpret_cast<const char*>(rows->data() + i * 3 * kKvElems),
                  kKvElems * sizeof(uint16_t));
    }
  }
  EXPECT_EQ(computer_.appended(), want);
  // bf16 rows go out as bf16 only, and one kind of row at a time.
  call.dtype = WireDType::kF32;
  EXPECT_THAT(channel->StartAppend(call).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must send bf16")));
  call.dtype = WireDType::kBF16;
  const std::vector<float> f32(k.size());
  call.k = f32.data();
  call.v = f32.data();
  EXPECT_THAT(channel->StartAppend(call).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("either k and v")));
}

TEST_P(UcxAttentionTest, Bf16RowsGoBothWaysAsTheyAre) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  const std::vector<uint64_t> handles = {3, 4};
  const std::vector<int32_t> positions = {10, 11};
  // The f32 call on a bf16 wire, and the same rows as bf16 [q | k | v] in
  // rows of a wider stride, o into rows of another: the same bits.
  Rows rows(2);
  auto f32_ticket = channel->Start(rows.Call(2, handles, positions, WireDType::kBF16));
  ASSERT_THAT(f32_ticket.status(), IsOk());
  ASSERT_THAT(channel->Wait(*f32_ticket, absl::Seconds(30)), IsOk());
  constexpr int64_t kStride = kQElems + 2 * kKvElems + 8;
  std::vector<uint16_t> qkv(2 * kStride, 0xffff), out(2 * (kQElems + 3), 0xffff);
  for (int i = 0; i < 2; ++i) {
    uint16_t* row = &qkv[i * kStride];
    numeric::FloatToBf16(&rows.q[i * kQElems], row, kQElems);
    numeric::FloatToBf16(&rows.k[i * kKvElems], row + kQElems, kKvElems);
    numeric::FloatToBf16(&rows.v[i * kKvElems], row + kQElems + kKvElems, kKvElems);
  }
  AttentionCall call{.layer = 2,
                     .num_q_heads = kQHeads,
                     .num_kv_heads = kKvHeads,
                     .head_dim = kHeadDim,
                     .dtype = WireDType::kBF16,
                     .handles = handles,
                     .positions = positions};
  call.qkv_bf16 = qkv.data();
  call.qkv_bf16_stride = kStride;
  call.out_bf16 = out.data();
  call.out_bf16_stride = kQElems + 3;
  auto ticket = channel->Start(call);
  ASSERT_THAT(ticket.status(), IsOk());
  ASSERT_THAT(channel->Wait(*ticket, absl::Seconds(30)), IsOk());
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < kQElems; ++j) {
      ASSERT_EQ(out[i * (kQElems + 3) + j], numeric::FloatToBf16(rows.out[i * kQElems + j]))
          << "row " << i << " element " << j;
    }
    for (int j = kQElems; j < kQElems + 3 && i == 0; ++j) {
      EXPECT_EQ(out[j], 0xffff) << "past the row";
    }
  }
  // bf16 rows go out as bf16 only, and one kind of row at a time.
  call.dtype = WireDType::kF32;
  EXPECT_THAT(channel->Start(call).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must send bf16")));
  call.dtype = WireDType::kBF16;
  call.q = rows.q.data();
  call.k = rows.k.data();
  call.v = rows.v.data();
  call.out = rows.out.data();
  EXPECT_THAT(channel->Start(call).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("either q, k, v and out")));
}

TEST_P(UcxAttentionTest, StartChecksTheCall) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  Rows rows(1);
  const std::vector<uint64_t> handles = {1, 2};
  const std::vector<int32_t> positions = {0};
  EXPECT_THAT(channel->Start(rows.Call(0, handles, positions, WireDType::kF32)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one position per handle")));
}

TEST_P(UcxAttentionTest, BlocksGoToTheStoreAndComeBack) {
  std::unique_ptr<RemoteAttention> channel = Connect();
  ASSERT_NE(channel, nullptr);
  // 3 blocks of 96 KiB: the put goes by rendezvous, the get's reply eagerly.
  std::string blocks(3 * 96 * 1024, '\0');
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<char>(i * 7 + i / 4096);
  auto put = channel->StartBlockPut(
      BlockPutCall{.ticket = 1, .first = 2, .count = 3, .data = blocks.data(), .bytes = blocks.size()});
  ASSERT_THAT(put.status(), IsOk());
  ASSERT_THAT(channel->Wait(*put, absl::Seconds(20)), IsOk());
  std::string back(blocks.size(), '\0');
  auto get = channel->StartBlockGet(
      BlockGetCall{.ticket = 2, .first = 2, .count = 3, .out = back.data(), .bytes = back.size()});
  ASSERT_THAT(get.status(), IsOk());
  ASSERT_THAT(channel->Wait(*get, absl::Seconds(20)), IsOk());
  EXPECT_TRUE(back == blocks);
  // A get of the wrong size is refused, not written past.
  std::string small(1024, 'x');
  get = channel->StartBlockGet(
      BlockGetCall{.ticket = 2, .first = 2, .count = 3, .out = small.data(), .bytes = small.size()});
  ASSERT_THAT(get.status(), IsOk());
  EXPECT_THAT(channel->Wait(*get, absl::Seconds(20)), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(small, std::string(1024, 'x'));
  // The store's error comes back as it is.
  get = channel->StartBlockGet(
      BlockGetCall{.ticket = 9, .first = 0, .count = 1, .out = small.data(), .bytes = small.size()});
  ASSERT_THAT(get.status(), IsOk());
  EXPECT_THAT(channel->Wait(*get, absl::Seconds(20)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such block ticket")));
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxAttentionTest, ::testing::Values("tcp", "posix"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace trident::transport::attention
