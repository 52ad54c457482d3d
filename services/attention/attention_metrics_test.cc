#include "services/attention/attention_metrics.h"

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::attention {
namespace {

// Samples and sum of the histogram `name` in the registry; -1 if absent.
struct HistogramTotals {
  int64_t count = -1;
  double sum = 0;
};

HistogramTotals Histogram(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.metric.empty()) continue;
    return {static_cast<int64_t>(family.metric[0].histogram.sample_count),
            family.metric[0].histogram.sample_sum};
  }
  return {};
}

TEST(AttentionMetricsTest, AppendOnlyRequestsStayOutOfTheKernelTime) {
  prometheus::Registry registry;
  AttentionMetrics metrics(registry, "avx2", 0, 4);
  metrics.Record({.layer = 0, .num_sequences = 2, .compute = absl::Milliseconds(3)});
  metrics.Record(
      {.layer = 0, .num_sequences = 1, .compute = absl::Milliseconds(40), .append_only = true});
  metrics.Record({.layer = 1, .num_sequences = 2, .compute = absl::Milliseconds(5)});

  const HistogramTotals kernel = Histogram(registry, "trident_attention_kernel_seconds");
  EXPECT_EQ(kernel.count, 2);
  EXPECT_NEAR(kernel.sum, 0.008, 1e-9);
  const HistogramTotals append = Histogram(registry, "trident_attention_append_seconds");
  EXPECT_EQ(append.count, 1);
  EXPECT_NEAR(append.sum, 0.040, 1e-9);
  EXPECT_EQ(Histogram(registry, "trident_attention_request_sequences").count, 3);
}

}  // namespace
}  // namespace trident::attention
