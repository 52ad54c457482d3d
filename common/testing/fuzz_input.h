#ifndef TRIDENT_COMMON_TESTING_FUZZ_INPUT_H_
#define TRIDENT_COMMON_TESTING_FUZZ_INPUT_H_

// Reads a fuzz target's input front to back as integers and byte strings.
// Past the end every read yields zeros (or an empty string), so a target
// never has to check lengths itself and short inputs stay meaningful.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace trident::testing {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : bytes_(reinterpret_cast<const char*>(data), size) {}

  // The next sizeof(T) bytes, little-endian; missing bytes read as 0.
  template <typename T>
  T Take() {
    static_assert(std::is_integral_v<T>);
    uint8_t raw[sizeof(T)] = {};
    const size_t n = bytes_.size() < sizeof(T) ? bytes_.size() : sizeof(T);
    std::memcpy(raw, bytes_.data(), n);
    bytes_.remove_prefix(n);
    std::make_unsigned_t<T> value = 0;
    for (size_t i = sizeof(T); i-- > 0;)
      value = static_cast<decltype(value)>((value << 8) | raw[i]);
    return static_cast<T>(value);
  }

  // The next `n` bytes, or all that remain when fewer do.
  absl::string_view TakeBytes(size_t n) {
    const absl::string_view taken = bytes_.substr(0, n);
    bytes_.remove_prefix(taken.size());
    return taken;
  }

  // A chunk prefixed by a one-byte length.
  absl::string_view TakeChunk() { return TakeBytes(Take<uint8_t>()); }

  // Everything that remains.
  absl::string_view TakeRest() { return TakeBytes(bytes_.size()); }

  size_t remaining() const { return bytes_.size(); }

 private:
  absl::string_view bytes_;
};

}  // namespace trident::testing

#endif  // TRIDENT_COMMON_TESTING_FUZZ_INPUT_H_
