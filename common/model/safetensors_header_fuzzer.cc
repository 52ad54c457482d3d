// Feeds arbitrary bytes to ParseSafetensorsHeader as a whole file. When a
// header parses, checks the invariants callers rely on (the tensors tile the
// data section, every range lies inside the input) and reads every byte of
// every tensor, so ASan catches any range the parser should have rejected.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<trident::model::SafetensorsHeader> header =
      trident::model::ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (!header.ok()) {
    // Every rejection names the file.
    if (header.status().message().find("fuzz.safetensors") == absl::string_view::npos) abort();
    return 0;
  }
  if (header->data_offset != 8 + header->header_bytes ||
      header->data_offset + header->data_bytes != size) {
    abort();
  }
  uint64_t covered = 0;
  uint8_t checksum = 0;
  for (const trident::model::SafetensorsTensor& t : header->tensors) {
    if (t.data_begin > t.data_end || t.data_end > header->data_bytes) abort();
    covered += t.num_bytes();
    for (uint64_t i = header->data_offset + t.data_begin; i < header->data_offset + t.data_end;
         ++i) {
      checksum ^= data[i];
    }
  }
  if (covered != header->data_bytes) abort();
  // Keep the reads from being optimized away.
  volatile uint8_t sink = checksum;
  (void)sink;
  return 0;
}
