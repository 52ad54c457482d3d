// `trident generate`: streams one generation from a Generation endpoint to
// stdout as the tokens arrive.

#ifndef TRIDENT_TOOLS_CLI_GENERATE_H_
#define TRIDENT_TOOLS_CLI_GENERATE_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "trident/v1/generation.pb.h"

namespace trident::cli {

struct GenerateOptions {
  std::string address;
  std::string prompt;
  int32_t max_tokens = 64;
  float temperature = 0;
  absl::optional<uint64_t> seed;
  bool ignore_eos = false;
  absl::Duration timeout = absl::Minutes(5);
};

struct GenerateSummary {
  std::string text;
  int32_t tokens = 0;
  trident::v1::GenerateComplete complete;
};

// Streams text deltas to `out` (flushed after each); returns the summary, or
// the call's error status.
absl::StatusOr<GenerateSummary> StreamGeneration(const GenerateOptions& options, std::FILE* out);

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_GENERATE_H_
