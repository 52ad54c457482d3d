// Unicode property and normalization tables generated from Python's
// unicodedata by gen_unicode_tables.py (into unicode_tables.cc). Internal to
// the tokenizer: use unicode.h instead.

#ifndef TRIDENT_COMMON_TOKENIZER_UNICODE_TABLES_H_
#define TRIDENT_COMMON_TOKENIZER_UNICODE_TABLES_H_

#include <cstddef>
#include <cstdint>

namespace trident::tokenizer::internal {

struct CodepointRange {
  char32_t lo;
  char32_t hi;  // Inclusive.
};

struct CombiningClassRange {
  char32_t lo;
  char32_t hi;  // Inclusive.
  uint8_t ccc;
};

// Full canonical decomposition of `cp`: kDecompositionData[offset, offset + length).
struct Decomposition {
  char32_t cp;
  uint32_t offset;
  uint32_t length;
};

// `first` + `second` compose canonically to `composite` (sorted by first, second).
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const char kUnicodeVersion[];
extern const CodepointRange kLetterRanges[];  // General category L*.
extern const size_t kLetterRangesSize;
extern const CodepointRange kNumberRanges[];  // General category N*.
extern const size_t kNumberRangesSize;
extern const CodepointRange kWhiteSpaceRanges[];  // White_Space property.
extern const size_t kWhiteSpaceRangesSize;
extern const CombiningClassRange kCombiningClassRanges[];  // Non-zero classes only.
extern const size_t kCombiningClassRangesSize;
extern const Decomposition kDecompositions[];  // Sorted by cp; Hangul excluded.
extern const size_t kDecompositionsSize;
extern const char32_t kDecompositionData[];
extern const Composition kCompositions[];
extern const size_t kCompositionsSize;

}  // namespace trident::tokenizer::internal

#endif  // TRIDENT_COMMON_TOKENIZER_UNICODE_TABLES_H_
