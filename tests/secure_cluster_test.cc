// A cluster with TLS on every gRPC port, mTLS between its services and API
// keys at the router, through real processes (prefill and decode workers
// over UCX, a router). Certificates come from tools/tls/make_certs.sh: the
// cluster's CA, and a second "rogue" CA. Checked: a client with the CA and a
// valid key streams a generation; missing or unknown keys are
// UNAUTHENTICATED, a QoS class the key may not use PERMISSION_DENIED;
// plaintext, a certificate of another CA, or none at all where one is
// required are refused at the handshake (UNAVAILABLE) at the router and at
// the workers; a key removed from the file stops working without a restart.

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/tls.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/router/auth/api_keys.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

namespace v1 = ::trident::v1;
using ::grpc::health::v1::Health;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

std::string MakeCerts(const std::string& dir, const std::string& name) {
  const std::string command =
      absl::StrCat(RunfilePath("tools/tls/make_certs.sh"), " ", dir, " ", name, " >/dev/null");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return dir;
}

std::string KeyEntry(const std::string& key, const std::string& tenant, const std::string& extra) {
  std::string hex;
  for (uint8_t b : router::auth::HashKey(key)) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return absl::StrCat(R"({"sha256": ")", hex, R"(", "tenant": ")", tenant, "\"", extra, "}");
}

void WriteKeys(const std::string& path, const std::vector<std::string>& entries) {
  std::string json = R"({"keys": [)";
  for (size_t i = 0; i < entries.size(); ++i) absl::StrAppend(&json, i ? "," : "", entries[i]);
  std::ofstream(path + ".new") << json << "]}";
  std::rename((path + ".new").c_str(), path.c_str());
}

TlsFiles Files(const std::string& dir) {
  return {.cert_file = dir + "/tls.crt", .key_file = dir + "/tls.key", .ca_file = dir + "/ca.crt"};
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address, const TlsFiles& files) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      TlsChannelCredentials(files);
  EXPECT_THAT(credentials, IsOk());
  // Certificates name localhost, the services bind 127.0.0.1.
  return grpc::CreateChannel(absl::StrCat("localhost:", address.substr(address.rfind(':') + 1)),
                             credentials.ok() ? *credentials : grpc::InsecureChannelCredentials());
}

// Streams a 4-token generation; the call's status (INTERNAL if short).
grpc::Status Generate(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                      const std::string& qos_class = "") {
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!key.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", key));
  v1::GenerateRequest request;
  for (int id : {1, 2, 3}) request.mutable_token_ids()->add_ids(id);
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_stop()->set_ignore_eos(true);  // Exactly 4 tokens, whatever is sampled.
  request.set_qos_class(qos_class);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  int tokens = 0;
  while (reader->Read(&response)) {
    if (response.has_chunk()) tokens += response.chunk().token_ids_size();
  }
  grpc::Status status = reader->Finish();
  if (status.ok() && tokens != 4) return grpc::Status(grpc::StatusCode::INTERNAL, "short stream");
  return status;
}

grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
}

class SecureClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = MakeCerts(TestTmpPath("pki"), "trident");
    rogue_ = MakeCerts(TestTmpPath("rogue"), "rogue");
    keys_ = TestTmpPath("api_keys.json");
    WriteKeys(keys_, {KeyEntry("alpha-key", "alpha", ""),
                      KeyEntry("batch-key", "beta", R"(, "qos_classes": ["batch"])")});
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
    const std::vector<std::string> tls = {absl::StrCat("--tls_cert_file=", pki_, "/tls.crt"),
                                          absl::StrCat("--tls_key_file=", pki_, "/tls.key"),
                                          absl::StrCat("--tls_ca_file=", pki_, "/ca.crt")};
    for (auto [role, name, process] :
         {std::tuple{"prefill", "p1", &prefill_}, std::tuple{"decode", "d1", &decode_}}) {
      auto started = testing::StartUcxWorker(model_dir_, role, name, tls);
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
    std::vector<std::string> router_argv = {
        RunfilePath("services/router/router"),
        absl::StrCat("--model=", model_dir_),
        absl::StrCat("--prefill_workers=localhost:", Port(prefill_)),
        absl::StrCat("--decode_workers=localhost:", Port(decode_)),
        "--load_interval_ms=20",
        "--admission=false",
        absl::StrCat("--api_keys_file=", keys_),
        absl::StrCat("--qos_config=",
                     RunfilePath("services/router/admission/testdata/qos_classes.json"))};
    router_argv.insert(router_argv.end(), tls.begin(), tls.end());
    auto router = testing::StartService(router_argv, TestTmpPath("router.log"));
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    router_channel_ = Channel(router_.address, {.ca_file = pki_ + "/ca.crt"});
    // The router serves once its load streams from the workers (over mTLS)
    // arrived: wait for the first generation.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    grpc::Status status;
    do {
      status = Generate(router_channel_, "alpha-key");
    } while (!status.ok() && absl::Now() < deadline);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &prefill_, &decode_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  static std::string Port(const ServiceProcess& p) {
    return p.address.substr(p.address.rfind(':') + 1);
  }

  std::string pki_, rogue_, keys_, model_dir_;
  ServiceProcess prefill_, decode_, router_;
  std::shared_ptr<grpc::Channel> router_channel_;
};

TEST_F(SecureClusterTest, KeysAndCertificatesDecideWhoGetsIn) {
  EXPECT_TRUE(Generate(router_channel_, "alpha-key").ok());
  EXPECT_TRUE(Generate(router_channel_, "batch-key", "batch").ok());
  EXPECT_EQ(Generate(router_channel_, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(router_channel_, "alpha-kez").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status denied = Generate(router_channel_, "batch-key", "interactive");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_THAT(denied.error_message(), ::testing::HasSubstr("qos_class"));

  // Transport: plaintext, or trusting another CA, fails at the router.
  EXPECT_EQ(Generate(grpc::CreateChannel(router_.address, grpc::InsecureChannelCredentials()),
                     "alpha-key")
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(
      Generate(Channel(router_.address, {.ca_file = rogue_ + "/ca.crt"}), "alpha-key").error_code(),
      grpc::StatusCode::UNAVAILABLE);

  // Workers require a client certificate of the cluster's CA.
  for (const ServiceProcess* worker : {&prefill_, &decode_}) {
    TlsFiles foreign = Files(rogue_);
    foreign.ca_file = pki_ + "/ca.crt";
    EXPECT_TRUE(HealthCheck(Channel(worker->address, Files(pki_))).ok()) << worker->address;
    EXPECT_EQ(HealthCheck(Channel(worker->address, {.ca_file = pki_ + "/ca.crt"})).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(HealthCheck(Channel(worker->address, foreign)).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(HealthCheck(grpc::CreateChannel(worker->address, grpc::InsecureChannelCredentials()))
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }

  // A key taken out of the file stops working without a restart (the file
  // is looked at every two seconds).
  WriteKeys(keys_, {KeyEntry("batch-key", "beta", R"(, "qos_classes": ["batch"])")});
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  grpc::Status revoked;
  do {
    revoked = Generate(router_channel_, "alpha-key");
  } while (revoked.ok() && absl::Now() < deadline);
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED) << revoked.error_message();
  EXPECT_TRUE(Generate(router_channel_, "batch-key", "batch").ok());
}

}  // namespace
}  // namespace trident
