// PrometheusClient against a real Prometheus server (Debian's) scraping an
// exposition endpoint this test serves, and against ports that refuse
// connections or never answer.
//
// Nothing sleeps: the endpoint counts its scrapes, and a test that needs k
// scrapes stored waits on that count reaching k + 1 (Prometheus commits a
// scrape's samples before it starts the next one).

#include "services/controller/prometheus/prometheus_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/controller/prometheus/local_prometheus.h"

namespace trident::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

constexpr absl::Duration kScrapeWait = absl::Seconds(30);

// The registry's metrics, plus `trident_test_scrapes`: how many times it was
// scraped before this scrape. Each scrape is counted and announced.
class ScrapeCountingCollectable : public prometheus::Collectable {
 public:
  ScrapeCountingCollectable() {
    auto& values = prometheus::BuildGauge()
                       .Name("trident_test_value")
                       .Help("Fixed values of each kind.")
                       .Register(*registry_);
    values.Add({{"kind", "finite"}}).Set(2.5);
    values.Add({{"kind", "nan"}}).Set(NAN);
    values.Add({{"kind", "inf"}}).Set(INFINITY);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    scrapes_gauge_.Set(static_cast<double>(scrapes_));
    ++scrapes_;
    return registry_->Collect();
  }

  // Waits until `n` scrapes have begun (true) or `timeout` passed (false).
  bool WaitForScrapes(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return scrapes_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

  int scrapes() const {
    absl::MutexLock lock(&mu_);
    return scrapes_;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& scrapes_gauge_ = prometheus::BuildGauge()
                                          .Name("trident_test_scrapes")
                                          .Help("Scrapes before this one.")
                                          .Register(*registry_)
                                          .Add({});
  mutable absl::Mutex mu_;
  mutable int scrapes_ ABSL_GUARDED_BY(mu_) = 0;
};

// One exposition endpoint and one Prometheus scraping it, shared by the
// tests of the suite (a server takes a second or two to start).
class PrometheusClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    exposer_ = new prometheus::Exposer("127.0.0.1:0");
    collectable_ = std::make_shared<ScrapeCountingCollectable>();
    exposer_->RegisterCollectable(collectable_);
    target_ = absl::StrCat("127.0.0.1:", exposer_->GetListeningPorts().at(0));
    absl::StatusOr<std::unique_ptr<LocalPrometheus>> server =
        LocalPrometheus::Start({.dir = trident::testing::TestTmpPath("prometheus"),
                                .targets = {target_},
                                .job = "exposition"});
    ASSERT_THAT(server, StatusIs(absl::StatusCode::kOk));
    server_ = server->release();
    std::printf("prometheus at %s scrapes %s every 200ms\n", server_->url().c_str(),
                target_.c_str());
  }

  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete exposer_;
    exposer_ = nullptr;
    collectable_.reset();
  }

  static std::unique_ptr<PrometheusClient> Client() {
    return *PrometheusClient::Create({.base_url = server_->url(), .timeout = absl::Seconds(10)});
  }

  // Waits until `stored` scrapes of the endpoint are in Prometheus's storage.
  static void WaitForStoredScrapes(int stored) {
    ASSERT_TRUE(collectable_->WaitForScrapes(stored + 1, kScrapeWait))
        << "only " << collectable_->scrapes() << " scrapes in " << kScrapeWait
        << "; prometheus log:\n"
        << server_->log();
  }

  static inline prometheus::Exposer* exposer_ = nullptr;
  static inline std::shared_ptr<ScrapeCountingCollectable> collectable_;
  static inline std::string target_;
  static inline LocalPrometheus* server_ = nullptr;
};

TEST_F(PrometheusClientTest, InstantQueryReturnsVectorWithNanAndInf) {
  WaitForStoredScrapes(1);
  absl::StatusOr<QueryResult> result = Client()->Query({.promql = "trident_test_value"});
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(result->type, ResultType::kVector);
  ASSERT_EQ(result->series.size(), 3u);
  for (const Series& series : result->series) {
    std::printf("  %s = %g\n", LabelsToString(series.labels).c_str(), series.samples.at(0).value);
    EXPECT_EQ(series.labels.at("__name__"), "trident_test_value");
    EXPECT_EQ(series.labels.at("job"), "exposition");
    EXPECT_EQ(series.labels.at("instance"), target_);
    const double value = series.samples.at(0).value;
    const std::string& kind = series.labels.at("kind");
    if (kind == "finite") {
      EXPECT_EQ(value, 2.5);
    } else if (kind == "nan") {
      EXPECT_TRUE(std::isnan(value));
    } else {
      EXPECT_EQ(kind, "inf");
      EXPECT_EQ(value, INFINITY);
    }
  }
  EXPECT_LE(result->series.at(0).samples.at(0).time, absl::Now());
}

TEST_F(PrometheusClientTest, ScalarAndStringResults) {
  WaitForStoredScrapes(1);
  absl::StatusOr<QueryResult> scalar =
      Client()->Query({.promql = "scalar(trident_test_value{kind=\"finite\"}) * 2"});
  ASSERT_THAT(scalar, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(scalar->type, ResultType::kScalar);
  EXPECT_THAT(SingleValue(*scalar, "scalar"), IsOkAndHolds(5.0));

  absl::StatusOr<QueryResult> text = Client()->Query({.promql = "\"trident\""});
  ASSERT_THAT(text, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(text->type, ResultType::kString);
  EXPECT_EQ(text->string_value, "trident");
}

TEST_F(PrometheusClientTest, RangeQueryReturnsMatrixOfScrapes) {
  const absl::Time start = absl::Now();
  const int first = collectable_->scrapes();
  WaitForStoredScrapes(first + 3);
  absl::StatusOr<QueryResult> result = Client()->QueryRange({.promql = "trident_test_scrapes",
                                                             .start = start,
                                                             .end = absl::Now(),
                                                             .step = absl::Milliseconds(100)});
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(result->type, ResultType::kMatrix);
  ASSERT_EQ(result->series.size(), 1u);
  const std::vector<Sample>& samples = result->series[0].samples;
  ASSERT_GE(samples.size(), 2u);
  std::printf("  trident_test_scrapes over %zu steps: %g .. %g\n", samples.size(),
              samples.front().value, samples.back().value);
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].time - samples[i - 1].time, absl::Milliseconds(100));
    EXPECT_GE(samples[i].value, samples[i - 1].value);
  }
  // At least two scrapes made after `start` are in the range.
  EXPECT_GE(samples.back().value, samples.front().value + 1);
}

TEST_F(PrometheusClientTest, MissingSeriesIsEmptyAndSingleValueSaysNotFound) {
  WaitForStoredScrapes(1);
  const std::string promql = "trident_test_no_such_metric";
  absl::StatusOr<QueryResult> result = Client()->Query({.promql = promql});
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(result->series, IsEmpty());
  EXPECT_THAT(SingleValue(*result, promql),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(promql)));
}

TEST_F(PrometheusClientTest, QueryAtTimeBeforeAnyDataIsEmpty) {
  WaitForStoredScrapes(1);
  absl::StatusOr<QueryResult> result =
      Client()->Query({.promql = "trident_test_value", .time = absl::Now() - absl::Hours(1)});
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(result->series, IsEmpty());
}

TEST_F(PrometheusClientTest, PromqlErrorIsInvalidArgumentWithTheApisErrorText) {
  absl::StatusOr<QueryResult> result = Client()->Query({.promql = "sum(trident_test_value"});
  std::printf("  %s\n", result.status().ToString().c_str());
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                               ::testing::AllOf(HasSubstr(server_->url()), HasSubstr("bad_data"),
                                                HasSubstr("parse error"))));
  EXPECT_THAT(Client()->QueryRange({.promql = "rate(trident_test_value)",
                                    .start = absl::Now() - absl::Seconds(10),
                                    .end = absl::Now(),
                                    .step = absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad_data")));
}

TEST(PrometheusClientStandaloneTest, StoppedPrometheusIsUnavailableNamingItsAddress) {
  absl::StatusOr<std::unique_ptr<LocalPrometheus>> server = LocalPrometheus::Start(
      {.dir = trident::testing::TestTmpPath("stopped-prometheus"), .targets = {}});
  ASSERT_THAT(server, StatusIs(absl::StatusCode::kOk));
  std::unique_ptr<PrometheusClient> client =
      *PrometheusClient::Create({.base_url = (*server)->url(), .timeout = absl::Seconds(10)});
  ASSERT_THAT(client->Query({.promql = "vector(1)"}), StatusIs(absl::StatusCode::kOk));

  ASSERT_THAT((*server)->Stop(), StatusIs(absl::StatusCode::kOk));
  absl::StatusOr<QueryResult> result = client->Query({.promql = "vector(1)"});
  std::printf("  after stop: %s\n", result.status().ToString().c_str());
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr(absl::StrCat("prometheus at ", (*server)->url()))));
}

// A loopback TCP socket on a port the kernel picks; listening or not.
class LoopbackSocket {
 public:
  explicit LoopbackSocket(bool listen_on_it) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    if (listen_on_it) listen(fd_, 4);
  }
  ~LoopbackSocket() { close(fd_); }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(PrometheusClientStandaloneTest, RefusedConnectionIsUnavailableNamingTheAddress) {
  // Bound but not listening: the port is ours, and connecting is refused.
  const LoopbackSocket refusing(/*listen_on_it=*/false);
  ASSERT_GT(refusing.port(), 0);
  std::unique_ptr<PrometheusClient> client =
      *PrometheusClient::Create({.base_url = refusing.url(), .timeout = absl::Seconds(5)});
  const absl::Time begin = absl::Now();
  absl::StatusOr<QueryResult> result = client->Query({.promql = "up"});
  std::printf("  refused: %s (%s)\n", result.status().ToString().c_str(),
              absl::FormatDuration(absl::Now() - begin).c_str());
  EXPECT_THAT(result,
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AllOf(HasSubstr(absl::StrCat("prometheus at ", refusing.url())),
                                        HasSubstr("unreachable"))));
  EXPECT_THAT(client->QueryRange({.promql = "up",
                                  .start = absl::Now() - absl::Minutes(1),
                                  .end = absl::Now(),
                                  .step = absl::Seconds(15)}),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(PrometheusClientStandaloneTest, SilentServerTimesOutAsUnavailable) {
  // Listening but never accepting: the kernel completes the handshake, the
  // request is sent, and no answer ever comes.
  const LoopbackSocket silent(/*listen_on_it=*/true);
  const absl::Duration timeout = absl::Milliseconds(300);
  std::unique_ptr<PrometheusClient> client =
      *PrometheusClient::Create({.base_url = silent.url(), .timeout = timeout});
  const absl::Time begin = absl::Now();
  absl::StatusOr<QueryResult> result = client->Query({.promql = "up"});
  const absl::Duration waited = absl::Now() - begin;
  std::printf("  silent: %s (after %s)\n", result.status().ToString().c_str(),
              absl::FormatDuration(waited).c_str());
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable,
                               ::testing::AllOf(HasSubstr(silent.url()),
                                                HasSubstr("no answer within 300ms"))));
  // curl times on its own (monotonic) clock; allow for the two clocks' skew.
  EXPECT_GE(waited, timeout * 0.9);
  EXPECT_LT(waited, absl::Seconds(5));
}

TEST(PrometheusClientStandaloneTest, CreateRejectsBadUrlsAndTimeouts) {
  EXPECT_THAT(PrometheusClient::Create({.base_url = "127.0.0.1:9090"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("http://host:port")));
  EXPECT_THAT(PrometheusClient::Create({.base_url = "http://"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PrometheusClient::Create({.base_url = "http://h:1", .timeout = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  absl::StatusOr<std::unique_ptr<PrometheusClient>> client =
      PrometheusClient::Create({.base_url = "http://h:9090/prefix/"});
  ASSERT_THAT(client, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ((*client)->Describe(), "prometheus at http://h:9090/prefix");
  EXPECT_THAT((*client)->Query({.promql = ""}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*client)->QueryRange({.promql = "up",
                                     .start = absl::FromUnixSeconds(10),
                                     .end = absl::FromUnixSeconds(5),
                                     .step = absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("before start")));
}

}  // namespace
}  // namespace trident::controller
