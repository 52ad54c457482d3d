// WorkerServer in this process, serving on 127.0.0.1:0 with a generated
// model (make_model's llama3-tiny): a colocated worker generates; a prefill
// worker hands a prompt's KV over UCX (tcp) to a second worker, whose
// reservations the server wired into the transport, and the tokens that
// worker decodes equal its own generation's; without a model, Decode is
// unimplemented.

#include "services/worker/worker_server.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/controller_client/member_address.h"
#include "common/controller_client/testing/fake_controller.h"
#include "common/grpc/server.h"
#include "common/model/generate/model_gen.h"
#include "common/status/status_macros.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kMaxTokens = 6;
const std::vector<int32_t> kPrompt = {5, 17, 42, 99, 3, 250, 7, 64, 12};

// A WorkerServer and the gRPC server serving it.
struct Served {
  prometheus::Registry registry;
  std::unique_ptr<WorkerServer> worker;
  std::unique_ptr<GrpcServer> grpc;
  std::shared_ptr<grpc::Channel> channel;
  std::string address;

  ~Served() {
    if (grpc != nullptr) grpc->Drain(absl::Now());
  }
};

// Options for a worker on the fixture model (empty `model_dir`: none).
WorkerServerOptions OptionsFor(const std::string& model_dir, v1::Role role, std::string id) {
  WorkerServerOptions options;
  options.role = role;
  options.worker_id = std::move(id);
  options.model.model_dir = model_dir;
  options.model.cpu_threads = 1;
  options.model.pin_threads = false;
  options.model.kv_cache_bytes = int64_t{16} << 20;
  options.ucx_transports = "tcp";
  return options;
}

absl::Status Serve(WorkerServerOptions options, Served& served) {
  TRIDENT_ASSIGN_OR_RETURN(served.worker,
                           WorkerServer::Create(std::move(options), &served.registry));
  TRIDENT_ASSIGN_OR_RETURN(
      served.grpc, GrpcServer::Start({.host = "127.0.0.1", .port = 0}, served.worker->services()));
  served.address = absl::StrCat("127.0.0.1:", served.grpc->port());
  served.channel = grpc::CreateChannel(served.address, grpc::InsecureChannelCredentials());
  return absl::OkStatus();
}

// A generated llama3-tiny (random weights, real tokenizer).
std::string FixtureModel() {
  const std::string dir = ::trident::testing::TestTmpPath("llama3-tiny");
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
  EXPECT_THAT(spec.status(), IsOk());
  if (spec.ok()) {
    EXPECT_THAT(model::generate::WriteModel(*spec, dir), IsOk());
  }
  return dir;
}

v1::SamplingParams Greedy() {
  v1::SamplingParams sampling;
  sampling.set_temperature(0);
  sampling.set_max_tokens(kMaxTokens);
  return sampling;
}

// Reads a stream of T to its end; appends the tokens `tokens_of` finds in
// each message.
template <typename T, typename Reader, typename TokensOf>
grpc::Status ReadTokens(Reader& reader, TokensOf tokens_of, std::vector<int32_t>* tokens) {
  T message;
  while (reader->Read(&message)) {
    for (int32_t t : tokens_of(message)) tokens->push_back(t);
  }
  return reader->Finish();
}

// Generate on `served` (role both): the prompt's greedy tokens.
std::vector<int32_t> Generate(Served& served) {
  v1::GenerateRequest request;
  for (int32_t t : kPrompt) request.mutable_token_ids()->add_ids(t);
  *request.mutable_sampling() = Greedy();
  request.mutable_stop()->set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = v1::Generation::NewStub(served.channel)->Generate(&context, request);
  std::vector<int32_t> tokens;
  const grpc::Status status = ReadTokens<v1::GenerateResponse>(
      reader, [](const v1::GenerateResponse& r) { return r.chunk().token_ids(); }, &tokens);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return tokens;
}

TEST(WorkerServerTest, ColocatedWorkerServesGenerationAndReportsItsLoad) {
  Served served;
  ASSERT_THAT(Serve(OptionsFor(FixtureModel(), v1::ROLE_BOTH, "both-0"), served), IsOk());

  EXPECT_THAT(Generate(served), SizeIs(kMaxTokens));

  EXPECT_EQ(served.worker->KvTransportForTesting(), nullptr);  // auto: none in role both.
  grpc::ClientContext context;
  v1::GetLoadRequest request;
  auto loads = v1::WorkerControl::NewStub(served.channel)->GetLoad(&context, request);
  v1::WorkerLoad load;
  ASSERT_TRUE(loads->Read(&load));
  context.TryCancel();
  EXPECT_EQ(load.worker_id(), "both-0");
  EXPECT_EQ(load.role(), v1::ROLE_BOTH);
  EXPECT_EQ(load.incarnation(), served.worker->IdentityForTesting().incarnation);
}

// The router's part, played here: reserve on `decode`, prefill on `prefill`
// into the reservation, decode it.
std::vector<int32_t> PrefillThenDecode(Served& prefill, Served& decode, std::string* lane) {
  v1::ReserveKvRequest reserve;
  reserve.set_request_id("r1");
  reserve.set_num_tokens(static_cast<int32_t>(kPrompt.size()));
  v1::ReserveKvResponse reserved;
  grpc::ClientContext reserve_context;
  const grpc::Status reserve_status =
      v1::Decode::NewStub(decode.channel)->ReserveKv(&reserve_context, reserve, &reserved);
  EXPECT_TRUE(reserve_status.ok()) << reserve_status.error_message();
  EXPECT_EQ(decode.worker->ReservationsForTesting()->num_reservations(), 1);
  v1::PrefillRequest p;
  p.set_request_id("r1");
  p.mutable_prompt_token_ids()->Add(kPrompt.begin(), kPrompt.end());
  *p.mutable_sampling() = Greedy();
  p.mutable_stop()->set_ignore_eos(true);
  *p.mutable_destination() = reserved.destination();
  p.mutable_destination()->set_decode_address(decode.address);
  v1::DecodeRequest d;
  d.set_request_id("r1");
  d.set_reservation_id(reserved.destination().reservation_id());
  d.set_decode_incarnation(reserved.destination().decode_incarnation());
  *d.mutable_prompt_token_ids() = p.prompt_token_ids();
  *d.mutable_sampling() = p.sampling();
  *d.mutable_stop() = p.stop();

  grpc::ClientContext decode_context;
  auto decoding = v1::Decode::NewStub(decode.channel)->Decode(&decode_context, d);
  grpc::ClientContext prefill_context;
  auto prefilling = v1::Prefill::NewStub(prefill.channel)->Prefill(&prefill_context, p);
  std::vector<int32_t> tokens;
  const grpc::Status prefilled = ReadTokens<v1::PrefillResponse>(
      prefilling,
      [lane](const v1::PrefillResponse& r) {
        if (r.has_transfer_done()) *lane = r.transfer_done().lane();
        return r.first_token().token_ids();
      },
      &tokens);
  EXPECT_TRUE(prefilled.ok()) << "prefill: " << prefilled.error_message();
  const grpc::Status decoded = ReadTokens<v1::DecodeResponse>(
      decoding, [](const v1::DecodeResponse& r) { return r.chunk().token_ids(); }, &tokens);
  EXPECT_TRUE(decoded.ok()) << "decode: " << decoded.error_message();
  return tokens;
}

TEST(WorkerServerTest, KvReachesTheReservationsThroughTheTransportTheServerWired) {
  const std::string model = FixtureModel();
  Served decode;
  WorkerServerOptions decode_options = OptionsFor(model, v1::ROLE_BOTH, "decode-0");
  decode_options.kv_transport = KvTransportKind::kUcx;
  ASSERT_THAT(Serve(std::move(decode_options), decode), IsOk());
  Served prefill;
  ASSERT_THAT(Serve(OptionsFor(model, v1::ROLE_PREFILL, "prefill-0"), prefill), IsOk());
  ASSERT_NE(decode.worker->KvTransportForTesting(), nullptr);
  ASSERT_NE(prefill.worker->KvTransportForTesting(), nullptr);  // auto: ucx in role prefill.

  std::string lane;
  const std::vector<int32_t> handed_over = PrefillThenDecode(prefill, decode, &lane);

  EXPECT_EQ(handed_over, Generate(decode));
  EXPECT_EQ(lane, "tcp");
  EXPECT_EQ(decode.worker->ReservationsForTesting()->num_reservations(), 0);
  EXPECT_EQ(decode.worker->KvTransportForTesting()->dropped_messages(), 0);
}

TEST(WorkerServerTest, WithoutAModelDecodeIsUnimplementedAndGenerationUnserved) {
  Served served;
  ASSERT_THAT(Serve(OptionsFor(/*model_dir=*/"", v1::ROLE_DECODE, "empty-0"), served), IsOk());

  EXPECT_EQ(served.worker->EngineForTesting(), nullptr);
  for (const RegisteredService& service : served.worker->services()) {
    EXPECT_NE(service.name, v1::Generation::service_full_name());
  }
  grpc::ClientContext context;
  v1::ReserveKvRequest request;
  request.set_request_id("r1");
  request.set_num_tokens(4);
  v1::ReserveKvResponse response;
  EXPECT_EQ(
      v1::Decode::NewStub(served.channel)->ReserveKv(&context, request, &response).error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
}

TEST(WorkerServerTest, JoinsTheControllerWithItsRegistrationAndLoadThenLeavesIt) {
  absl::StatusOr<std::unique_ptr<controller_client::FakeControllerServer>> controller =
      controller_client::FakeControllerServer::Start({.controller_incarnation = 3});
  ASSERT_THAT(controller.status(), IsOk());
  controller_client::FakeController& fake = (*controller)->controller();
  Served served;
  WorkerServerOptions options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "both-0");
  options.controller_address = (*controller)->address();
  options.controller_backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(100)};
  ASSERT_THAT(Serve(std::move(options), served), IsOk());

  ASSERT_THAT(
      served.worker->JoinController(
          {.address = served.address, .metrics_address = "127.0.0.1:9402", .node_name = "node-a"}),
      IsOk());

  ASSERT_TRUE(fake.Await(
      [](const controller_client::FakeControllerState& s) {
        return s.Member("both-0").heartbeats >= 2;
      },
      absl::Seconds(30)));
  const controller_client::FakeMemberRecord record = fake.state().Member("both-0");
  const v1::WorkerRegistration& registration = record.last_registration.worker();
  EXPECT_EQ(registration.incarnation(), served.worker->IdentityForTesting().incarnation);
  EXPECT_EQ(registration.address(), served.address);
  EXPECT_EQ(registration.metrics_address(), "127.0.0.1:9402");
  EXPECT_EQ(registration.node_name(), "node-a");
  EXPECT_EQ(registration.device(), "cpu");
  EXPECT_EQ(registration.model(), "llama3-tiny");
  EXPECT_EQ(registration.role(), v1::ROLE_BOTH);
  EXPECT_GT(registration.capacity().kv_blocks_total(), 0);
  EXPECT_GT(registration.capacity().max_context_tokens(), 0);
  EXPECT_EQ(record.last_heartbeat.state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(record.last_heartbeat.worker_load().worker_id(), "both-0");
  EXPECT_EQ(record.last_heartbeat.worker_load().incarnation(), registration.incarnation());
  EXPECT_EQ(record.last_heartbeat.worker_load().kv_blocks_total(),
            registration.capacity().kv_blocks_total());

  served.worker->LeaveController();

  EXPECT_EQ(fake.state().Member("both-0").deregistrations, 1);
  EXPECT_TRUE(served.worker->ControllerMemberForTesting()->status().deregistered);
}

TEST(WorkerServerTest, WithoutAControllerAddressJoiningDoesNothing) {
  Served served;
  ASSERT_THAT(Serve(OptionsFor(/*model_dir=*/"", v1::ROLE_DECODE, "alone-0"), served), IsOk());

  EXPECT_THAT(served.worker->JoinController({.address = served.address}), IsOk());

  EXPECT_EQ(served.worker->ControllerMemberForTesting(), nullptr);
  // The sample heartbeats would carry still describes the worker.
  EXPECT_EQ(served.worker->SampleLoad().worker_id(), "alone-0");
  EXPECT_EQ(served.worker->SampleLoad().role(), v1::ROLE_DECODE);
}

TEST(WorkerServerTest, AnUnknownKvTransportIsInvalidNamingTheFlag) {
  EXPECT_THAT(ParseKvTransport("rdma"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv_transport")));
  EXPECT_THAT(ParseKvTransport("none"), IsOk());
}

TEST(WorkerServerTest, ModelOptionsTheLoaderRefusesFailCreateWithItsError) {
  WorkerServerOptions options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.dtype = "f8";
  prometheus::Registry registry;

  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--dtype")));
}

TEST(WorkerServerTest, NegativePromptCapsAndAnEmptyBacklogAreRefusedNamingTheFlags) {
  prometheus::Registry registry;
  WorkerServerOptions options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.max_prefill_tokens_when_backlogged = -1;
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_prefill_tokens_when_backlogged (-1)")));
  options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.prefill_backlog_tokens = 0;
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--prefill_backlog_tokens")));
}

TEST(WorkerServerTest, AnFp8KvCacheIsRefusedOnTheCpuBackendAndAnUnknownOneEverywhere) {
  prometheus::Registry registry;
  WorkerServerOptions options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.kv_cache_dtype = "fp8_e4m3";
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only the CUDA backend")));
  options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.kv_cache_dtype = "int4";
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv_cache_dtype")));
}

// make_model --weights=false: the worker computes the same weights in memory
// and generates what a worker over the written checkpoint does.
TEST(WorkerServerTest, GeneratedWeightsServeWhatTheWrittenCheckpointServes) {
  const std::string dir = ::trident::testing::TestTmpPath("llama3-tiny-generated");
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
  ASSERT_THAT(spec.status(), IsOk());
  spec->write_weights = false;
  ASSERT_THAT(model::generate::WriteModel(*spec, dir), IsOk());
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));

  Served written, generated;
  ASSERT_THAT(Serve(OptionsFor(FixtureModel(), v1::ROLE_BOTH, "written"), written), IsOk());
  WorkerServerOptions options = OptionsFor(dir, v1::ROLE_BOTH, "generated");
  options.model.generated_weights = true;
  ASSERT_THAT(Serve(std::move(options), generated), IsOk());
  const std::vector<int32_t> want = Generate(written);
  EXPECT_THAT(want, SizeIs(kMaxTokens));
  EXPECT_EQ(Generate(generated), want);

  // Without the flag the directory has no weights; with it, a directory
  // without generated_weights.json is refused naming the file.
  prometheus::Registry registry;
  EXPECT_THAT(WorkerServer::Create(OptionsFor(dir, v1::ROLE_BOTH, "w"), &registry).status(),
              Not(IsOk()));
  options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.generated_weights = true;
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("generated_weights.json")));
}

TEST(WorkerServerTest, TensorParallelismIsRefusedOnTheCpuBackend) {
  prometheus::Registry registry;
  WorkerServerOptions options = OptionsFor(FixtureModel(), v1::ROLE_BOTH, "w");
  options.model.tensor_parallel = 2;
  EXPECT_THAT(WorkerServer::Create(std::move(options), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tensor_parallel=2: tensor parallelism splits a model over "
                                 "GPUs")));
}

}  // namespace
}  // namespace trident::worker
