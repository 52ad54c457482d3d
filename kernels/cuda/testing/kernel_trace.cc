#include "kernels/cuda/testing/kernel_trace.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trident::kernels::cuda::testing {
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

std::atomic<bool> running{false};
std::mutex mu;
std::vector<KernelRecord> collected;  // guarded by mu

absl::Status Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  return absl::InternalError(absl::StrCat(what, ": ", text != nullptr ? text : "CUPTI error"));
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    collected.push_back({kernel->name != nullptr ? kernel->name : "?", kernel->start, kernel->end});
  }
  std::free(buffer);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  if (running.exchange(true)) return absl::FailedPreconditionError("a kernel trace is running");
  {
    std::lock_guard<std::mutex> lock(mu);
    collected.clear();
  }
  absl::Status s = Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
                         "cuptiActivityRegisterCallbacks");
  if (s.ok()) {
    s = Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  }
  if (!s.ok()) {
    running = false;
    return s;
  }
  return std::unique_ptr<KernelTrace>(new KernelTrace());
}

uint64_t KernelTrace::Now() const {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Stop() {
  if (stopped_) return absl::FailedPreconditionError("the trace was stopped");
  stopped_ = true;
  absl::Status s =
      Check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  const absl::Status flushed = Check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  if (s.ok()) s = flushed;
  std::vector<KernelRecord> records;
  {
    std::lock_guard<std::mutex> lock(mu);
    records.swap(collected);
  }
  running = false;
  if (!s.ok()) return s;
  return records;
}

KernelTrace::~KernelTrace() {
  if (!stopped_) Stop().IgnoreError();
}

}  // namespace trident::kernels::cuda::testing
