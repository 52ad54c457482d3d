#include "common/transport/kv/ucx_kv_cuda_testing.h"

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trident::transport::testing {
namespace {

class CudaTestPool final : public TestPool {
 public:
  CudaTestPool(const kv::KvCacheSpec& spec, int32_t device, void* base,
               backend::CudaKvCopierOptions options)
      : spec_(spec), device_(device), base_(base), options_(options) {}
  ~CudaTestPool() override {
    cudaSetDevice(device_);
    cudaFree(base_);
  }
  backend::KvMemory memory() const override {
    backend::KvMemory m;
    m.base = base_;
    m.bytes = spec_.TotalBytes();
    m.spec = spec_;
    m.usable_blocks = spec_.num_blocks;
    m.device = true;
    m.device_ordinal = device_;
    return m;
  }
  void Fill(const std::vector<uint8_t>& bytes) override {
    cudaSetDevice(device_);
    ASSERT_EQ(cudaMemcpy(base_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> Contents() const override {
    cudaSetDevice(device_);
    std::vector<uint8_t> out(spec_.TotalBytes());
    EXPECT_EQ(cudaMemcpy(out.data(), base_, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  absl::StatusOr<std::unique_ptr<backend::KvCopier>> NewCopier() const override {
    auto copier = backend::CudaKvCopier::Create(memory(), options_);
    if (!copier.ok()) return copier.status();
    return std::unique_ptr<backend::KvCopier>(std::move(*copier));
  }

 private:
  const kv::KvCacheSpec spec_;
  const int32_t device_;
  void* const base_;
  const backend::CudaKvCopierOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TestPool>> NewCudaTestPool(
    const kv::KvCacheSpec& spec, int32_t device, backend::CudaKvCopierOptions copier_options) {
  void* base = nullptr;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaMalloc(&base, spec.TotalBytes());
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cannot allocate ", spec.TotalBytes(),
                                                      " bytes on CUDA device ", device, ": ",
                                                      cudaGetErrorString(err)));
  }
  return std::unique_ptr<TestPool>(new CudaTestPool(spec, device, base, copier_options));
}

}  // namespace trident::transport::testing
