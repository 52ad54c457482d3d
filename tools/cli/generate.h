// `trident generate`: streams one generation from a Generation endpoint (the
// cluster's router, or any address) to stdout as the tokens arrive.

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
  // Sent as `authorization: Bearer <api_key>` when not empty.
  std::string api_key;
};

struct GenerateSummary {
  std::string text;
  int32_t tokens = 0;
  // The stream's final message.
  trident::v1::GenerateComplete complete;
};

// Streams text deltas to `out` (flushed after each; null: nowhere); returns
// the summary, or the call's error status. kInternal if the stream ends OK
// without its final GenerateComplete.
absl::StatusOr<GenerateSummary> StreamGeneration(const GenerateOptions& options, std::FILE* out);

// What `trident generate` prints to stderr after the text: the request id,
// token counts, finish reason and decode speed on one line, then a line with
// the placement (prefill, decode and attention ids) and one with the
// timings (queued, prefill, kv_transfer, time_to_first_token,
// time_per_output_token), each naming only the fields that are set and left
// out when none is. Every line ends with '\n'.
std::string FormatCompletion(const trident::v1::GenerateComplete& complete);

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_GENERATE_H_
