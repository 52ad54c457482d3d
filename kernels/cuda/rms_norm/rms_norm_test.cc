#include "kernels/cuda/rms_norm/rms_norm.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/rms_norm/rms_norm.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr float kEps = 1e-5f;

// A device allocation of n elements of T, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    error_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), (n + 1) * sizeof(T));
  }
  ~DeviceArray() { cudaFree(ptr_); }
  bool ok() const { return error_ == cudaSuccess; }
  T* get() const { return ptr_; }
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>& host) {
    host.resize(n_);
    return cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
  cudaError_t error_;
};

// bf16 output of fp32 math: rounding to bf16 costs at most half an ulp, 2^-8
// of the value, and the fp32 math may differ from the CPU's by a few fp32 ulps
// (sum order): tolerance (2^-8 + 2^-15) relative.
float Tolerance(float expected) {
  return std::abs(expected) * (1.0f / 256 + 1.0f / 32768) + 1e-30f;
}

// Checks rows x dim bf16 values (row stride `stride`) against fp32 `expected`
// (rows contiguous).
void ExpectBf16Near(const std::vector<uint16_t>& got, int64_t stride,
                    const std::vector<float>& expected, int64_t rows, int64_t dim) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      const float g = numeric::Bf16ToFloat(got[r * stride + i]);
      const float e = expected[r * dim + i];
      if (!(std::abs(g - e) <= Tolerance(e))) {
        if (++bad <= 5) {
          ADD_FAILURE() << "row " << r << " element " << i << ": got " << g << ", want " << e
                        << " +- " << Tolerance(e);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

// Random bf16 bits with values ~ N(0, sigma), and their fp32 widening.
void RandomBf16(std::mt19937& rng, float sigma, size_t n, std::vector<uint16_t>& bits,
                std::vector<float>& widened) {
  std::normal_distribution<float> normal(0.0f, sigma);
  bits.resize(n);
  widened.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = numeric::FloatToBf16(normal(rng));
    widened[i] = numeric::Bf16ToFloat(bits[i]);
  }
}

std::vector<float> RandomWeights(std::mt19937& rng, int64_t dim) {
  std::normal_distribution<float> normal(1.0f, 0.2f);
  std::vector<float> w(dim);
  // As loaded from a bf16 checkpoint.
  for (float& x : w) x = numeric::Bf16ToFloat(numeric::FloatToBf16(normal(rng)));
  return w;
}

struct Case {
  int64_t dim;
  int64_t rows;
  int64_t pad;  // Added to every row stride (0: contiguous rows).
};

class RmsNormTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {
 protected:
  Case GetCase() const {
    const auto [dim, rows, pad] = GetParam();
    const Case c{dim, rows, pad};
    std::printf("seed %u, dim %lld, rows %lld, stride pad %lld\n", kSeed,
                static_cast<long long>(c.dim), static_cast<long long>(c.rows),
                static_cast<long long>(c.pad));
    return c;
  }
  static constexpr uint32_t kSeed = 20240607;
};

TEST_P(RmsNormTest, AddRmsNormMatchesCpu) {
  const Case c = GetCase();
  std::mt19937 rng(kSeed);
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.rows * stride);
  std::vector<uint16_t> delta_bits;
  std::vector<float> delta_f;
  RandomBf16(rng, 1.0f, n, delta_bits, delta_f);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> residual(n);
  for (float& x : residual) x = normal(rng);
  const std::vector<float> weight = RandomWeights(rng, c.dim);

  // CPU on contiguous copies.
  std::vector<float> cpu_residual(c.rows * c.dim), cpu_delta(c.rows * c.dim),
      expected(c.rows * c.dim);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) {
      cpu_residual[r * c.dim + i] = residual[r * stride + i];
      cpu_delta[r * c.dim + i] = delta_f[r * stride + i];
    }
  }
  cpu::AddRmsNorm(cpu_residual.data(), cpu_delta.data(), weight.data(), c.rows, c.dim, kEps,
                  expected.data());

  DeviceArray<float> d_residual(n), d_weight(c.dim);
  DeviceArray<uint16_t> d_delta(n), d_out(n);
  ASSERT_TRUE(d_residual.ok() && d_weight.ok() && d_delta.ok() && d_out.ok());
  ASSERT_EQ(d_residual.Upload(residual), cudaSuccess);
  ASSERT_EQ(d_weight.Upload(weight), cudaSuccess);
  ASSERT_EQ(d_delta.Upload(delta_bits), cudaSuccess);
  ASSERT_THAT(LaunchAddRmsNorm({.residual = d_residual.get(),
                                .residual_stride = stride,
                                .delta = d_delta.get(),
                                .delta_stride = stride,
                                .weight = d_weight.get(),
                                .out = d_out.get(),
                                .out_stride = stride,
                                .rows = c.rows,
                                .dim = c.dim,
                                .eps = kEps},
                               nullptr),
              IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got_residual;
  std::vector<uint16_t> got_out;
  ASSERT_EQ(d_residual.Download(got_residual), cudaSuccess);
  ASSERT_EQ(d_out.Download(got_out), cudaSuccess);
  // One fp32 addition each: bit-identical to the CPU. Padding untouched.
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < stride; ++i) {
      const float want = i < c.dim ? cpu_residual[r * c.dim + i] : residual[r * stride + i];
      ASSERT_EQ(got_residual[r * stride + i], want) << "residual row " << r << " element " << i;
    }
  }
  ExpectBf16Near(got_out, stride, expected, c.rows, c.dim);
}

TEST_P(RmsNormTest, AddRmsNormReplaceResidualAndInPlaceOut) {
  const Case c = GetCase();
  std::mt19937 rng(kSeed + 1);
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.rows * stride);
  std::vector<uint16_t> delta_bits;
  std::vector<float> delta_f;
  RandomBf16(rng, 0.05f, n, delta_bits, delta_f);
  const std::vector<float> weight = RandomWeights(rng, c.dim);
  std::vector<float> cpu_delta(c.rows * c.dim), expected(c.rows * c.dim);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) cpu_delta[r * c.dim + i] = delta_f[r * stride + i];
  }
  cpu::RmsNorm(cpu_delta.data(), weight.data(), c.rows, c.dim, kEps, expected.data());

  DeviceArray<float> d_residual(n), d_weight(c.dim);
  DeviceArray<uint16_t> d_delta(n);
  ASSERT_TRUE(d_residual.ok() && d_weight.ok() && d_delta.ok());
  // NaN garbage in the residual: replace_residual must not read it.
  ASSERT_EQ(cudaMemset(d_residual.get(), 0xff, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(d_weight.Upload(weight), cudaSuccess);
  ASSERT_EQ(d_delta.Upload(delta_bits), cudaSuccess);
  ASSERT_THAT(LaunchAddRmsNorm({.residual = d_residual.get(),
                                .residual_stride = stride,
                                .delta = d_delta.get(),
                                .delta_stride = stride,
                                .replace_residual = true,
                                .weight = d_weight.get(),
                                .out = d_delta.get(),  // In place over delta.
                                .out_stride = stride,
                                .rows = c.rows,
                                .dim = c.dim,
                                .eps = kEps},
                               nullptr),
              IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got_residual;
  std::vector<uint16_t> got_out;
  ASSERT_EQ(d_residual.Download(got_residual), cudaSuccess);
  ASSERT_EQ(d_delta.Download(got_out), cudaSuccess);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) {
      ASSERT_EQ(got_residual[r * stride + i], cpu_delta[r * c.dim + i])
          << "residual row " << r << " element " << i;
    }
  }
  ExpectBf16Near(got_out, stride, expected, c.rows, c.dim);
}

TEST_P(RmsNormTest, RmsNormFromF32AndBf16MatchesCpu) {
  const Case c = GetCase();
  std::mt19937 rng(kSeed + 2);
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.rows * stride);
  std::vector<uint16_t> x_bits;
  std::vector<float> x_f;  // bf16-representable, so both dtypes see equal inputs.
  RandomBf16(rng, 2.0f, n, x_bits, x_f);
  const std::vector<float> weight = RandomWeights(rng, c.dim);
  std::vector<float> cpu_x(c.rows * c.dim), expected(c.rows * c.dim);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) cpu_x[r * c.dim + i] = x_f[r * stride + i];
  }
  cpu::RmsNorm(cpu_x.data(), weight.data(), c.rows, c.dim, kEps, expected.data());

  DeviceArray<float> d_xf(n), d_weight(c.dim);
  DeviceArray<uint16_t> d_xb(n), d_out(n);
  ASSERT_TRUE(d_xf.ok() && d_weight.ok() && d_xb.ok() && d_out.ok());
  ASSERT_EQ(d_xf.Upload(x_f), cudaSuccess);
  ASSERT_EQ(d_xb.Upload(x_bits), cudaSuccess);
  ASSERT_EQ(d_weight.Upload(weight), cudaSuccess);
  for (const numeric::DType dtype : {numeric::DType::kF32, numeric::DType::kBF16}) {
    SCOPED_TRACE(numeric::DTypeName(dtype));
    ASSERT_EQ(cudaMemset(d_out.get(), 0, n * 2), cudaSuccess);
    const void* x = dtype == numeric::DType::kF32 ? static_cast<const void*>(d_xf.get())
                                                  : static_cast<const void*>(d_xb.get());
    ASSERT_THAT(LaunchRmsNorm({.x = x,
                               .x_dtype = dtype,
                               .x_stride = stride,
                               .weight = d_weight.get(),
                               .out = d_out.get(),
                               .out_stride = stride,
                               .rows = c.rows,
                               .dim = c.dim,
                               .eps = kEps},
                              nullptr),
                IsOk());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> got;
    ASSERT_EQ(d_out.Download(got), cudaSuccess);
    ExpectBf16Near(got, stride, expected, c.rows, c.dim);
  }
}

// Hidden sizes of small test models and Llama-3-8B / 13B-class models, plus
// dims that force the scalar path (not a multiple of 4); odd row counts;
// contiguous rows, and padded strides (4: still vectorized; 1: scalar path).
INSTANTIATE_TEST_SUITE_P(Contiguous, RmsNormTest,
                         ::testing::Combine(::testing::Values(64, 128, 4096, 5120, 7, 4098),
                                            ::testing::Values(1, 3, 257), ::testing::Values(0)));
INSTANTIATE_TEST_SUITE_P(Strided, RmsNormTest,
                         ::testing::Combine(::testing::Values(128, 5120), ::testing::Values(3),
                                            ::testing::Values(1, 4)));

// A chain of norms, each reading the one ahead's output, launched with
// programmatic dependent launch (scheduled before the one ahead ends, waiting
// for it at its first instruction): the same bits as plain launches. A norm
// that did not wait would read rows the one ahead had not written yet.
TEST(RmsNormPdlTest, EachWaitsForTheNormAhead) {
  constexpr int64_t kRows = 2048;
  constexpr int64_t kDim = 4096;
  constexpr int kChain = 8;
  constexpr uint32_t kSeed = 20261129;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  const size_t n = static_cast<size_t>(kRows * kDim);
  std::vector<uint16_t> x_bits;
  std::vector<float> x_f;
  RandomBf16(rng, 2.0f, n, x_bits, x_f);
  const std::vector<float> weight = RandomWeights(rng, kDim);
  DeviceArray<float> d_weight(kDim);
  DeviceArray<uint16_t> d_x(n), d_ping(n), d_pong(n);
  ASSERT_TRUE(d_weight.ok() && d_x.ok() && d_ping.ok() && d_pong.ok());
  ASSERT_EQ(d_weight.Upload(weight), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<uint16_t> results[2];
  for (const bool pdl : {false, true}) {
    ASSERT_EQ(d_x.Upload(x_bits), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_ping.get(), 0, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_pong.get(), 0, n * 2), cudaSuccess);
    const uint16_t* in = d_x.get();
    for (int i = 0; i < kChain; ++i) {
      uint16_t* out = i % 2 == 0 ? d_ping.get() : d_pong.get();
      ASSERT_THAT(LaunchRmsNorm({.x = in,
                                 .x_dtype = numeric::DType::kBF16,
                                 .x_stride = kDim,
                                 .weight = d_weight.get(),
                                 .out = out,
                                 .out_stride = kDim,
                                 .rows = kRows,
                                 .dim = kDim,
                                 .eps = kEps,
                                 .pdl = pdl},
                                stream),
                  IsOk());
      in = out;
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ((kChain % 2 == 1 ? d_ping : d_pong).Download(results[pdl ? 1 : 0]), cudaSuccess);
  }
  cudaStreamDestroy(stream);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += results[0][i] != results[1][i];
  EXPECT_EQ(differ, 0u) << "of " << n << " elements";
}

TEST(RmsNormArgsTest, RejectsBadArguments) {
  alignas(16) char dummy[64];
  const float* w = reinterpret_cast<const float*>(dummy);
  const RmsNormArgs good{
      .x = dummy, .x_stride = 4, .weight = w, .out = dummy, .out_stride = 4, .rows = 1, .dim = 4};
  RmsNormArgs bad = good;
  bad.rows = -1;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("rows")));
  bad = good;
  bad.dim = 0;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("dim")));
  bad = good;
  bad.x_stride = 3;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("x_stride")));
  bad = good;
  bad.eps = NAN;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("eps")));
  bad = good;
  bad.x_dtype = numeric::DType::kF16;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("x_dtype")));
  bad = good;
  bad.weight = nullptr;
  EXPECT_THAT(LaunchRmsNorm(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));

  float* res = reinterpret_cast<float*>(dummy);
  const AddRmsNormArgs add{.residual = res,
                           .residual_stride = 4,
                           .delta = dummy,
                           .delta_stride = 4,
                           .weight = w,
                           .out = dummy,
                           .out_stride = 4,
                           .rows = 1,
                           .dim = 4};
  AddRmsNormArgs bad_add = add;
  bad_add.delta_stride = 2;
  EXPECT_THAT(LaunchAddRmsNorm(bad_add, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("delta_stride")));
  bad_add = add;
  bad_add.residual = nullptr;
  EXPECT_THAT(LaunchAddRmsNorm(bad_add, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));
  bad_add = add;
  bad_add.eps = -1.0f;
  EXPECT_THAT(LaunchAddRmsNorm(bad_add, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("eps")));
}

}  // namespace
}  // namespace trident::kernels::cuda
