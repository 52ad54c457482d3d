#include "services/attention/kv_store/arena_kv_pool.h"

#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::attention {

absl::StatusOr<KvSpan> ArenaKvPool::Allocate(size_t bytes) {
  TRIDENT_ASSIGN_OR_RETURN(numa::ByteRange range,
                           arena_->Allocate(static_cast<int64_t>(bytes)));
  return KvSpan{arena_->Pointer(range), static_cast<size_t>(range.length)};
}

void ArenaKvPool::Free(KvSpan span) {
  if (span.data == nullptr) return;
  const numa::ByteRange range{
      .offset = span.data - static_cast<char*>(arena_->base()),
      .length = static_cast<int64_t>(span.bytes)};
  TRIDENT_CHECK_OK(arena_->Free(range));
}

}  // namespace trident::attention
