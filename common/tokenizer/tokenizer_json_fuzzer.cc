// Fuzzes Tokenizer::FromJson with arbitrary tokenizer.json bytes; whatever
// loads must encode, decode and stream-decode a fixed string without crashing,
// and streaming must agree with Decode().

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trident::tokenizer::IncrementalDecoder;
  using trident::tokenizer::Tokenizer;
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromJson(json, "", "fuzz.json");
  if (!tokenizer.ok()) return 0;
  const Tokenizer& t = **tokenizer;
  static constexpr absl::string_view kText =
      "Hello, world! I'm 12345 caf\xC3\xA9 e\xCC\x81 \xE4\xB8\xAD\xF0\x9F\x98\x80 \xFF<s>\n\n  x";
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.Encode(kText, special);
    for (bool skip : {false, true}) {
      absl::StatusOr<std::string> text = t.Decode(ids, skip);
      if (!text.ok()) continue;  // An id from the post-processor may lack a token.
      IncrementalDecoder stream(t, skip);
      std::string streamed;
      bool ok = true;
      for (int32_t id : ids) {
        absl::StatusOr<std::string> delta = stream.Push(id);
        if (!delta.ok()) {
          ok = false;
          break;
        }
        streamed += *delta;
      }
      streamed += stream.Finish();
      if (ok && streamed != *text) std::abort();
    }
  }
  return 0;
}
