// The reversible byte <-> Unicode character map of GPT-2's byte-level BPE
// (`bytes_to_unicode()`): printable bytes map to themselves, the others to
// U+0100 and up, so every byte string becomes a printable string.

#ifndef TRIDENT_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define TRIDENT_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace trident::tokenizer {

// The character byte `b` maps to.
char32_t ByteToUnicode(uint8_t b);

// The byte that maps to `c`, or -1 if none does.
int UnicodeToByte(char32_t c);

// The 256 bytes in GPT-2's order (printable ranges first, then the rest):
// the order in which GPT-2-style vocabularies list the single-byte tokens.
const std::array<uint8_t, 256>& ByteLevelOrder();

// Maps every byte of `bytes` to its character, UTF-8 encoded.
std::string BytesToByteLevel(absl::string_view bytes);

}  // namespace trident::tokenizer

#endif  // TRIDENT_COMMON_TOKENIZER_BYTE_LEVEL_H_
