#include "services/attention/kv_store/heap_kv_pool.h"

#include <cstdlib>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trident::attention {
namespace {

constexpr size_t kAlignment = 4096;

size_t RoundUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

absl::StatusOr<KvSpan> HeapKvPool::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a KV range of 0 bytes was asked for");
  const size_t granted = RoundUp(bytes);
  {
    absl::MutexLock lock(&mu_);
    if (granted > capacity_ - used_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV memory budget exhausted: ", granted, " bytes asked, ",
                       capacity_ - used_, " of ", capacity_, " free"));
    }
    used_ += granted;
  }
  void* data = std::aligned_alloc(kAlignment, granted);
  if (data == nullptr) {
    absl::MutexLock lock(&mu_);
    used_ -= granted;
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for ", granted, " bytes"));
  }
  return KvSpan{static_cast<char*>(data), granted};
}

void HeapKvPool::Free(KvSpan span) {
  if (span.data == nullptr) return;
  std::free(span.data);
  absl::MutexLock lock(&mu_);
  used_ -= span.bytes;
}

size_t HeapKvPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace trident::attention
