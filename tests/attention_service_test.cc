// The attention service as a process: a decode worker's side (this test: a
// UCX worker, UcxAttentionClient and the gRPC stub) connects, admits
// sequences, sends per-layer q/k/v over UCX and gets attention outputs
// equal to a plain computation over what it sent; bad requests get their
// errors; the budget holds; a decode worker that vanishes loses its
// sequences after the grace period, and all memory is free at the end.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/numa/numa_topology.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/status/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/service_process.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::StatusIs;
using ::trident::testing::ServiceProcess;
using ::trident::testing::StartService;
using ::trident::testing::StopService;
using transport::attention::AttentionCall;
using transport::attention::RemoteAttention;
using transport::attention::WireDType;

constexpr int32_t kLayers = 2, kQHeads = 8, kKvHeads = 2, kHeadDim = 32;
constexpr int32_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim;

// The decode-worker side of a session.
struct Owner {
  std::unique_ptr<transport::UcxWorker> worker;
  std::unique_ptr<transport::UcxLanes> lanes;
  std::unique_ptr<transport::attention::UcxAttentionClient> client;
  std::unique_ptr<RemoteAttention> service;
  trident::v1::TransportEndpoint endpoint;
};

absl::Status ToStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

class AttentionServiceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto process = StartService({RunfilePath("services/attention/attention"),
                                 absl::StrCat("--ucx_transports=", GetParam()),
                                 "--kv_budget_mb=4", "--kv_store_mb=2", "--reconnect_grace=1s",
                                 "--lanes=2"},
                                ::trident::testing::TestTmpPath("attention.log"));
    ASSERT_THAT(process.status(), IsOk());
    service_ = *std::move(process);
    stub_ = trident::v1::Attention::NewStub(service_.channel);
  }
  void TearDown() override { EXPECT_THAT(StopService(service_), IsOk()); }

  absl::StatusOr<Owner> Connect(const std::string& owner_id, uint64_t incarnation) {
    Owner owner;
    TRIDENT_ASSIGN_OR_RETURN(owner.worker, transport::UcxWorker::Create(
                                               {.transports = GetParam(), .name = owner_id}));
    TRIDENT_ASSIGN_OR_RETURN(owner.lanes, transport::UcxLanes::Create(owner.worker.get(),
                                                                      {.lanes = 2}));
    TRIDENT_ASSIGN_OR_RETURN(owner.client, transport::attention::UcxAttentionClient::Create(
                                               owner.lanes.get(), incarnation));
    owner.endpoint.set_owner_id(owner_id);
    owner.endpoint.set_incarnation(incarnation);
    owner.endpoint.set_memory_type(trident::v1::MEMORY_TYPE_HOST);
    owner.lanes->DescribeAddresses(&owner.endpoint);
    trident::v1::ConnectRequest request;
    *request.mutable_client() = owner.endpoint;
    trident::v1::ConnectResponse response;
    grpc::ClientContext context;
    TRIDENT_RETURN_IF_ERROR(ToStatus(stub_->Connect(&context, request, &response)));
    TRIDENT_ASSIGN_OR_RETURN(owner.service, owner.client->ForService(response.server()));
    return owner;
  }

  absl::StatusOr<trident::v1::AdmitSequenceResponse> Admit(const Owner& owner,
                                                           const std::string& id,
                                                           int32_t capacity,
                                                           trident::v1::DType dtype =
                                                               trident::v1::DTYPE_FLOAT32,
                                                           trident::v1::KvBlockLayout layout =
                                                               trident::v1::KV_BLOCK_LAYOUT_UNSPECIFIED) {
    trident::v1::AdmitSequenceRequest request;
    request.set_owner_id(owner.endpoint.owner_id());
    request.set_owner_incarnation(owner.endpoint.incarnation());
    request.set_sequence_id(id);
    request.set_num_layers(kLayers);
    request.set_num_attention_heads(kQHeads);
    request.set_num_kv_heads(kKvHeads);
    request.set_head_dim(kHeadDim);
    request.set_dtype(dtype);
    request.set_block_layout(layout);
    request.set_capacity_tokens(capacity);
    trident::v1::AdmitSequenceResponse response;
    grpc::ClientContext context;
    TRIDENT_RETURN_IF_ERROR(ToStatus(stub_->AdmitSequence(&context, request, &response)));
    return response;
  }

  trident::v1::AttentionStats Stats() {
    trident::v1::AttentionStats stats;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->GetStats(&context, trident::v1::GetAttentionStatsRequest(), &stats).ok());
    return stats;
  }

  ServiceProcess service_;
  std::unique_ptr<trident::v1::Attention::Stub> stub_;
};

// Attention of `q` over the k/v rows sent so far (fp64).
std::vector<float> Reference(const float* q, const std::vector<std::vector<float>>& ks,
                             const std::vector<std::vector<float>>& vs) {
  std::vector<float> o(kQ);
  for (int32_t h = 0; h < kQHeads; ++h) {
    const int32_t g = h / (kQHeads / kKvHeads);
    std::vector<double> s(ks.size());
    double m = -1e300, sum = 0;
    for (size_t t = 0; t < ks.size(); ++t) {
      double dot = 0;
      for (int d = 0; d < kHeadDim; ++d) dot += q[h * kHeadDim + d] * ks[t][g * kHeadDim + d];
      s[t] = dot / std::sqrt(double{kHeadDim});
      m = std::max(m, s[t]);
    }
    for (double& x : s) sum += x = std::exp(x - m);
    for (int d = 0; d < kHeadDim; ++d) {
      double acc = 0;
      for (size_t t = 0; t < ks.size(); ++t) acc += s[t] / sum * vs[t][g * kHeadDim + d];
      o[h * kHeadDim + d] = static_cast<float>(acc);
    }
  }
  return o;
}

TEST_P(AttentionServiceTest, DecodesOverUcxAsAPlainComputationDoes) {
  absl::StatusOr<Owner> owner = Connect("decode-0", 11);
  ASSERT_THAT(owner.status(), IsOk());
  auto a = Admit(*owner, "a", 64);
  auto b = Admit(*owner, "b", 64);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(a->capacity_tokens(), 64);
  EXPECT_EQ(a->layout().block_layout(), trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
  std::mt19937 rng(7);
  std::printf("seed 7\n");
  std::uniform_real_distribution<float> dist(-1, 1);
  const std::vector<uint64_t> handles = {a->handle(), b->handle()};
  std::vector<std::vector<float>> ks[2][kLayers], vs[2][kLayers];
  for (int32_t step = 0; step < 20; ++step) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<float> q(2 * kQ), k(2 * kKv), v(2 * kKv), out(2 * kQ, -9);
      for (float& x : q) x = dist(rng);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      const std::vector<int32_t> positions = {step, step};
      AttentionCall call{.layer = layer, .num_q_heads = kQHeads, .num_kv_heads = kKvHeads,
                         .head_dim = kHeadDim, .dtype = WireDType::kF32, .handles = handles,
                         .positions = positions, .q = q.data(), .q_stride = kQ, .k = k.data(),
                         .k_stride = kKv, .v = v.data(), .v_stride = kKv, .out = out.data(),
                         .out_stride = kQ};
      auto ticket = owner->service->Start(call);
      ASSERT_THAT(ticket.status(), IsOk());
      ASSERT_THAT(owner->service->Wait(*ticket, absl::Seconds(30)), IsOk());
      for (int s = 0; s < 2; ++s) {
        ks[s][layer].emplace_back(k.begin() + s * kKv, k.begin() + (s + 1) * kKv);
        vs[s][layer].emplace_back(v.begin() + s * kKv, v.begin() + (s + 1) * kKv);
        const std::vector<float> want = Reference(&q[s * kQ], ks[s][layer], vs[s][layer]);
        for (int j = 0; j < kQ; ++j) {
          ASSERT_NEAR(out[s * kQ + j], want[j], 1e-5) << "step " << step << " seq " << s;
        }
      }
    }
  }
  trident::v1::AttentionStats stats = Stats();
  EXPECT_EQ(stats.sequences(), 2);
  EXPECT_EQ(stats.held_tokens(), 40);
  EXPECT_EQ(stats.sessions(), 1);
  EXPECT_EQ(stats.attention_requests_total(), 20 * kLayers);
  EXPECT_GT(stats.held_bytes(), 0);
  // Releasing frees everything.
  for (uint64_t handle : handles) {
    trident::v1::ReleaseSequenceRequest request;
    request.set_owner_id("decode-0");
    request.set_owner_incarnation(11);
    request.set_handle(handle);
    trident::v1::ReleaseSequenceResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ReleaseSequence(&context, request, &response).ok());
    EXPECT_TRUE(response.released());
  }
  EXPECT_EQ(Stats().held_bytes(), 0);
}

TEST_P(AttentionServiceTest, AppendedPromptKvIsAttendedByTheNextDecodeStep) {
  absl::StatusOr<Owner> owner = Connect("decode-0", 11);
  ASSERT_THAT(owner.status(), IsOk());
  auto a = Admit(*owner, "a", 64);
  ASSERT_THAT(a.status(), IsOk());
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1, 1);
  constexpr int32_t kPrompt = 37;  // Three blocks, the last partial.
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> k(kPrompt * kKv), v(kPrompt * kKv);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    const std::vector<uint64_t> handles(kPrompt, a->handle());
    std::vector<int32_t> positions(kPrompt);
    for (int32_t p = 0; p < kPrompt; ++p) positions[p] = p;
    auto ticket = owner->service->StartAppend(
        {.layer = layer, .num_kv_heads = kKvHeads, .head_dim = kHeadDim,
         .dtype = WireDType::kF32, .handles = handles, .positions = positions, .k = k.data(),
         .k_stride = kKv, .v = v.data(), .v_stride = kKv});
    ASSERT_THAT(ticket.status(), IsOk());
    ASSERT_THAT(owner->service->Wait(*ticket, absl::Seconds(30)), IsOk());
    // Decode position kPrompt over the appended prompt and the new token.
    std::vector<float> q(kQ), nk(kKv), nv(kKv), out(kQ);
    for (float& x : q) x = dist(rng);
    for (float& x : nk) x = dist(rng);
    for (float& x : nv) x = dist(rng);
    const std::vector<uint64_t> one = {a->handle()};
    const std::vector<int32_t> at = {kPrompt};
    auto decode = owner->service->Start(
        {.layer = layer, .num_q_heads = kQHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim,
         .dtype = WireDType::kF32, .handles = one, .positions = at, .q = q.data(),
         .q_stride = kQ, .k = nk.data(), .k_stride = kKv, .v = nv.data(), .v_stride = kKv,
         .out = out.data(), .out_stride = kQ});
    ASSERT_THAT(decode.status(), IsOk());
    ASSERT_THAT(owner->service->Wait(*decode, absl::Seconds(30)), IsOk());
    std::vector<std::vector<float>> ks, vs;
    for (int32_t p = 0; p < kPrompt; ++p) {
      ks.emplace_back(k.begin() + p * kKv, k.begin() + (p + 1) * kKv);
      vs.emplace_back(v.begin() + p * kKv, v.begin() + (p + 1) * kKv);
    }
    ks.push_back(nk);
    vs.push_back(nv);
    const std::vector<float> want = Reference(q.data(), ks, vs);
    for (int j = 0; j < kQ; ++j) ASSERT_NEAR(out[j], want[j], 1e-5) << "layer " << layer;
  }
  EXPECT_EQ(Stats().held_tokens(), kPrompt + 1);
}

TEST_P(AttentionServiceTest, BadRequestsGetTheirErrorsAndTheServiceGoesOn) {
  absl::StatusOr<Owner> owner = Connect("decode-0", 11);
  ASSERT_THAT(owner.status(), IsOk());
  auto a = Admit(*owner, "a", 16);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_THAT(Admit(*owner, "a", 16).status(), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(Admit(*owner, "huge", 1 << 20).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
  EXPECT_THAT(Admit(*owner, "token-major", 16, trident::v1::DTYPE_BFLOAT16,
                    trident::v1::KV_BLOCK_LAYOUT_TOKEN_HEAD_DIM)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_layout")));
  EXPECT_THAT(Admit(*owner, "f32-pairs", 16, trident::v1::DTYPE_FLOAT32,
                    trident::v1::KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bf16")));
  auto pairs = Admit(*owner, "bf16", 16, trident::v1::DTYPE_BFLOAT16);
  ASSERT_THAT(pairs.status(), IsOk());
  EXPECT_EQ(pairs->layout().block_layout(), trident::v1::KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS);
  EXPECT_EQ(pairs->layout().block_size_tokens(), 32);
  EXPECT_EQ(pairs->capacity_tokens(), 32);
  {
    trident::v1::ReleaseSequenceRequest release;
    release.set_owner_id(owner->endpoint.owner_id());
    release.set_owner_incarnation(owner->endpoint.incarnation());
    release.set_handle(pairs->handle());
    trident::v1::ReleaseSequenceResponse released;
    grpc::ClientContext context;
    ASSERT_THAT(ToStatus(stub_->ReleaseSequence(&context, release, &released)), IsOk());
  }
  std::vector<float> q(kQ, 0.5f), kv(kKv, 0.25f), out(kQ, -9);
  const auto call = [&](std::vector<uint64_t>* handles, std::vector<int32_t>* positions,
                        int32_t layer) {
    return AttentionCall{.layer = layer, .num_q_heads = kQHeads, .num_kv_heads = kKvHeads,
                         .head_dim = kHeadDim, .dtype = WireDType::kBF16, .handles = *handles,
                         .positions = *positions, .q = q.data(), .q_stride = kQ,
                         .k = kv.data(), .k_stride = kKv, .v = kv.data(), .v_stride = kKv,
                         .out = out.data(), .out_stride = kQ};
  };
  struct Case {
    std::vector<uint64_t> handles;
    std::vector<int32_t> positions;
    int32_t layer;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {{{a->handle() + 99}, {0}, 0, absl::StatusCode::kNotFound},
                                   {{a->handle()}, {16}, 0, absl::StatusCode::kOutOfRange},
                                   {{a->handle()}, {0}, kLayers, absl::StatusCode::kInvalidArgument},
                                   {{a->handle()}, {0}, 1, absl::StatusCode::kOk}};
  for (Case c : cases) {
    auto ticket = owner->service->Start(call(&c.handles, &c.positions, c.layer));
    ASSERT_THAT(ticket.status(), IsOk());
    EXPECT_THAT(owner->service->Wait(*ticket, absl::Seconds(30)), StatusIs(c.code));
  }
  EXPECT_NEAR(out[0], 0.25f, 1e-2);  // One token: o is its v.
  EXPECT_EQ(Stats().sequences(), 1);
}

// The block store (the DRAM tier): a put reserves and writes whole blocks
// over UCX, a lookup pins the chain and a get reads it back; bad requests
// get their errors, another model's blocks are refused, and nothing stays
// reserved or pinned.
TEST_P(AttentionServiceTest, TheBlockStoreKeepsWholeBlocksAndRefusesBadRequests) {
  const auto format = [](const std::string& model) {
    trident::v1::BlockFormat f;
    f.set_model_identity(model);
    trident::v1::KvLayout* layout = f.mutable_layout();
    layout->set_num_layers(2);
    layout->set_num_kv_heads(2);
    layout->set_head_dim(16);
    layout->set_block_size_tokens(4);
    layout->set_dtype(trident::v1::DTYPE_FLOAT32);
    layout->set_block_layout(trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
    return f;
  };
  constexpr int64_t kBlockBytes = 2 * 2 * 2 * 4 * 16 * 4;
  const auto reserve = [&](const std::string& owner_id, uint64_t incarnation,
                           const trident::v1::BlockFormat& f, int keys, int his,
                           trident::v1::ReserveBlocksResponse* response) {
    trident::v1::ReserveBlocksRequest request;
    request.set_owner_id(owner_id);
    request.set_owner_incarnation(incarnation);
    *request.mutable_format() = f;
    for (int i = 0; i < keys; ++i) request.add_key_lo(100 + i);
    for (int i = 0; i < his; ++i) request.add_key_hi(7);
    grpc::ClientContext context;
    return ToStatus(stub_->ReserveBlocks(&context, request, response));
  };
  trident::v1::ReserveBlocksResponse reserved;
  EXPECT_THAT(reserve("nobody", 1, format("m"), 3, 3, &reserved),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Connect")));
  absl::StatusOr<Owner> owner = Connect("decode-0", 11);
  ASSERT_THAT(owner.status(), IsOk());
  EXPECT_THAT(reserve("decode-0", 11, format("m"), 3, 2, &reserved),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key_hi")));
  trident::v1::BlockFormat pairs = format("m");
  pairs.mutable_layout()->set_block_layout(trident::v1::KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS);
  EXPECT_THAT(reserve("decode-0", 11, pairs, 3, 3, &reserved),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_layout")));
  ASSERT_THAT(reserve("decode-0", 11, format("m"), 3, 3, &reserved), IsOk());
  ASSERT_NE(reserved.ticket(), 0u);
  ASSERT_EQ(reserved.write_size(), 3);
  EXPECT_EQ(reserved.block_bytes(), kBlockBytes);
  std::string blocks(3 * kBlockBytes, '\0');
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<char>(i % 251);
  auto put = owner->service->StartBlockPut({.ticket = reserved.ticket(),
                                            .first = 0,
                                            .count = 3,
                                            .data = blocks.data(),
                                            .bytes = blocks.size()});
  ASSERT_THAT(put.status(), IsOk());
  ASSERT_THAT(owner->service->Wait(*put, absl::Seconds(30)), IsOk());
  // A second put of the same blocks is refused: they are written.
  put = owner->service->StartBlockPut(
      {.ticket = reserved.ticket(), .first = 0, .count = 1, .data = blocks.data(), .bytes = kBlockBytes});
  ASSERT_THAT(put.status(), IsOk());
  EXPECT_THAT(owner->service->Wait(*put, absl::Seconds(30)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("written already")));

  const auto lookup = [&](const trident::v1::BlockFormat& f,
                          trident::v1::LookupBlocksResponse* response) {
    trident::v1::LookupBlocksRequest request;
    request.set_owner_id("decode-0");
    request.set_owner_incarnation(11);
    *request.mutable_format() = f;
    for (int i = 0; i < 4; ++i) {  // One more than was put.
      request.add_key_hi(7);
      request.add_key_lo(100 + i);
    }
    grpc::ClientContext context;
    return ToStatus(stub_->LookupBlocks(&context, request, response));
  };
  trident::v1::LookupBlocksResponse match;
  EXPECT_THAT(lookup(format("another-model"), &match),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds blocks of")));
  ASSERT_THAT(lookup(format("m"), &match), IsOk());
  ASSERT_EQ(match.matched(), 3);
  std::string back(3 * kBlockBytes, '\0');
  auto get = owner->service->StartBlockGet(
      {.ticket = match.ticket(), .first = 0, .count = 3, .out = back.data(), .bytes = back.size()});
  ASSERT_THAT(get.status(), IsOk());
  ASSERT_THAT(owner->service->Wait(*get, absl::Seconds(30)), IsOk());
  EXPECT_TRUE(back == blocks);
  EXPECT_EQ(Stats().block_store().pinned_blocks(), 3);
  trident::v1::ReleaseBlocksRequest release;
  release.set_owner_id("decode-0");
  release.set_owner_incarnation(11);
  release.set_ticket(match.ticket());
  trident::v1::ReleaseBlocksResponse released;
  grpc::ClientContext context;
  ASSERT_THAT(ToStatus(stub_->ReleaseBlocks(&context, release, &released)), IsOk());
  EXPECT_TRUE(released.released());
  const trident::v1::BlockStoreStats store = Stats().block_store();
  EXPECT_EQ(store.blocks(), 3);
  EXPECT_EQ(store.pinned_blocks(), 0);
  EXPECT_EQ(store.reserved_blocks(), 0);
  EXPECT_EQ(store.bytes(), 3 * kBlockBytes);
  EXPECT_EQ(store.capacity_bytes(), int64_t{2} << 20);
  EXPECT_EQ(store.blocks_read_total(), 3);
  EXPECT_EQ(store.invariant_violation(), "");
  // The store's KV events: a snapshot of the 3 blocks in tier "dram" under
  // the format's identity, then an empty delta.
  trident::v1::GetKvEventsRequest events_request;
  trident::v1::GetKvEventsResponse events;
  {
    grpc::ClientContext events_context;
    ASSERT_THAT(ToStatus(stub_->GetKvEvents(&events_context, events_request, &events)), IsOk());
  }
  EXPECT_TRUE(events.events().snapshot());
  EXPECT_EQ(events.events().tier(), "dram");
  EXPECT_EQ(events.events().cache_identity(), "m");
  EXPECT_EQ(events.events().block_size_tokens(), 4);
  EXPECT_EQ(events.events().key_lo_size(), 3);
  EXPECT_GT(events.cursor(), 0u);
  events_request.set_cursor(events.cursor());
  {
    grpc::ClientContext events_context;
    ASSERT_THAT(ToStatus(stub_->GetKvEvents(&events_context, events_request, &events)), IsOk());
  }
  EXPECT_FALSE(events.events().snapshot());
  EXPECT_EQ(events.events().key_lo_size(), 0);
}

TEST_P(AttentionServiceTest, AVanishedOwnersSequencesAreFreedAfterTheGrace) {
  {
    absl::StatusOr<Owner> owner = Connect("decode-0", 11);
    ASSERT_THAT(owner.status(), IsOk());
    ASSERT_THAT(Admit(*owner, "a", 64).status(), IsOk());
    ASSERT_THAT(Admit(*owner, "b", 64).status(), IsOk());
    EXPECT_EQ(Stats().sequences(), 2);
  }  // Its UCX worker is gone: the service's endpoints to it fail (tcp), or
  // its liveness probes go unanswered (shared memory), then the grace runs.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  trident::v1::AttentionStats stats = Stats();
  while ((stats.sequences() > 0 || stats.held_bytes() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));  // Polls another process's state.
    stats = Stats();
  }
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
  EXPECT_EQ(stats.sessions(), 0);
  // The same owner id starts afresh with a new incarnation.
  absl::StatusOr<Owner> again = Connect("decode-0", 13);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_THAT(Admit(*again, "a", 64).status(), IsOk());
}

// The service's KV memory is one mapping bound to its node, every page of
// it there (/proc/PID/numa_maps: "bind:N" and the pages per node), and
// every one of its threads may run only on that node's CPUs.
TEST_P(AttentionServiceTest, ItsMemoryAndThreadsAreOnItsNode) {
  const trident::v1::AttentionStats stats = Stats();
  const int node = stats.numa_node();
  EXPECT_GE(stats.threads(), 1);
  EXPECT_NE(stats.isa(), trident::v1::ISA_UNSPECIFIED);
  EXPECT_THAT(stats.cpu_features(), ::testing::Contains("avx2"));
  EXPECT_EQ(stats.capacity_bytes(), 4 << 20);
  std::ifstream maps(absl::StrCat("/proc/", service_.pid, "/numa_maps"));
  std::string line;
  int64_t bound_pages = 0;
  while (std::getline(maps, line)) {
    if (line.find(absl::StrCat(" bind:", node, " ")) == std::string::npos) continue;
    // Pages on each node: "N<node>=<pages>"; none may be elsewhere.
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      if (!absl::ConsumePrefix(&field, "N")) continue;
      std::pair<std::string, std::string> kv = absl::StrSplit(field, '=');
      int on = -1;
      int64_t pages = 0;
      ASSERT_TRUE(absl::SimpleAtoi(kv.first, &on) && absl::SimpleAtoi(kv.second, &pages)) << line;
      EXPECT_EQ(on, node) << line;
      bound_pages += pages;
    }
  }
  // Pre-faulted: the whole budget is present (4 KiB pages, or 2 MiB ones
  // counted as 512 each).
  EXPECT_GE(bound_pages * 4096, int64_t{4} << 20);
  // Every thread's affinity lies within the node's CPUs.
  absl::StatusOr<numa::NumaTopology> topology = numa::NumaTopology::Read();
  ASSERT_THAT(topology.status(), IsOk());
  const std::vector<int> node_cpus = topology->Cpus(node).value();
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", service_.pid, "/task"))) {
    std::ifstream status(task.path() / "status");
    while (std::getline(status, line)) {
      if (!absl::StartsWith(line, "Cpus_allowed_list:")) continue;
      ++threads;
      // A named copy: a temporary in the range's expression would die before
      // the loop reads it.
      const std::string allowed = line.substr(18);
      for (absl::string_view range : absl::StrSplit(absl::StripAsciiWhitespace(allowed), ',')) {
        std::pair<std::string, std::string> ends = absl::StrSplit(range, '-');
        int low = 0, high = 0;
        ASSERT_TRUE(absl::SimpleAtoi(ends.first, &low)) << line;
        if (ends.second.empty() || !absl::SimpleAtoi(ends.second, &high)) high = low;
        for (int cpu = low; cpu <= high; ++cpu) {
          EXPECT_NE(std::find(node_cpus.begin(), node_cpus.end(), cpu), node_cpus.end())
              << task.path() << ": " << line;
        }
      }
    }
  }
  EXPECT_GT(threads, stats.threads());
}

INSTANTIATE_TEST_SUITE_P(Transports, AttentionServiceTest, ::testing::Values("tcp", "posix"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace trident
