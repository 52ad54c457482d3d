// One-line registration of a Prometheus counter or gauge (family and series
// at once), and a counter that follows a monotonic total kept elsewhere
// (a component's own stats, sampled now and then).

#ifndef TRIDENT_COMMON_TELEMETRY_METRIC_FAMILIES_H_
#define TRIDENT_COMMON_TELEMETRY_METRIC_FAMILIES_H_

#include <map>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace trident::telemetry {

// The series of `name` with `labels` in `registry` (its family registered,
// or found, with `help`).
inline prometheus::Counter& CounterOf(prometheus::Registry& registry, const std::string& name,
                                      const std::string& help,
                                      const std::map<std::string, std::string>& labels = {}) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}
inline prometheus::Gauge& GaugeOf(prometheus::Registry& registry, const std::string& name,
                                  const std::string& help,
                                  const std::map<std::string, std::string>& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

// Brings `counter` up to `total` (a monotonic count or sum), which was
// `*last` when it last followed; a total that went down (a restart of what
// keeps it) adds nothing.
template <typename T>
void FollowTotal(prometheus::Counter& counter, T total, T* last) {
  if (total > *last) counter.Increment(static_cast<double>(total - *last));
  *last = total;
}

}  // namespace trident::telemetry

#endif  // TRIDENT_COMMON_TELEMETRY_METRIC_FAMILIES_H_
