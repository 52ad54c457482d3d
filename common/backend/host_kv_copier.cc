#include "common/backend/host_kv_copier.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace trident::backend {

absl::StatusOr<std::unique_ptr<HostKvCopier>> HostKvCopier::Create(const KvMemory& memory) {
  if (memory.device || memory.base == nullptr) {
    return absl::InvalidArgumentError(
        "HostKvCopier needs a KV pool in host memory (KvMemory.device false, base set)");
  }
  return std::unique_ptr<HostKvCopier>(
      new HostKvCopier(static_cast<char*>(memory.base), memory.bytes));
}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostKvCopier::AllocateHost(size_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("AllocateHost of 0 bytes");
  constexpr size_t kAlign = 4096;
  void* data = std::aligned_alloc(kAlign, (size_bytes + kAlign - 1) / kAlign * kAlign);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size_bytes, " bytes of host staging memory"));
  }
  return std::make_unique<HostBuffer>(data, size_bytes, [](void* p) { std::free(p); });
}

absl::Status HostKvCopier::CopyToHost(absl::Span<const KvRange> ranges, void* dst) {
  TRIDENT_RETURN_IF_ERROR(CheckKvRanges(ranges, bytes_));
  char* out = static_cast<char*>(dst);
  for (const KvRange& r : ranges) {
    std::memcpy(out, base_ + r.offset_bytes, r.length_bytes);
    out += r.length_bytes;
  }
  absl::MutexLock lock(&mu_);
  ++copies_to_host_;
  return absl::OkStatus();
}

absl::Status HostKvCopier::CopyFromHost(const void* src, absl::Span<const KvRange> ranges) {
  TRIDENT_RETURN_IF_ERROR(CheckKvRanges(ranges, bytes_));
  const char* in = static_cast<const char*>(src);
  for (const KvRange& r : ranges) {
    std::memcpy(base_ + r.offset_bytes, in, r.length_bytes);
    in += r.length_bytes;
  }
  absl::MutexLock lock(&mu_);
  ++copies_from_host_;
  return absl::OkStatus();
}

int64_t HostKvCopier::copies_to_host() const {
  absl::MutexLock lock(&mu_);
  return copies_to_host_;
}

int64_t HostKvCopier::copies_from_host() const {
  absl::MutexLock lock(&mu_);
  return copies_from_host_;
}

}  // namespace trident::backend
