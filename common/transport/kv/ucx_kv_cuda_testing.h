// A testing::TestPool in CUDA device memory with a CudaKvCopier, for the
// GPU tests and benchmarks of UcxKv's staged path.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_CUDA_TESTING_H_
#define TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_CUDA_TESTING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/ucx_kv_testing.h"

namespace trident::transport::testing {

// A pool of spec.TotalBytes() on `device`, whose copiers copy in with
// `copier_options`. FAILED_PRECONDITION when it cannot be allocated (no GPU).
absl::StatusOr<std::unique_ptr<TestPool>> NewCudaTestPool(
    const kv::KvCacheSpec& spec, int32_t device, backend::CudaKvCopierOptions copier_options = {});

}  // namespace trident::transport::testing

#endif  // TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_CUDA_TESTING_H_
