// UTF-8 handling and the Unicode pieces the tokenizer needs: Python-compatible
// replacement of invalid UTF-8, the \p{L} / \p{N} / \s classes of the
// pre-tokenizer patterns, and NFC normalization.

#ifndef TRIDENT_COMMON_TOKENIZER_UNICODE_H_
#define TRIDENT_COMMON_TOKENIZER_UNICODE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace trident::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Returns `bytes` with every ill-formed sequence replaced by U+FFFD exactly as
// Python's `bytes.decode("utf-8", errors="replace")` (and Rust's
// `String::from_utf8_lossy`) do: one U+FFFD per maximal subpart of an
// ill-formed sequence. Valid input comes back unchanged.
std::string ReplaceInvalidUtf8(absl::string_view bytes);

// True if `bytes` is well-formed UTF-8 (no surrogates, no overlongs).
bool IsValidUtf8(absl::string_view bytes);

// Decodes well-formed UTF-8 (as produced by ReplaceInvalidUtf8). Behavior on
// ill-formed input is safe but unspecified.
std::u32string Utf8ToCodepoints(absl::string_view utf8);

// Appends the UTF-8 encoding of `cp` (a scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);
std::string CodepointsToUtf8(const std::u32string& cps);

// Byte length of the UTF-8 sequence that starts with `lead` (1 for ASCII and
// for bytes that cannot start a sequence).
int Utf8SequenceLength(unsigned char lead);

bool IsLetter(char32_t cp);      // General category L* (regex \p{L}).
bool IsNumber(char32_t cp);      // General category N* (regex \p{N}).
bool IsWhiteSpace(char32_t cp);  // White_Space property (Oniguruma's \s).
int CanonicalCombiningClass(char32_t cp);

// Unicode Normalization Form C of well-formed UTF-8.
std::string NfcNormalize(absl::string_view utf8);

// The Unicode version the tables were generated from.
absl::string_view UnicodeTablesVersion();

}  // namespace trident::tokenizer

#endif  // TRIDENT_COMMON_TOKENIZER_UNICODE_H_
