// Runs Debian's `ucx_perftest` (package ucx-utils) as two processes on
// loopback, for benchmarks that compare a transfer with what UCX itself
// reaches on the same transport and message size.

#ifndef TRIDENT_COMMON_TRANSPORT_UCX_PERFTEST_H_
#define TRIDENT_COMMON_TRANSPORT_UCX_PERFTEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trident::transport {

struct PerftestOptions {
  // "ucp_put_bw", "ucp_am_bw", ...
  std::string test = "ucp_put_bw";
  // UCX_TLS of both processes.
  std::string transport = "posix";
  uint64_t message_bytes = 0;
  // Iterations: enough for ~1 GiB, at least 20.
  uint64_t iterations = 0;
  // -O: most sends outstanding; 0 leaves perftest's default.
  int outstanding = 0;
};

// $UCX_PERFTEST if it names an executable (a bundled copy), else
// ucx_perftest on PATH, else empty.
std::string FindUcxPerftest();

// ucx_perftest's overall bandwidth in GB/s (1e9 bytes/s), with error-handling
// endpoints (-e, UCX_MM_ERROR_HANDLING=y) as UcxWorker creates them. Logs go
// to $TMPDIR (else /tmp). UNAVAILABLE with the client's log tail when it
// fails.
absl::StatusOr<double> RunUcxPerftest(const std::string& perftest, const PerftestOptions& options);

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_UCX_PERFTEST_H_
