// Hostile input against a real cluster: every case is sent to the router
// (prefill and decode workers behind it) and to a worker serving the
// Generation API itself (role both), and must get the same documented
// answer at both: the right gRPC code and, for bad fields, the field named
// in the message and in a google.rpc.BadRequest detail. Requests that do not
// even parse (invalid UTF-8, truncated, malformed wire) name their field
// too. Over-size messages and metadata are refused by the servers' limits.
// Afterwards both still serve, and no KV block is left behind.

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/status.h"
#include "common/status/error_details.h"
#include "common/testing/raw_call.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/concurrent_streams.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

namespace v1 = ::trident::v1;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

constexpr char kGenerate[] = "/trident.v1.Generation/Generate";
constexpr char kTokenize[] = "/trident.v1.Generation/Tokenize";
constexpr char kDetokenize[] = "/trident.v1.Generation/Detokenize";

struct HostileCase {
  std::string name;
  std::string method;
  std::string bytes;
  grpc::StatusCode code;
  // The field named (message and BadRequest); empty: none expected.
  std::string field;
};

v1::GenerateRequest Valid() {
  v1::GenerateRequest r;
  for (int id : {1, 2, 3}) r.mutable_token_ids()->add_ids(id);
  r.mutable_sampling()->set_max_tokens(4);
  r.mutable_stop()->set_ignore_eos(true);  // Exactly 4 tokens, whatever is sampled.
  return r;
}

// `request` serialized, with the placeholder "QQ" (in a string field)
// replaced by the overlong, hence invalid, UTF-8 "\xc0\xaf".
std::string WithBadUtf8(const v1::GenerateRequest& request) {
  std::string bytes = request.SerializeAsString();
  const size_t at = bytes.find("QQ");
  if (at != std::string::npos) bytes.replace(at, 2, "\xc0\xaf");
  return bytes;
}

HostileCase Typed(std::string name, const std::function<void(v1::GenerateRequest&)>& edit,
                  grpc::StatusCode code, std::string field) {
  v1::GenerateRequest r = Valid();
  edit(r);
  return {std::move(name), kGenerate, r.SerializeAsString(), code, std::move(field)};
}

std::vector<HostileCase> Cases(uint32_t seed) {
  constexpr auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  std::vector<HostileCase> cases;
  // Requests that do not parse.
  {
    v1::GenerateRequest r = Valid();
    r.set_text("QQ");
    cases.push_back({"text is not UTF-8", kGenerate, WithBadUtf8(r), kInvalid, "text"});
    r = Valid();
    r.mutable_stop()->add_stop_strings("ok");
    r.mutable_stop()->add_stop_strings("QQ");
    cases.push_back(
        {"stop string is not UTF-8", kGenerate, WithBadUtf8(r), kInvalid, "stop.stop_strings[1]"});
    r = Valid();
    r.set_cache_salt("salt");
    const std::string bytes = r.SerializeAsString();
    cases.push_back({"truncated in the last field", kGenerate, bytes.substr(0, bytes.size() - 2),
                     kInvalid, "cache_salt"});
    cases.push_back(
        {"text sent as a varint", kGenerate, std::string("\x18\x05", 2), kInvalid, "text"});
    std::mt19937 rng(seed);
    std::string garbage(64, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    garbage[0] = '\x1a';  // text (length-delimited), then an overlong length.
    garbage[1] = '\x7f';
    cases.push_back({"random bytes", kGenerate, garbage, kInvalid, "text"});
    v1::TokenizeRequest t;
    t.set_text("QQ");
    std::string tb = t.SerializeAsString();
    tb.replace(tb.find("QQ"), 2, "\xc0\xaf");
    cases.push_back({"Tokenize text is not UTF-8", kTokenize, tb, kInvalid, "text"});
  }
  // Requests that parse, with a bad field.
  cases.push_back(Typed(
      "no prompt", [](auto& r) { r.clear_token_ids(); }, kInvalid, "prompt"));
  cases.push_back(Typed(
      "token id past the vocabulary", [](auto& r) { r.mutable_token_ids()->set_ids(1, 1 << 30); },
      kInvalid, "token_ids.ids[1]"));
  cases.push_back(Typed(
      "negative token id", [](auto& r) { r.mutable_token_ids()->set_ids(0, -1); }, kInvalid,
      "token_ids.ids[0]"));
  cases.push_back(Typed(
      "negative temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); }, kInvalid,
      "sampling.temperature"));
  cases.push_back(Typed(
      "NaN temperature", [](auto& r) { r.mutable_sampling()->set_temperature(std::nanf("")); },
      kInvalid, "sampling.temperature"));
  cases.push_back(Typed(
      "top_p above 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5); }, kInvalid,
      "sampling.top_p"));
  cases.push_back(Typed(
      "negative top_k", [](auto& r) { r.mutable_sampling()->set_top_k(-1); }, kInvalid,
      "sampling.top_k"));
  cases.push_back(Typed(
      "negative max_tokens", [](auto& r) { r.mutable_sampling()->set_max_tokens(-1); }, kInvalid,
      "sampling.max_tokens"));
  cases.push_back(Typed(
      "max_tokens past the context", [](auto& r) { r.mutable_sampling()->set_max_tokens(1 << 30); },
      kInvalid, "sampling.max_tokens"));
  cases.push_back(Typed(
      "zero repetition penalty", [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0); },
      kInvalid, "sampling.repetition_penalty"));
  cases.push_back(Typed(
      "stop token past the vocabulary",
      [](auto& r) { r.mutable_stop()->add_stop_token_ids(1 << 30); }, kInvalid,
      "stop.stop_token_ids[0]"));
  cases.push_back(Typed(
      "17 stop strings",
      [](auto& r) {
        for (int i = 0; i < 17; ++i) r.mutable_stop()->add_stop_strings(absl::StrCat("s", i));
      },
      kInvalid, "stop.stop_strings"));
  cases.push_back(Typed(
      "request id with a space", [](auto& r) { r.set_request_id("a b"); }, kInvalid, "request_id"));
  cases.push_back(Typed(
      "request id of 200 bytes", [](auto& r) { r.set_request_id(std::string(200, 'x')); }, kInvalid,
      "request_id"));
  cases.push_back(Typed(
      "cache salt of 300 bytes", [](auto& r) { r.set_cache_salt(std::string(300, 's')); }, kInvalid,
      "cache_salt"));
  cases.push_back(Typed(
      "QoS class of 100 bytes", [](auto& r) { r.set_qos_class(std::string(100, 'q')); }, kInvalid,
      "qos_class"));
  cases.push_back(Typed(
      "QoS class with a newline", [](auto& r) { r.set_qos_class("a\nb"); }, kInvalid, "qos_class"));
  cases.push_back(Typed(
      "100 top logprobs", [](auto& r) { r.mutable_options()->set_logprobs_top_n(100); }, kInvalid,
      "options.logprobs_top_n"));
  cases.push_back(Typed(
      "negative TTFT target", [](auto& r) { r.mutable_slo()->mutable_ttft()->set_seconds(-1); },
      kInvalid, "slo.ttft"));
  cases.push_back(Typed(
      "unknown model", [](auto& r) { r.set_model("gpt-17"); }, grpc::StatusCode::NOT_FOUND, ""));
  v1::DetokenizeRequest d;
  d.add_token_ids(1 << 30);
  cases.push_back({"Detokenize id past the vocabulary", kDetokenize, d.SerializeAsString(),
                   kInvalid, "token_ids[0]"});
  return cases;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
    for (auto [role, name, process] :
         {std::tuple{"prefill", "p1", &prefill_}, std::tuple{"decode", "d1", &decode_},
          std::tuple{"both", "b1", &both_}}) {
      auto started = testing::StartUcxWorker(model_dir_, role, name);
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
    auto router = testing::StartTestRouter(model_dir_, prefill_.address, decode_.address);
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    const grpc::Status serving = testing::AwaitRouterServing(router_);
    ASSERT_TRUE(serving.ok()) << serving.error_message();
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &prefill_, &decode_, &both_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  // A valid request streams to its end.
  static grpc::Status Generate(const ServiceProcess& target) {
    auto stub = v1::Generation::NewStub(target.channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&context, Valid());
    v1::GenerateResponse response;
    int tokens = 0;
    while (reader->Read(&response)) {
      if (response.has_chunk()) tokens += response.chunk().token_ids_size();
    }
    grpc::Status status = reader->Finish();
    if (status.ok() && tokens != 4) return grpc::Status(grpc::StatusCode::INTERNAL, "short");
    return status;
  }

  std::string model_dir_;
  ServiceProcess prefill_, decode_, both_, router_;
};

TEST_F(HostileInputTest, EveryCaseGetsItsCodeAndFieldAtTheRouterAndTheWorkerAlike) {
  const uint32_t seed = 20261127;
  std::printf("seed %u\n", seed);
  std::printf("%-36s %-18s %-18s %s\n", "case", "router", "worker", "field");
  for (const HostileCase& c : Cases(seed)) {
    for (const auto& [where, target] :
         {std::pair{"router", &router_}, std::pair{"worker", &both_}}) {
      const grpc::Status status = testing::RawUnaryCall(target->channel, c.method, c.bytes);
      EXPECT_EQ(status.error_code(), c.code)
          << c.name << " at the " << where << ": " << status.error_message();
      if (!c.field.empty()) {
        const absl::Status converted = FromGrpcStatus(status);
        EXPECT_EQ(GetBadRequestField(converted).value_or("<none>"), c.field)
            << c.name << " at the " << where << ": " << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), c.field))
            << c.name << " at the " << where << ": " << status.error_message();
      }
    }
    std::printf("%-36s %-18d %-18d %s\n", c.name.c_str(), static_cast<int>(c.code),
                static_cast<int>(c.code), c.field.c_str());
  }
  // A class the router does not know; a worker serving directly takes any
  // name as a label (ModelInfo lists no classes there).
  v1::GenerateRequest unknown = Valid();
  unknown.set_qos_class("platinum");
  const grpc::Status at_router =
      testing::RawUnaryCall(router_.channel, kGenerate, unknown.SerializeAsString());
  EXPECT_EQ(at_router.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(GetBadRequestField(FromGrpcStatus(at_router)).value_or(""), "qos_class");
  // Nothing broke: both still serve, and every KV block is free.
  for (const ServiceProcess* target : {&router_, &both_}) {
    const grpc::Status status = Generate(*target);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  for (const ServiceProcess* worker : {&prefill_, &decode_, &both_}) {
    EXPECT_TRUE(testing::AllKvBlocksFree(*worker)) << worker->address;
  }
}

TEST_F(HostileInputTest, OversizedMessagesAndMetadataAreRefusedByTheLimits) {
  // The router takes messages up to 16 MiB; workers up to 64 MiB.
  v1::GenerateRequest big = Valid();
  big.clear_token_ids();
  big.set_text(std::string(17 << 20, 'a'));
  // Each on a connection of its own (a server may close it); the cluster's
  // channels, connected before, are bystanders that must not notice.
  // A channel of its own (gRPC otherwise shares one connection among
  // channels with the same target and arguments), so that a server closing
  // the attacker's connection does not close the bystanders'.
  auto attacker = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(router_.address, grpc::InsecureChannelCredentials(), args);
  };
  for (const ServiceProcess* target : {&router_, &both_}) ASSERT_TRUE(Generate(*target).ok());
  grpc::Status status = testing::RawUnaryCall(attacker(), kGenerate, big.SerializeAsString());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();

  // Metadata past 16 KiB.
  status = testing::RawUnaryCall(attacker(), kGenerate, Valid().SerializeAsString(),
                                 {{"x-padding", std::string(20 << 10, 'p')}});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();

  for (const ServiceProcess* target : {&router_, &both_}) {
    const grpc::Status ok = Generate(*target);
    EXPECT_TRUE(ok.ok()) << ok.error_message();
  }
}

}  // namespace
}  // namespace trident
