#include "common/tokenizer/split_pattern.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "common/tokenizer/unicode.h"

namespace trident::tokenizer {
namespace {

constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum CharClass : uint8_t {
  kLetter = 1,
  kNumber = 2,
  kSpace = 4,
};

struct Text {
  std::u32string cps;
  std::vector<uint8_t> cls;
  size_t size() const { return cps.size(); }
  bool L(size_t i) const { return i < cps.size() && (cls[i] & kLetter); }
  bool N(size_t i) const { return i < cps.size() && (cls[i] & kNumber); }
  bool S(size_t i) const { return i < cps.size() && (cls[i] & kSpace); }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return i < cps.size() && cls[i] == 0; }
  bool Is(size_t i, char32_t c) const { return i < cps.size() && cps[i] == c; }
  bool CrLf(size_t i) const { return Is(i, '\r') || Is(i, '\n'); }
};

// Case-insensitive match of one ASCII letter as Oniguruma folds it: the
// upper and lower case forms, plus U+017F LATIN SMALL LETTER LONG S for 's'.
bool FoldEq(char32_t c, char lower) {
  if (c == static_cast<char32_t>(lower) || c == static_cast<char32_t>(lower - 'a' + 'A')) {
    return true;
  }
  return lower == 's' && c == 0x017F;
}

// 's|'t|'re|'ve|'m|'ll|'d at i; returns the match end or 0.
size_t MatchContraction(const Text& t, size_t i, bool ignore_case) {
  if (!t.Is(i, '\'')) return 0;
  static constexpr const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  for (const char* suffix : kSuffixes) {
    size_t j = i + 1;
    const char* p = suffix;
    for (; *p != '\0'; ++p, ++j) {
      if (j >= t.size()) break;
      const char32_t c = t.cps[j];
      if (ignore_case ? !FoldEq(c, *p) : c != static_cast<char32_t>(*p)) break;
    }
    if (*p == '\0') return j;
  }
  return 0;
}

template <typename Pred>
size_t RunEnd(const Text& t, size_t i, Pred pred) {
  while (i < t.size() && pred(i)) ++i;
  return i;
}

// \s+(?!\S) then \s+ at i (t.S(i) holds). Returns the match end.
size_t MatchTrailingSpace(const Text& t, size_t i) {
  const size_t j = RunEnd(t, i, [&](size_t k) { return t.S(k); });
  if (j == t.size()) return j;   // \s+(?!\S) takes the whole run at the end.
  if (j - i >= 2) return j - 1;  // Give one back so that (?!\S) holds.
  return j;                      // \s+
}

size_t MatchGpt2(const Text& t, size_t i) {
  if (size_t e = MatchContraction(t, i, /*ignore_case=*/false)) return e;
  const size_t k = t.Is(i, ' ') ? i + 1 : i;  // Optional leading space.
  if (t.L(k)) return RunEnd(t, k, [&](size_t x) { return t.L(x); });
  if (t.N(k)) return RunEnd(t, k, [&](size_t x) { return t.N(x); });
  if (t.Other(k)) return RunEnd(t, k, [&](size_t x) { return t.Other(x); });
  if (t.S(i)) return MatchTrailingSpace(t, i);
  return 0;
}

size_t MatchLlama3(const Text& t, size_t i, size_t max_digits) {
  if (size_t e = MatchContraction(t, i, /*ignore_case=*/true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!t.L(i) && !t.N(i) && !t.CrLf(i) && t.L(i + 1)) {
    return RunEnd(t, i + 1, [&](size_t x) { return t.L(x); });
  }
  if (t.L(i)) return RunEnd(t, i, [&](size_t x) { return t.L(x); });
  // \p{N}{1,max_digits}
  if (t.N(i)) {
    size_t j = i;
    while (j < t.size() && j - i < max_digits && t.N(j)) ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t k = t.Is(i, ' ') ? i + 1 : i;
  if (t.Other(k)) {
    const size_t j = RunEnd(t, k, [&](size_t x) { return t.Other(x); });
    return RunEnd(t, j, [&](size_t x) { return t.CrLf(x); });
  }
  if (!t.S(i)) return 0;
  // \s*[\r\n]+: ends after the last \r or \n of the whitespace run.
  const size_t j = RunEnd(t, i, [&](size_t x) { return t.S(x); });
  for (size_t e = j; e > i; --e) {
    if (t.CrLf(e - 1)) return e;
  }
  return MatchTrailingSpace(t, i);
}

}  // namespace

absl::optional<SplitPattern> SplitPatternFromRegex(absl::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return absl::nullopt;
}

absl::string_view SplitPatternRegex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return kGpt2Regex;
    case SplitPattern::kLlama3:
      return kLlama3Regex;
    case SplitPattern::kQwen2:
      return kQwen2Regex;
  }
  return kGpt2Regex;
}

std::vector<absl::string_view> SplitIsolated(SplitPattern pattern, absl::string_view text) {
  Text t;
  t.cps = Utf8ToCodepoints(text);
  t.cls.resize(t.cps.size());
  std::vector<size_t> offsets(t.cps.size() + 1);  // Byte offset of each code point.
  size_t byte = 0;
  for (size_t i = 0; i < t.cps.size(); ++i) {
    const char32_t c = t.cps[i];
    t.cls[i] =
        (IsLetter(c) ? kLetter : 0) | (IsNumber(c) ? kNumber : 0) | (IsWhiteSpace(c) ? kSpace : 0);
    offsets[i] = byte;
    byte += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  offsets[t.cps.size()] = byte;

  std::vector<absl::string_view> pieces;
  size_t gap_start = 0;
  size_t i = 0;
  while (i < t.size()) {
    size_t end = 0;
    switch (pattern) {
      case SplitPattern::kGpt2:
        end = MatchGpt2(t, i);
        break;
      case SplitPattern::kLlama3:
        end = MatchLlama3(t, i, 3);
        break;
      case SplitPattern::kQwen2:
        end = MatchLlama3(t, i, 1);
        break;
    }
    if (end <= i) {  // No match here: the code point joins the gap.
      ++i;
      continue;
    }
    if (gap_start < i) {
      pieces.push_back(text.substr(offsets[gap_start], offsets[i] - offsets[gap_start]));
    }
    pieces.push_back(text.substr(offsets[i], offsets[end] - offsets[i]));
    i = end;
    gap_start = end;
  }
  if (gap_start < t.size()) {
    pieces.push_back(text.substr(offsets[gap_start], offsets[t.size()] - offsets[gap_start]));
  }
  return pieces;
}

}  // namespace trident::tokenizer
