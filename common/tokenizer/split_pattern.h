// Hand-written matchers for the regular expressions that byte-level BPE
// tokenizers use to split text into words before BPE (the `Split`
// pre-tokenizer with behavior "Isolated", and the ByteLevel pre-tokenizer's
// built-in GPT-2 pattern). Each reproduces Oniguruma's leftmost-first,
// backtracking semantics for its pattern exactly; no regex engine is used.

#ifndef TRIDENT_COMMON_TOKENIZER_SPLIT_PATTERN_H_
#define TRIDENT_COMMON_TOKENIZER_SPLIT_PATTERN_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/optional.h"

namespace trident::tokenizer {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} in place of \p{N}{1,3}.
  kQwen2,
};

// The pattern whose regex source is exactly `regex`, or nullopt.
absl::optional<SplitPattern> SplitPatternFromRegex(absl::string_view regex);

// The regex source of `pattern`.
absl::string_view SplitPatternRegex(SplitPattern pattern);

// Splits well-formed UTF-8 `text` into consecutive pieces: every match of
// `pattern` (found left to right as regex find_iter does) and every stretch
// between matches. The pieces concatenate to `text`; none is empty.
std::vector<absl::string_view> SplitIsolated(SplitPattern pattern, absl::string_view text);

}  // namespace trident::tokenizer

#endif  // TRIDENT_COMMON_TOKENIZER_SPLIT_PATTERN_H_
