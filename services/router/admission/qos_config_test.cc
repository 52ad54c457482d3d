#include "services/router/admission/qos_config.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::router::admission {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

TEST(QosConfigTest, LoadsTheExampleFile) {
  absl::StatusOr<QosConfig> config =
      LoadQosConfigFile("services/router/admission/testdata/qos_classes.json");
  ASSERT_THAT(config, IsOk());
  ASSERT_EQ(config->classes.size(), 3u);
  EXPECT_EQ(config->default_index, 0);
  const QosClass& interactive = config->classes[0];
  EXPECT_EQ(interactive.name, "interactive");
  EXPECT_TRUE(interactive.is_default);
  EXPECT_EQ(interactive.priority, 10);
  EXPECT_FALSE(interactive.sheddable);
  EXPECT_EQ(interactive.default_ttft, absl::Milliseconds(500));
  EXPECT_EQ(interactive.default_tpot, absl::Milliseconds(50));
  EXPECT_DOUBLE_EQ(interactive.reserved_fraction, 0.3);
  const QosClass& best_effort = config->classes[2];
  EXPECT_EQ(best_effort.priority, -1);
  EXPECT_TRUE(best_effort.sheddable);
  EXPECT_FALSE(best_effort.default_ttft.has_value());
  EXPECT_FALSE(best_effort.default_tpot.has_value());
  EXPECT_EQ(best_effort.reserved_fraction, 0);
  EXPECT_EQ(config->Find(""), 0);
  EXPECT_EQ(config->Find("batch"), 1);
  EXPECT_EQ(config->Find("gold"), -1);
}

TEST(QosConfigTest, LoneClassIsTheDefault) {
  absl::StatusOr<QosConfig> config = ParseQosConfig(R"({"classes": [{"name": "a"}]})", "q.json");
  ASSERT_THAT(config, IsOk());
  EXPECT_TRUE(config->classes[0].is_default);
  EXPECT_EQ(config->Find(""), 0);
}

TEST(QosConfigTest, MissingFileIsNotFoundNamingThePath) {
  EXPECT_THAT(LoadQosConfigFile("/nonexistent/qos.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/qos.json")));
}

struct BadConfig {
  const char* json;
  const char* expected;  // Substring of the error after "q.json: ".
};

class QosConfigBadTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(QosConfigBadTest, IsInvalidArgumentNamingFileAndField) {
  EXPECT_THAT(ParseQosConfig(GetParam().json, "q.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("q.json: ", GetParam().expected))));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, QosConfigBadTest,
    ::testing::Values(
        BadConfig{"{", "not valid JSON"}, BadConfig{"[]", "must be a JSON object"},
        BadConfig{"{}", "classes: required"},
        BadConfig{R"({"classes": []})", "classes: must be an array of 1 to 64"},
        BadConfig{R"({"classes": [{}]})", "classes[0].name: required"},
        BadConfig{R"({"classes": [{"name": 3}]})", "classes[0].name: must be a string"},
        BadConfig{R"({"classes": [{"name": "a b"}]})", "classes[0].name: must be printable"},
        BadConfig{R"({"classes": [{"name": ""}]})", "classes[0].name: must be 1 to 64 bytes"},
        BadConfig{R"({"classes": [{"name": "a", "prio": 1}]})", "classes[0].prio: unknown field"},
        BadConfig{R"({"classes": [{"name": "a", "priority": 1.5}]})",
                  "classes[0].priority: must be a 32-bit integer"},
        BadConfig{R"({"classes": [{"name": "a", "priority": 3000000000}]})",
                  "classes[0].priority: must be a 32-bit integer"},
        BadConfig{R"({"classes": [{"name": "a", "sheddable": 1}]})",
                  "classes[0].sheddable: must be true or false"},
        BadConfig{R"({"classes": [{"name": "a", "default_slo": {"ttft_ms": -3}}]})",
                  "classes[0].default_slo.ttft_ms: must be a positive number"},
        BadConfig{R"({"classes": [{"name": "a", "default_slo": {"tpot_ms": "50"}}]})",
                  "classes[0].default_slo.tpot_ms: must be a positive number"},
        BadConfig{R"({"classes": [{"name": "a", "default_slo": {"ttft": 5}}]})",
                  "classes[0].default_slo.ttft: unknown field"},
        BadConfig{R"({"classes": [{"name": "a", "reserved_fraction": 1.5}]})",
                  "classes[0].reserved_fraction: must be a number in [0, 1]"},
        BadConfig{R"({"classes": [{"name": "a", "is_default": true},
                                  {"name": "a"}]})",
                  "classes[1].name: \"a\" names an earlier class too"},
        BadConfig{R"({"classes": [{"name": "a"}, {"name": "b"}]})",
                  "classes: no class has is_default true"},
        BadConfig{R"({"classes": [{"name": "a", "is_default": true},
                                  {"name": "b", "is_default": true}]})",
                  "classes: more than one class has is_default true"},
        BadConfig{R"({"classes": [{"name": "a", "is_default": true, "reserved_fraction": 0.6},
                                  {"name": "b", "reserved_fraction": 0.6}]})",
                  "classes: reserved_fraction values sum to 1.2"},
        BadConfig{R"({"classes": [{"name": "a", "name": "b"}]})", "key \"name\" appears twice"},
        BadConfig{R"({"classes": [{"name": "a"}], "extra": 1})", "extra: unknown field"}));

TEST(QosConfigTest, FileErrorsNameTheFile) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/bad_qos.json");
  std::ofstream(path) << R"({"classes": [{"name": "x", "reserved_fraction": -1}]})";
  EXPECT_THAT(LoadQosConfigFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(path, ": classes[0].reserved_fraction"))));
}

}  // namespace
}  // namespace trident::router::admission
