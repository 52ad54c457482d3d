#include "common/backend/kv_copier.h"

#include "absl/strings/str_cat.h"

namespace trident::backend {

absl::Status CheckKvRanges(absl::Span<const KvRange> ranges, uint64_t pool_bytes) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const KvRange& r = ranges[i];
    if (r.length_bytes == 0 || r.offset_bytes > pool_bytes ||
        r.length_bytes > pool_bytes - r.offset_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranges[", i, "]: ", r.length_bytes, " bytes at offset ", r.offset_bytes,
                       " is empty or outside the KV pool of ", pool_bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

uint64_t TotalBytes(absl::Span<const KvRange> ranges) {
  uint64_t total = 0;
  for (const KvRange& r : ranges) total += r.length_bytes;
  return total;
}

}  // namespace trident::backend
