#include "common/tokenizer/unicode.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "common/tokenizer/unicode_tables.h"

namespace trident::tokenizer {
namespace {

using internal::CodepointRange;

bool InRanges(const CodepointRange* ranges, size_t size, char32_t cp) {
  const CodepointRange* end = ranges + size;
  const CodepointRange* it = std::upper_bound(
      ranges, end, cp, [](char32_t c, const CodepointRange& r) { return c < r.lo; });
  if (it == ranges) return false;
  --it;
  return cp <= it->hi;
}

// Length of the well-formed UTF-8 sequence at the start of `s`, or 0 if the
// sequence is ill-formed; `*subpart` receives the length of its maximal
// well-formed prefix (at least 1), the unit that becomes one U+FFFD.
size_t WellFormedLength(absl::string_view s, size_t* subpart) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = b(0);
  *subpart = 1;
  if (lead < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // Range of the second byte.
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return 0;
    const unsigned char c = b(i);
    const unsigned char min = i == 1 ? lo : 0x80;
    const unsigned char max = i == 1 ? hi : 0xBF;
    if (c < min || c > max) return 0;
    *subpart = i + 1;
  }
  return need;
}

// Hangul syllable constants (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void Decompose(char32_t cp, std::u32string* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const internal::Decomposition* begin = internal::kDecompositions;
  const internal::Decomposition* end = begin + internal::kDecompositionsSize;
  const internal::Decomposition* it = std::lower_bound(
      begin, end, cp, [](const internal::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != end && it->cp == cp) {
    out->append(internal::kDecompositionData + it->offset, it->length);
  } else {
    out->push_back(cp);
  }
}

// The primary composite of `a` + `b`, or 0 if there is none.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const internal::Composition* begin = internal::kCompositions;
  const internal::Composition* end = begin + internal::kCompositionsSize;
  const internal::Composition* it =
      std::lower_bound(begin, end, std::make_pair(a, b),
                       [](const internal::Composition& c, const std::pair<char32_t, char32_t>& k) {
                         return c.first != k.first ? c.first < k.first : c.second < k.second;
                       });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

std::string ReplaceInvalidUtf8(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t subpart;
    const size_t n = WellFormedLength(bytes.substr(i), &subpart);
    if (n > 0) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      AppendUtf8(kReplacementChar, &out);
      i += subpart;
    }
  }
  return out;
}

bool IsValidUtf8(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    size_t subpart;
    const size_t n = WellFormedLength(bytes.substr(i), &subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

int Utf8SequenceLength(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  return 1;
}

std::u32string Utf8ToCodepoints(absl::string_view utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  size_t i = 0;
  while (i < utf8.size()) {
    const unsigned char lead = static_cast<unsigned char>(utf8[i]);
    const size_t n = std::min<size_t>(Utf8SequenceLength(lead), utf8.size() - i);
    char32_t cp = n == 1 ? lead : lead & (0x7F >> n);
    for (size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string CodepointsToUtf8(const std::u32string& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

bool IsLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(internal::kLetterRanges, internal::kLetterRangesSize, cp);
}

bool IsNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(internal::kNumberRanges, internal::kNumberRangesSize, cp);
}

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return InRanges(internal::kWhiteSpaceRanges, internal::kWhiteSpaceRangesSize, cp);
}

int CanonicalCombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const internal::CombiningClassRange* begin = internal::kCombiningClassRanges;
  const internal::CombiningClassRange* end = begin + internal::kCombiningClassRangesSize;
  const internal::CombiningClassRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const internal::CombiningClassRange& r) { return c < r.lo; });
  if (it == begin) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

std::string NfcNormalize(absl::string_view utf8) {
  // Code points below U+0300 are already NFC and never compose with each other.
  bool simple = true;
  for (unsigned char c : utf8) {
    if (c >= 0xCC) {  // First lead byte of a code point >= U+0300.
      simple = false;
      break;
    }
  }
  if (simple) return std::string(utf8);

  std::u32string buf;
  buf.reserve(utf8.size());
  for (char32_t cp : Utf8ToCodepoints(utf8)) Decompose(cp, &buf);

  // Canonical ordering: stable sort of every run of non-starters by class.
  for (size_t i = 0; i < buf.size();) {
    if (CanonicalCombiningClass(buf[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < buf.size() && CanonicalCombiningClass(buf[j]) != 0) ++j;
    std::stable_sort(buf.begin() + i, buf.begin() + j, [](char32_t a, char32_t b) {
      return CanonicalCombiningClass(a) < CanonicalCombiningClass(b);
    });
    i = j;
  }

  // Canonical composition.
  if (buf.empty()) return std::string();
  size_t starter_pos = 0;
  char32_t starter = buf[0];
  int last_class = CanonicalCombiningClass(starter) == 0 ? 0 : 256;
  size_t out_pos = 1;
  for (size_t i = 1; i < buf.size(); ++i) {
    const char32_t ch = buf[i];
    const int ch_class = CanonicalCombiningClass(ch);
    const char32_t composite = last_class == 256 ? 0 : Compose(starter, ch);
    if (composite != 0 && (last_class < ch_class || last_class == 0)) {
      buf[starter_pos] = composite;
      starter = composite;
      continue;
    }
    if (ch_class == 0) {
      starter_pos = out_pos;
      starter = ch;
    }
    last_class = ch_class;
    buf[out_pos++] = ch;
  }
  buf.resize(out_pos);
  return CodepointsToUtf8(buf);
}

absl::string_view UnicodeTablesVersion() { return internal::kUnicodeVersion; }

}  // namespace trident::tokenizer
