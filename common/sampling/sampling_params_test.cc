#include "common/sampling/sampling_params.h"

#include <cmath>
#include <string>

#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::sampling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kVocab = 1000;
constexpr int32_t kContext = 4096;
constexpr uint64_t kDefaultSeed = 0x5eed;

absl::StatusOr<SamplingParams> Convert(const trident::v1::SamplingParams& sampling,
                                       const trident::v1::OutputOptions& options = {}) {
  return SamplingParamsFromProto(sampling, options, kVocab, kDefaultSeed);
}

// Expects INVALID_ARGUMENT whose BadRequest detail names `field`.
void ExpectBadField(const absl::Status& status, const std::string& field) {
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
  EXPECT_EQ(GetBadRequestField(status), field);
}

TEST(SamplingParamsFromProtoTest, UnsetFieldsTakeTheDocumentedDefaults) {
  absl::StatusOr<SamplingParams> params = Convert({});
  ASSERT_THAT(params, IsOk());
  SamplingParams expected;
  expected.seed = kDefaultSeed;
  EXPECT_EQ(*params, expected);
  EXPECT_EQ(params->temperature, 1.0f);
  EXPECT_EQ(params->top_p, 1.0f);
  EXPECT_EQ(params->repetition_penalty, 1.0f);
  EXPECT_FALSE(params->logprobs);
}

TEST(SamplingParamsFromProtoTest, CopiesEverySetField) {
  trident::v1::SamplingParams sampling;
  sampling.set_temperature(0.0f);
  sampling.set_top_p(0.5f);
  sampling.set_top_k(kVocab);
  sampling.set_min_p(1.0f);
  sampling.set_seed(0);  // Explicit seed 0 is a seed, not "unset".
  sampling.set_repetition_penalty(2.0f);
  sampling.set_presence_penalty(-2.0f);
  sampling.set_frequency_penalty(2.0f);
  trident::v1::OutputOptions options;
  options.set_logprobs_top_n(20);
  absl::StatusOr<SamplingParams> params = Convert(sampling, options);
  ASSERT_THAT(params, IsOk());
  EXPECT_EQ(params->temperature, 0.0f);
  EXPECT_EQ(params->top_p, 0.5f);
  EXPECT_EQ(params->top_k, kVocab);
  EXPECT_EQ(params->min_p, 1.0f);
  EXPECT_EQ(params->seed, 0u);
  EXPECT_EQ(params->repetition_penalty, 2.0f);
  EXPECT_EQ(params->presence_penalty, -2.0f);
  EXPECT_EQ(params->frequency_penalty, 2.0f);
  EXPECT_EQ(params->top_logprobs, 20);
  EXPECT_TRUE(params->logprobs);  // Implied by top_logprobs > 0.
}

TEST(SamplingParamsFromProtoTest, LogprobsWithoutTopN) {
  trident::v1::OutputOptions options;
  options.set_logprobs(true);
  absl::StatusOr<SamplingParams> params = Convert({}, options);
  ASSERT_THAT(params, IsOk());
  EXPECT_TRUE(params->logprobs);
  EXPECT_EQ(params->top_logprobs, 0);
}

TEST(SamplingParamsFromProtoTest, RejectsOutOfRangeValuesNamingTheField) {
  const float nan = std::nanf("");
  struct Case {
    void (*set)(trident::v1::SamplingParams&, float);
    float value;
    const char* field;
  };
  const auto temperature = [](trident::v1::SamplingParams& s, float v) { s.set_temperature(v); };
  const auto top_p = [](trident::v1::SamplingParams& s, float v) { s.set_top_p(v); };
  const auto min_p = [](trident::v1::SamplingParams& s, float v) { s.set_min_p(v); };
  const auto repetition = [](trident::v1::SamplingParams& s, float v) {
    s.set_repetition_penalty(v);
  };
  const auto presence = [](trident::v1::SamplingParams& s, float v) { s.set_presence_penalty(v); };
  const auto frequency = [](trident::v1::SamplingParams& s, float v) {
    s.set_frequency_penalty(v);
  };
  const Case cases[] = {
      {temperature, -0.1f, "sampling.temperature"},
      {temperature, 2.01f, "sampling.temperature"},
      {temperature, nan, "sampling.temperature"},
      {top_p, 0.0f, "sampling.top_p"},
      {top_p, 1.01f, "sampling.top_p"},
      {top_p, nan, "sampling.top_p"},
      {min_p, -0.01f, "sampling.min_p"},
      {min_p, 1.5f, "sampling.min_p"},
      {min_p, nan, "sampling.min_p"},
      {repetition, 0.0f, "sampling.repetition_penalty"},
      {repetition, 2.5f, "sampling.repetition_penalty"},
      {repetition, nan, "sampling.repetition_penalty"},
      {presence, -2.01f, "sampling.presence_penalty"},
      {presence, nan, "sampling.presence_penalty"},
      {frequency, 2.01f, "sampling.frequency_penalty"},
      {frequency, nan, "sampling.frequency_penalty"},
  };
  for (const Case& c : cases) {
    trident::v1::SamplingParams sampling;
    c.set(sampling, c.value);
    SCOPED_TRACE(::testing::Message() << c.field << " = " << c.value);
    ExpectBadField(Convert(sampling).status(), c.field);
  }
}

TEST(SamplingParamsFromProtoTest, RejectsTopKOutsideVocabulary) {
  trident::v1::SamplingParams sampling;
  sampling.set_top_k(-1);
  ExpectBadField(Convert(sampling).status(), "sampling.top_k");
  sampling.set_top_k(kVocab + 1);
  ExpectBadField(Convert(sampling).status(), "sampling.top_k");
}

TEST(SamplingParamsFromProtoTest, RejectsTooManyTopLogprobs) {
  trident::v1::OutputOptions options;
  options.set_logprobs_top_n(21);
  ExpectBadField(Convert({}, options).status(), "options.logprobs_top_n");
  options.set_logprobs_top_n(-1);
  ExpectBadField(Convert({}, options).status(), "options.logprobs_top_n");
}

absl::StatusOr<StopParams> ConvertStop(const trident::v1::StopConditions& stop,
                                       int32_t max_tokens = 0, int32_t prompt_tokens = 96) {
  trident::v1::SamplingParams sampling;
  sampling.set_max_tokens(max_tokens);
  return StopParamsFromProto(sampling, stop, kVocab, kContext, prompt_tokens);
}

TEST(StopParamsFromProtoTest, ZeroMaxTokensFillsTheContextWindow) {
  absl::StatusOr<StopParams> params = ConvertStop({}, 0, 96);
  ASSERT_THAT(params, IsOk());
  EXPECT_EQ(params->max_tokens, kContext - 96);
  EXPECT_FALSE(params->ignore_eos);
  EXPECT_TRUE(params->stop_strings.empty());
}

TEST(StopParamsFromProtoTest, MaxTokensBounds) {
  EXPECT_EQ(ConvertStop({}, 1)->max_tokens, 1);
  EXPECT_EQ(ConvertStop({}, kContext - 96, 96)->max_tokens, kContext - 96);
  ExpectBadField(ConvertStop({}, kContext - 95, 96).status(), "sampling.max_tokens");
  ExpectBadField(ConvertStop({}, -1).status(), "sampling.max_tokens");
}

TEST(StopParamsFromProtoTest, PromptMustLeaveRoom) {
  ExpectBadField(ConvertStop({}, 0, kContext).status(), "prompt");
  ExpectBadField(ConvertStop({}, 0, 0).status(), "prompt");
}

TEST(StopParamsFromProtoTest, CopiesStopConditions) {
  trident::v1::StopConditions stop;
  stop.add_stop_strings("</s>");
  stop.add_stop_strings("日本");
  stop.add_stop_token_ids(0);
  stop.add_stop_token_ids(kVocab - 1);
  stop.set_ignore_eos(true);
  stop.set_include_stop_str_in_output(true);
  absl::StatusOr<StopParams> params = ConvertStop(stop, 10);
  ASSERT_THAT(params, IsOk());
  EXPECT_EQ(params->max_tokens, 10);
  EXPECT_THAT(params->stop_strings, ElementsAre("</s>", "日本"));
  EXPECT_THAT(params->stop_token_ids, ElementsAre(0, kVocab - 1));
  EXPECT_TRUE(params->ignore_eos);
  EXPECT_TRUE(params->include_stop_string_in_output);
}

TEST(StopParamsFromProtoTest, StopStringLimits) {
  trident::v1::StopConditions stop;
  for (int i = 0; i < kMaxStopStrings; ++i) stop.add_stop_strings("s");
  EXPECT_THAT(ConvertStop(stop), IsOk());
  stop.add_stop_strings("s");
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_strings");

  stop.Clear();
  stop.add_stop_strings("ok");
  stop.add_stop_strings("");
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_strings[1]");

  stop.Clear();
  stop.add_stop_strings(std::string(kMaxStopStringBytes, 'a'));
  EXPECT_THAT(ConvertStop(stop), IsOk());
  stop.add_stop_strings(std::string(kMaxStopStringBytes + 1, 'a'));
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_strings[1]");
}

TEST(StopParamsFromProtoTest, RejectsStopStringsThatAreNotUtf8) {
  // Set through the C++ API, which (unlike parsing) does not check UTF-8.
  for (const std::string& bad : {std::string("\xA9"), std::string("a\xC3"), std::string("\xC0\xAF"),
                                 std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80")}) {
    trident::v1::StopConditions stop;
    stop.add_stop_strings(bad);
    ExpectBadField(ConvertStop(stop).status(), "stop.stop_strings[0]");
  }
}

TEST(StopParamsFromProtoTest, StopTokenIdLimits) {
  trident::v1::StopConditions stop;
  for (int i = 0; i < kMaxStopTokenIds; ++i) stop.add_stop_token_ids(i);
  EXPECT_THAT(ConvertStop(stop), IsOk());
  stop.add_stop_token_ids(1);
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_token_ids");

  stop.Clear();
  stop.add_stop_token_ids(5);
  stop.add_stop_token_ids(kVocab);
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_token_ids[1]");
  stop.set_stop_token_ids(1, -1);
  ExpectBadField(ConvertStop(stop).status(), "stop.stop_token_ids[1]");
}

}  // namespace
}  // namespace trident::sampling
