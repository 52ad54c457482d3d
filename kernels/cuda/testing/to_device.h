// Copies for GPU tests: a host vector into new device memory (the caller
// frees it with cudaFree), failing the test where CUDA fails.

#ifndef TRIDENT_KERNELS_CUDA_TESTING_TO_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_TESTING_TO_DEVICE_H_

#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"

namespace trident::kernels::cuda::testing {

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_TO_DEVICE_H_
