#include "common/tokenizer/unicode.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace trident::tokenizer {
namespace {

// Expected values from Python 3: bytes.decode("utf-8", errors="replace").
TEST(ReplaceInvalidUtf8Test, MatchesPythonErrorsReplace) {
  struct Case {
    std::string in;
    std::string out;
  };
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<Case> cases = {
      {"", ""},
      {"abc", "abc"},
      {"h\xC3\xA9llo", "h\xC3\xA9llo"},
      {"\x80", r},                        // Stray continuation byte.
      {"a\x80\x80z", "a" + r + r + "z"},  // One U+FFFD per stray byte.
      {"\xC3", r},                        // Truncated 2-byte sequence.
      {"\xC3"
       "a",
       r + "a"},
      {"\xE4\xB8", r},  // Truncated 3-byte sequence: one U+FFFD.
      {"\xE4\xB8"
       "a",
       r + "a"},
      {"\xF0\x9F\x98", r},  // Truncated 4-byte sequence: one U+FFFD.
      {"\xF0\x9F\x98\xF0\x9F\x98\x80", r + "\xF0\x9F\x98\x80"},
      {"\xC0\xAF", r + r},                  // Overlong '/': C0 never starts a sequence.
      {"\xE0\x80\xAF", r + r + r},          // Overlong 3-byte: E0 needs A0..BF next.
      {"\xF0\x80\x80\xAF", r + r + r + r},  // Overlong 4-byte.
      {"\xED\xA0\x80", r + r + r},          // Surrogate U+D800.
      {"\xED\x9F\xBF", "\xED\x9F\xBF"},     // U+D7FF is fine.
      {"\xF4\x90\x80\x80", r + r + r + r},  // Above U+10FFFF.
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},
      {"\xF5\x80", r + r},
      {"\xFF\xFE", r + r},
      {"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", r + r + r + r + "A"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ReplaceInvalidUtf8(c.in), c.out) << absl::CEscape(c.in);
    EXPECT_EQ(IsValidUtf8(c.in), c.in == c.out) << absl::CEscape(c.in);
  }
}

TEST(Utf8Test, RoundTripsCodepoints) {
  const std::u32string cps = {U'a', 0xE9, 0x4E2D, 0x1F600, 0x10FFFF, 0};
  EXPECT_EQ(Utf8ToCodepoints(CodepointsToUtf8(cps)), cps);
  EXPECT_EQ(CodepointsToUtf8({0x1F600}), "\xF0\x9F\x98\x80");
}

TEST(CharClassTest, LettersNumbersWhiteSpace) {
  EXPECT_TRUE(IsLetter(U'a'));
  EXPECT_TRUE(IsLetter(0xE9));    // é
  EXPECT_TRUE(IsLetter(0x4E2D));  // 中
  EXPECT_TRUE(IsLetter(0x3042));  // あ
  EXPECT_FALSE(IsLetter(0x301));  // Combining acute: Mn.
  EXPECT_FALSE(IsLetter(0x1F600));
  EXPECT_TRUE(IsNumber(U'7'));
  EXPECT_TRUE(IsNumber(0x0663));  // Arabic-Indic three.
  EXPECT_TRUE(IsNumber(0x00BD));  // ½ (No).
  EXPECT_TRUE(IsNumber(0x2167));  // Roman numeral eight (Nl).
  EXPECT_FALSE(IsNumber(U'a'));
  for (char32_t c : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028,
                     0x2029, 0x202F, 0x205F, 0x3000}) {
    EXPECT_TRUE(IsWhiteSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {0x1C, 0x1F, 0x200B, 0x180E, 0xFEFF, 0x41}) {
    EXPECT_FALSE(IsWhiteSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_EQ(CanonicalCombiningClass(0x301), 230);
  EXPECT_EQ(CanonicalCombiningClass(0x323), 220);
  EXPECT_EQ(CanonicalCombiningClass(U'a'), 0);
}

TEST(NfcTest, HandPickedCases) {
  EXPECT_EQ(NfcNormalize("e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(NfcNormalize("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(NfcNormalize("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"),  // Jamo H+A+N -> 한
            "\xED\x95\x9C");
  EXPECT_EQ(NfcNormalize("\xE2\x84\xAB"), "\xC3\x85");  // Angstrom sign -> Å
  // q + dot below + dot above: reordered, nothing composes with q.
  EXPECT_EQ(NfcNormalize("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
  // s + dot above + dot below -> U+1E69.
  EXPECT_EQ(NfcNormalize("s\xCC\x87\xCC\xA3"), "\xE1\xB9\xA9");
  EXPECT_EQ(NfcNormalize("\xCC\x81"
                         "a"),
            "\xCC\x81"
            "a");  // Leading combining mark.
  EXPECT_EQ(NfcNormalize("plain ascii"), "plain ascii");
  EXPECT_EQ(NfcNormalize(""), "");
}

std::u32string ParseHexSequence(absl::string_view field) {
  std::u32string out;
  for (absl::string_view hex : absl::StrSplit(field, '.')) {
    uint32_t cp = 0;
    EXPECT_TRUE(absl::SimpleHexAtoi(hex, &cp)) << hex;
    out.push_back(cp);
  }
  return out;
}

// testdata/nfc_cases.txt: unicodedata.normalize("NFC", ...) of every
// canonically decomposable or combining code point, its NFD form, and random
// base + mark sequences (gen_unicode_tables.py --nfc_testdata).
TEST(NfcTest, MatchesPythonUnicodedata) {
  std::ifstream in("common/tokenizer/testdata/nfc_cases.txt");
  ASSERT_TRUE(in.good());
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    ASSERT_EQ(fields.size(), 2u) << line;
    const std::string input = CodepointsToUtf8(ParseHexSequence(fields[0]));
    const std::string expected = CodepointsToUtf8(ParseHexSequence(fields[1]));
    EXPECT_EQ(NfcNormalize(input), expected) << line;
    ++checked;
  }
  EXPECT_GT(checked, 5000);
}

}  // namespace
}  // namespace trident::tokenizer
