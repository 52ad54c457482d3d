#include "services/controller/prometheus/prometheus_response.h"

#include <cmath>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

constexpr char kOrigin[] = "prometheus at http://h:9090: query `q`";

TEST(ParseSampleValueTest, ReadsNumbersNanAndInfinities) {
  EXPECT_THAT(ParseSampleValue("1.5"), IsOkAndHolds(1.5));
  EXPECT_THAT(ParseSampleValue("-2e3"), IsOkAndHolds(-2000));
  EXPECT_TRUE(std::isnan(*ParseSampleValue("NaN")));
  EXPECT_THAT(ParseSampleValue("+Inf"), IsOkAndHolds(INFINITY));
  EXPECT_THAT(ParseSampleValue("-Inf"), IsOkAndHolds(-INFINITY));
  EXPECT_THAT(ParseSampleValue("one"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseSampleValue(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseQueryResponseTest, ParsesVectorWithLabelsAndSpecialValues) {
  const absl::StatusOr<QueryResult> result = ParseQueryResponse(200, R"({
      "status": "success",
      "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "x", "worker": "w0"}, "value": [1700000000.125, "3"]},
        {"metric": {"worker": "w1"}, "value": [1700000000.125, "NaN"]},
        {"metric": {}, "value": [1700000000.125, "+Inf"]}]}})",
                                                                kOrigin);
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(result->type, ResultType::kVector);
  ASSERT_EQ(result->series.size(), 3u);
  EXPECT_EQ(result->series[0].labels, (Labels{{"__name__", "x"}, {"worker", "w0"}}));
  ASSERT_EQ(result->series[0].samples.size(), 1u);
  EXPECT_EQ(result->series[0].samples[0].time, absl::FromUnixMillis(1700000000125));
  EXPECT_EQ(result->series[0].samples[0].value, 3);
  EXPECT_TRUE(std::isnan(result->series[1].samples[0].value));
  EXPECT_EQ(result->series[2].samples[0].value, INFINITY);
  EXPECT_THAT(result->series[2].labels, IsEmpty());
}

TEST(ParseQueryResponseTest, ParsesMatrix) {
  const absl::StatusOr<QueryResult> result = ParseQueryResponse(200, R"({
      "status": "success",
      "data": {"resultType": "matrix", "result": [
        {"metric": {"job": "w"}, "values": [[100, "1"], [101.5, "2"], [103, "-Inf"]]}]}})",
                                                                kOrigin);
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(result->type, ResultType::kMatrix);
  ASSERT_EQ(result->series.size(), 1u);
  const std::vector<Sample>& samples = result->series[0].samples;
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[1].time, absl::FromUnixMillis(101500));
  EXPECT_EQ(samples[1].value, 2);
  EXPECT_EQ(samples[2].value, -INFINITY);
}

TEST(ParseQueryResponseTest, ParsesScalarAndString) {
  const absl::StatusOr<QueryResult> scalar = ParseQueryResponse(
      200, R"({"status":"success","data":{"resultType":"scalar","result":[5,"0.25"]}})", kOrigin);
  ASSERT_THAT(scalar, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(scalar->type, ResultType::kScalar);
  EXPECT_THAT(SingleValue(*scalar, "q"), IsOkAndHolds(0.25));

  const absl::StatusOr<QueryResult> text = ParseQueryResponse(
      200, R"({"status":"success","data":{"resultType":"string","result":[5,"hi"]}})", kOrigin);
  ASSERT_THAT(text, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(text->type, ResultType::kString);
  EXPECT_EQ(text->string_value, "hi");
  EXPECT_THAT(SingleValue(*text, "q"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseQueryResponseTest, EmptyVectorIsOkAndSingleValueSaysNotFound) {
  const absl::StatusOr<QueryResult> result = ParseQueryResponse(
      200, R"({"status":"success","data":{"resultType":"vector","result":[]}})", kOrigin);
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(result->series, IsEmpty());
  EXPECT_THAT(SingleValue(*result, "query `missing`"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("query `missing`: no series")));
}

TEST(ParseQueryResponseTest, KeepsWarnings) {
  const absl::StatusOr<QueryResult> result = ParseQueryResponse(
      200,
      R"({"status":"success","data":{"resultType":"vector","result":[]},"warnings":["w1","w2"]})",
      kOrigin);
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(result->warnings, ElementsAre("w1", "w2"));
}

TEST(ParseQueryResponseTest, MapsApiErrorTypesToCodesWithTheServersText) {
  EXPECT_THAT(
      ParseQueryResponse(
          400, R"({"status":"error","errorType":"bad_data","error":"parse error: unexpected"})",
          kOrigin),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("prometheus at http://h:9090: query `q`: HTTP 400, bad_data: parse "
                         "error: unexpected")));
  EXPECT_THAT(
      ParseQueryResponse(
          422, R"({"status":"error","errorType":"execution","error":"many-to-many"})", kOrigin),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("execution: many-to-many")));
  EXPECT_THAT(
      ParseQueryResponse(
          503, R"({"status":"error","errorType":"timeout","error":"query timed out"})", kOrigin),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("timeout: query timed out")));
  EXPECT_THAT(
      ParseQueryResponse(500, R"({"status":"error","errorType":"internal","error":"x"})", kOrigin),
      StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(ParseQueryResponse(502, R"({"status":"error","error":"x"})", kOrigin),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(ParseQueryResponseTest, NonJsonBodiesDependOnTheHttpStatus) {
  EXPECT_THAT(ParseQueryResponse(503, "Service Unavailable", kOrigin),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("HTTP 503")));
  EXPECT_THAT(ParseQueryResponse(404, "<html>404 page not found</html>", kOrigin),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is the URL a Prometheus server?")));
  EXPECT_THAT(ParseQueryResponse(200, "not json", kOrigin),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("malformed API response")));
}

TEST(ParseQueryResponseTest, RejectsMalformedShapes) {
  for (const char* body : {
           R"({"data":{}})",
           R"({"status":"success"})",
           R"({"status":"success","data":{"resultType":"table","result":[]}})",
           R"({"status":"success","data":{"resultType":"vector","result":{}}})",
           R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}})",
           R"({"status":"success","data":{"resultType":"vector",
               "result":[{"value":[1,2]}]}})",
           R"({"status":"success","data":{"resultType":"vector",
               "result":[{"value":[1,"x"]}]}})",
           R"({"status":"success","data":{"resultType":"matrix","result":[{"value":[1,"1"]}]}})",
           R"({"status":"success","data":{"resultType":"scalar","result":[1]}})",
       }) {
    SCOPED_TRACE(body);
    EXPECT_THAT(ParseQueryResponse(200, body, kOrigin),
                StatusIs(absl::StatusCode::kInternal, HasSubstr(kOrigin)));
  }
}

}  // namespace
}  // namespace trident::controller
