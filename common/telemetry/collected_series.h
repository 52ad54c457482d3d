// Reading one series back from a prometheus::Registry, for tests of the
// components that record metrics.

#ifndef TRIDENT_COMMON_TELEMETRY_COLLECTED_SERIES_H_
#define TRIDENT_COMMON_TELEMETRY_COLLECTED_SERIES_H_

#include <cstdint>
#include <string>

#include "prometheus/registry.h"

namespace trident::telemetry {

// One collected series: its value (counter, gauge) or its histogram's sample
// count and sum; `found` false when no such series exists.
struct CollectedSeries {
  bool found = false;
  double value = 0;
  uint64_t count = 0;
  double sum = 0;
};

// The series of family `name` whose labels are exactly `labels`.
inline CollectedSeries FindSeries(prometheus::Registry& registry, const std::string& name,
                                  const prometheus::Labels& labels) {
  CollectedSeries s;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      prometheus::Labels got;
      for (const prometheus::ClientMetric::Label& l : m.label) got[l.name] = l.value;
      if (got != labels) continue;
      s.found = true;
      s.value = family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      s.count = m.histogram.sample_count;
      s.sum = m.histogram.sample_sum;
    }
  }
  return s;
}

}  // namespace trident::telemetry

#endif  // TRIDENT_COMMON_TELEMETRY_COLLECTED_SERIES_H_
