#ifndef TRIDENT_COMMON_SAMPLING_STOP_CHECKER_H_
#define TRIDENT_COMMON_SAMPLING_STOP_CHECKER_H_

// Decides, token by token, when a request's generation ends and which text
// may be streamed to the client so far.
//
// Stop strings are matched on the output text and may span tokens, so text
// that could be the start of a stop string is held back until it is known
// not to be one:
//
//   stop_strings = {"</s>"}
//   token text:  "Hi <"   "/"     "s"    ">"
//   emitted:     "Hi "    ""      ""     ""      finished, matched "</s>"
//   held back:   "<"      "</"    "</s"  -
//
// When several stop strings occur, the one whose match ends first in the
// text wins (the longest among those ending at the same byte), as if the text
// were scanned one character at a time; so the outcome does not depend on
// how the text is split into tokens.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "common/sampling/sampling_params.h"

namespace trident::sampling {

enum class FinishReason {
  kNone,        // Not finished (or ended from outside, by Finish()).
  kStopToken,   // An EOS token or one of stop_token_ids was generated.
  kStopString,  // A stop string appeared in the text.
  kLength,      // max_tokens tokens were generated.
};

// Thread-compatible; one per request, driven by the thread that detokenizes.
class StopChecker {
 public:
  struct Update {
    // Text to append to the client's output; empty while held back.
    std::string text_to_emit;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    // For kStopString, the stop string that matched.
    absl::optional<std::string> matched_stop;
    // For kStopToken, the EOS or stop token id that was generated.
    absl::optional<int32_t> matched_stop_token_id;
  };

  // `eos_token_ids` are the model's EOS tokens, which stop generation unless
  // params.ignore_eos. Empty stop strings in `params` are ignored.
  StopChecker(const StopParams& params, std::vector<int32_t> eos_token_ids);

  // Accounts for the next generated `token` whose text is `text_delta` (from
  // the incremental detokenizer: whole UTF-8 characters). In order:
  //  - an EOS (unless ignore_eos) or stop token finishes with kStopToken;
  //    its own text is dropped and held-back text is emitted;
  //  - otherwise the text is appended; a stop string match finishes with
  //    kStopString, emitting the text before the match (plus the stop string
  //    if include_stop_string_in_output) and dropping everything after it;
  //  - otherwise, the max_tokens-th token finishes with kLength and emits
  //    everything, held-back text included;
  //  - otherwise the text is emitted up to the longest suffix that is a
  //    proper prefix of some stop string (cut at a character boundary).
  // After the request finished, further calls return an Update with no text
  // and `finished` set, with the original reason.
  Update OnToken(int32_t token, absl::string_view text_delta);

  // Ends the request from outside (context window full, abort): returns the
  // held-back text and marks the request finished. The reason is the one
  // already reached, or kNone. Calling it again returns no text.
  Update Finish();

  bool finished() const { return finished_; }
  int32_t num_tokens() const { return num_tokens_; }

 private:
  Update Finished(FinishReason reason, std::string text);
  bool IsStopToken(int32_t token) const;
  // Length of the longest suffix of pending_ that is a proper prefix of a
  // stop string.
  size_t HeldBackLength() const;

  StopParams params_;
  std::vector<int32_t> eos_token_ids_;
  std::string pending_;
  int32_t num_tokens_ = 0;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::kNone;
};

}  // namespace trident::sampling

#endif  // TRIDENT_COMMON_SAMPLING_STOP_CHECKER_H_
