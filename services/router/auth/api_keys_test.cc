#include "services/router/auth/api_keys.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/error_details.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::router::auth {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// SHA-256 of "alpha-key" and "beta-key" (printf %s KEY | sha256sum).
std::string HexOf(const std::string& key) {
  const Sha256 d = HashKey(key);
  std::string hex;
  for (uint8_t b : d) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

std::string Entry(const std::string& key, const std::string& tenant,
                  const std::string& extra = "") {
  return absl::StrCat(R"({"sha256": ")", HexOf(key), R"(", "tenant": ")", tenant, "\"", extra, "}");
}

void Write(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::trunc) << contents;
}

TEST(ApiKeysTest, HashIsSha256) {
  // printf %s abc | sha256sum
  EXPECT_EQ(HexOf("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ApiKeysTest, MalformedFilesAreRefusedNamingTheEntryAndField) {
  const absl::flat_hash_set<std::string> qos = {"interactive", "batch"};
  auto field_of = [&](const std::string& json) {
    absl::StatusOr<std::vector<ApiKeyEntry>> parsed = ParseApiKeys(json, qos);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << json;
    return GetBadRequestField(parsed.status()).value_or("<none>");
  };
  EXPECT_EQ(field_of("[]"), "keys");
  EXPECT_EQ(field_of("not json"), "keys");
  EXPECT_EQ(field_of(R"({"keys": [{"sha256": "abcd", "tenant": "t"}]})"), "keys[0].sha256");
  EXPECT_EQ(field_of(absl::StrCat(R"({"keys": [)", Entry("a", "t"), ",", R"({"sha256": ")",
                                  std::string(64, 'g'), R"(", "tenant": "u"}]})")),
            "keys[1].sha256");
  EXPECT_EQ(field_of(absl::StrCat(R"({"keys": [)", Entry("a", ""), "]}")), "keys[0].tenant");
  EXPECT_EQ(field_of(absl::StrCat(R"({"keys": [)", Entry("a", "t", R"(, "qos": [])"), "]}")),
            "keys[0].qos");
  EXPECT_EQ(field_of(absl::StrCat(R"({"keys": [)", Entry("a", "t"), ",", Entry("a", "u"), "]}")),
            "keys[1].sha256");
  EXPECT_EQ(field_of(absl::StrCat(R"({"keys": [)", Entry("a", "t", R"(, "qos_classes": ["gold"])"),
                                  "]}")),
            "keys[0].qos_classes");
  EXPECT_EQ(
      field_of(absl::StrCat(
          R"({"keys": [)",
          Entry("a", "t", R"(, "qos_classes": ["batch"], "default_qos_class": "interactive")"),
          "]}")),
      "keys[0].default_qos_class");
}

TEST(ApiKeysTest, KeysMapToTheirTenantAndUnknownOnesAreUnauthenticated) {
  const std::string path = testing::TestTmpPath("keys.json");
  Write(path, absl::StrCat(R"({"keys": [)", Entry("alpha-key", "alpha"), ",",
                           Entry("beta-key", "beta",
                                 R"(, "qos_classes": ["batch"], "default_qos_class": "batch")"),
                           "]}"));
  FakeClock clock;
  prometheus::Registry registry;
  auto auth = ApiKeyAuthenticator::Load(path, {"interactive", "batch"}, &clock, &registry);
  ASSERT_THAT(auth, IsOk());
  EXPECT_EQ((*auth)->size(), 2u);

  absl::StatusOr<frontend::Principal> beta = (*auth)->AuthenticateKey("beta-key");
  ASSERT_THAT(beta, IsOk());
  EXPECT_EQ(beta->tenant, "beta");
  EXPECT_THAT(beta->qos_classes, ElementsAre("batch"));
  EXPECT_EQ((*auth)->AuthenticateKey("alpha-key")->tenant, "alpha");
  EXPECT_THAT((*auth)->AuthenticateKey("alpha-kez").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("not valid")));
  EXPECT_THAT((*auth)->AuthenticateKey("").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("authorization: Bearer")));

  // QoS: the default when none is asked for; others denied.
  EXPECT_EQ(*frontend::QosClassFor(*beta, ""), "batch");
  EXPECT_THAT(frontend::QosClassFor(*beta, "interactive").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("qos_class")));
  EXPECT_EQ(*frontend::QosClassFor(*(*auth)->AuthenticateKey("alpha-key"), "interactive"),
            "interactive");

  // Counted by outcome and tenant.
  std::string text;
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      std::string labels;
      for (const auto& label : metric.label)
        absl::StrAppend(&labels, label.name, "=", label.value, ",");
      absl::StrAppend(&text, family.name, "{", labels, "} ", metric.counter.value, "\n");
    }
  }
  EXPECT_THAT(text, HasSubstr("trident_router_authentications_total{outcome=ok,tenant=alpha,} 2"));
  EXPECT_THAT(text, HasSubstr("trident_router_authentications_total{outcome=invalid,tenant=,} 1"));
  EXPECT_THAT(text, HasSubstr("trident_router_authentications_total{outcome=missing,tenant=,} 1"));
}

TEST(ApiKeysTest, AChangedFileIsReloadedAndABrokenOneKeepsTheKeysBefore) {
  const std::string path = testing::TestTmpPath("reloaded.json");
  Write(path, absl::StrCat(R"({"keys": [)", Entry("alpha-key", "alpha"), "]}"));
  FakeClock clock;
  auto auth = ApiKeyAuthenticator::Load(path, {}, &clock, nullptr);
  ASSERT_THAT(auth, IsOk());
  ASSERT_THAT((*auth)->AuthenticateKey("alpha-key"), IsOk());

  // Rotated: alpha revoked, gamma added. Seen once the check interval passed.
  Write(path, absl::StrCat(R"({"keys": [)", Entry("gamma-key", "gamma"), "]}"));
  EXPECT_THAT((*auth)->AuthenticateKey("alpha-key"), IsOk());
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ((*auth)->AuthenticateKey("gamma-key")->tenant, "gamma");
  EXPECT_THAT((*auth)->AuthenticateKey("alpha-key").status(),
              StatusIs(absl::StatusCode::kUnauthenticated));

  // A broken file: the keys before stay.
  Write(path, R"({"keys": [{"sha256": "zz"}]})");
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT((*auth)->AuthenticateKey("gamma-key"), IsOk());

  EXPECT_THAT(
      ApiKeyAuthenticator::Load(testing::TestTmpPath("missing.json"), {}, &clock, nullptr).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--api_keys_file")));
}

}  // namespace
}  // namespace trident::router::auth
