#include "common/tokenizer/byte_level.h"

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/tokenizer/unicode.h"

namespace trident::tokenizer {
namespace {

bool IsPrintableByte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Maps {
  std::array<char32_t, 256> to_unicode;
  std::array<uint8_t, 256> order;
  std::array<std::string, 256> utf8;
  std::array<int16_t, 256 + 68> from_unicode;
};

const Maps& GetMaps() {
  static const Maps* const maps = [] {
    auto* m = new Maps();
    int n = 0;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      if (IsPrintableByte(b)) {
        m->to_unicode[b] = static_cast<char32_t>(b);
        m->order[next++] = static_cast<uint8_t>(b);
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (!IsPrintableByte(b)) {
        m->to_unicode[b] = static_cast<char32_t>(256 + n++);
        m->order[next++] = static_cast<uint8_t>(b);
      }
    }
    m->from_unicode.fill(-1);
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(m->to_unicode[b], &m->utf8[b]);
      m->from_unicode[m->to_unicode[b]] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return *maps;
}

}  // namespace

char32_t ByteToUnicode(uint8_t b) { return GetMaps().to_unicode[b]; }

int UnicodeToByte(char32_t c) {
  const Maps& m = GetMaps();
  return c < m.from_unicode.size() ? m.from_unicode[c] : -1;
}

const std::array<uint8_t, 256>& ByteLevelOrder() { return GetMaps().order; }

std::string BytesToByteLevel(absl::string_view bytes) {
  const Maps& m = GetMaps();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += m.utf8[b];
  return out;
}

}  // namespace trident::tokenizer
