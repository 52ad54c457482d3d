#include "kernels/cpu/linear/linear.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/numeric/dtype.h"
#include "dnnl.hpp"

namespace trident::kernels::cpu {
namespace {

using Tag = dnnl::memory::format_tag;
using Dt = dnnl::memory::data_type;

// The m whose preferred weight layout the weights are packed into. Every other
// m reuses that layout; an m whose primitive rejects it falls back to a
// runtime-m gemm over a second copy (see PrimitiveFor).
constexpr int64_t kPackingM = 128;
// Primitive cache bound: the engine sees few distinct m per layer in steady
// state (batch sizes, chunk sizes); past this the cache starts over.
constexpr size_t kMaxCachedPrimitives = 64;
// Below this many elements converting x to bf16 stays on one thread.
constexpr int64_t kMinParallelConvert = 1 << 16;

const dnnl::engine& CpuEngine() {
  static const dnnl::engine* const engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// CPU streams are cheap; one per thread keeps Forward free of shared state.
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

Dt ToDnnl(numeric::DType t) { return t == numeric::DType::kBF16 ? Dt::bf16 : Dt::f32; }

dnnl::matmul::primitive_desc MatmulPd(int64_t m, int64_t k, int64_t n, Dt compute,
                                      const dnnl::memory::desc& weights, bool bias) {
  const dnnl::memory::desc src({m, k}, compute, Tag::ab);
  const dnnl::memory::desc dst({m, n}, Dt::f32, Tag::ab);
  const dnnl::memory::desc bias_md =
      bias ? dnnl::memory::desc({1, n}, Dt::f32, Tag::ab) : dnnl::memory::desc();
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, bias_md, dst), CpuEngine(),
                                      /*allow_empty=*/true);
}

// x = hi + lo with hi = bf16(x) and lo = bf16(x - hi): two bf16 terms carry
// about 16 bits of x's mantissa. Without `lo`, x is only rounded.
void SplitToBf16(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  const int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n >= kMinParallelConvert)
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(begin + chunk, n);
    for (int64_t i = begin; i < end; ++i) {
      hi[i] = numeric::FloatToBf16(x[i]);
      if (lo != nullptr) lo[i] = numeric::FloatToBf16(x[i] - numeric::Bf16ToFloat(hi[i]));
    }
  }
}

}  // namespace

struct Linear::Impl {
  int64_t in_features = 0;
  int64_t out_features = 0;
  numeric::DType compute_dtype = numeric::DType::kF32;
  bool has_bias = false;
  dnnl::memory::desc packed_weights_desc;
  dnnl::memory weights;  // Pre-packed.
  dnnl::memory bias;     // [1, out_features] f32; empty without bias.

  struct Cached {
    dnnl::matmul primitive;
    const dnnl::memory* weights = nullptr;  // `weights` or `fallback_weights`.
    std::string impl_name;                  // oneDNN's, e.g. "brg:avx512_core_amx".
  };
  std::unordered_map<int64_t, Cached> primitives;
  std::vector<uint16_t> bf16_scratch;
  std::vector<float> f32_scratch;
  std::vector<float> bias_values;
  bool split_activations = false;

  // For an m whose fixed-size primitive rejects the packed layout: a runtime-m
  // primitive over a second copy of the weights in the layout it wants, made on
  // first need.
  dnnl::matmul fallback_primitive;
  dnnl::memory fallback_weights;
  std::string fallback_impl_name;

  const Cached& PrimitiveFor(int64_t m);
};

const Linear::Impl::Cached& Linear::Impl::PrimitiveFor(int64_t m) {
  auto it = primitives.find(m);
  if (it != primitives.end()) return it->second;
  if (primitives.size() >= kMaxCachedPrimitives) primitives.clear();
  const Dt compute = ToDnnl(compute_dtype);
  Cached cached;
  dnnl::matmul::primitive_desc pd =
      MatmulPd(m, in_features, out_features, compute, packed_weights_desc, has_bias);
  if (pd) {
    cached.primitive = dnnl::matmul(pd);
    cached.weights = &weights;
    cached.impl_name = pd.impl_info_str();
  } else {
    if (!fallback_primitive) {
      const dnnl::memory::desc any({in_features, out_features}, compute, Tag::any);
      dnnl::matmul::primitive_desc runtime_pd =
          MatmulPd(DNNL_RUNTIME_DIM_VAL, in_features, out_features, compute, any, has_bias);
      // oneDNN's gemm-based matmul takes a runtime m for f32 and, wherever a
      // bf16 matmul exists at all, for bf16.
      TRIDENT_CHECK(runtime_pd) << "Linear: no runtime-m matmul";
      fallback_primitive = dnnl::matmul(runtime_pd);
      fallback_weights = dnnl::memory(runtime_pd.weights_desc(), CpuEngine());
      dnnl::reorder(weights, fallback_weights).execute(ThreadStream(), weights, fallback_weights);
      ThreadStream().wait();
      fallback_impl_name = absl::StrCat(runtime_pd.impl_info_str(), " (runtime m)");
      TRIDENT_LOG(WARNING) << "Linear " << in_features << "->" << out_features << ": m=" << m
                           << " cannot use the packed weights; keeping a second copy for "
                           << fallback_impl_name;
    }
    cached.primitive = fallback_primitive;
    cached.weights = &fallback_weights;
    cached.impl_name = fallback_impl_name;
  }
  return primitives.emplace(m, std::move(cached)).first->second;
}

Linear::Linear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Linear::~Linear() = default;

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(int64_t in_features, int64_t out_features,
                                                       numeric::DType weight_dtype,
                                                       const void* weight, const float* bias,
                                                       LinearCompute compute) {
  if (in_features <= 0 || out_features <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: in_features ", in_features,
                                                   " and out_features ", out_features,
                                                   " must be positive"));
  }
  if (weight == nullptr) return absl::InvalidArgumentError("Linear: weight is null");
  if (weight_dtype != numeric::DType::kF32 && weight_dtype != numeric::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: weight dtype ",
                                                   numeric::DTypeName(weight_dtype),
                                                   " is not supported (f32, bf16)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->in_features = in_features;
  impl->out_features = out_features;
  impl->has_bias = bias != nullptr;
  if (bias != nullptr) impl->bias_values.assign(bias, bias + out_features);
  try {
    // Weights as a matmul B[k][n] are the transpose of HF's [out][in]: "ba".
    const dnnl::memory::desc any_bf16({in_features, out_features}, Dt::bf16, Tag::any);
    const dnnl::memory::desc any_f32({in_features, out_features}, Dt::f32, Tag::any);
    dnnl::matmul::primitive_desc pd;
    if (weight_dtype == numeric::DType::kBF16 && compute != LinearCompute::kF32) {
      pd = MatmulPd(kPackingM, in_features, out_features, Dt::bf16, any_bf16, impl->has_bias);
      impl->compute_dtype = numeric::DType::kBF16;
      impl->split_activations = compute == LinearCompute::kBf16SplitActivations;
    }
    std::vector<float> widened;
    const void* source = weight;
    if (!pd) {
      if (weight_dtype == numeric::DType::kBF16) {
        // f32 asked for, or no bf16 matmul on this CPU: widen once, exactly.
        widened.resize(static_cast<size_t>(in_features * out_features));
        numeric::Bf16ToFloat(static_cast<const uint16_t*>(weight), widened.data(), widened.size());
        source = widened.data();
      }
      pd = MatmulPd(kPackingM, in_features, out_features, Dt::f32, any_f32, impl->has_bias);
      impl->compute_dtype = numeric::DType::kF32;
    }
    if (!pd) return absl::InternalError("Linear: oneDNN has no f32 matmul for this shape");
    const Dt compute = ToDnnl(impl->compute_dtype);
    impl->packed_weights_desc = pd.weights_desc();
    const dnnl::memory::desc user_md({in_features, out_features}, compute, Tag::ba);
    dnnl::memory user(user_md, CpuEngine(), const_cast<void*>(source));
    impl->weights = dnnl::memory(impl->packed_weights_desc, CpuEngine());
    dnnl::reorder(user, impl->weights).execute(ThreadStream(), user, impl->weights);
    if (bias != nullptr) {
      impl->bias =
          dnnl::memory(dnnl::memory::desc({1, out_features}, Dt::f32, Tag::ab), CpuEngine());
      std::memcpy(impl->bias.get_data_handle(), bias, sizeof(float) * out_features);
    }
    ThreadStream().wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Linear: oneDNN: ", e.what()));
  }
  return std::unique_ptr<Linear>(new Linear(std::move(impl)));
}

void Linear::Forward(const float* x, int64_t m, float* y) const {
  if (m <= 0) return;
  Impl& impl = *impl_;
  if (impl.compute_dtype == numeric::DType::kBF16 && !impl.split_activations) {
    const int64_t n = m * impl.in_features;
    if (impl.bf16_scratch.size() < static_cast<size_t>(n)) impl.bf16_scratch.resize(n);
    SplitToBf16(x, n, impl.bf16_scratch.data(), nullptr);
    Run(impl, m, impl.bf16_scratch.data(), y);
    return;
  }
  if (impl.compute_dtype == numeric::DType::kBF16) {
    // The rows of x are split into bf16 hi and lo halves and multiplied as one
    // batch of 2m rows: y = W·hi + W·lo. The weights are read once, as for m
    // rows, so decode costs the same, while y keeps about 16 bits of x
    // (errors ~2^-17 relative instead of 2^-9 for x rounded to bf16).
    const int64_t n = m * impl.in_features;
    if (impl.bf16_scratch.size() < static_cast<size_t>(2 * n)) impl.bf16_scratch.resize(2 * n);
    SplitToBf16(x, n, impl.bf16_scratch.data(), impl.bf16_scratch.data() + n);
    const int64_t out = impl.out_features;
    if (impl.f32_scratch.size() < static_cast<size_t>(2 * m * out)) {
      impl.f32_scratch.resize(2 * m * out);
    }
    Run(impl, 2 * m, impl.bf16_scratch.data(), impl.f32_scratch.data());
    const float* hi = impl.f32_scratch.data();
    const float* lo = hi + m * out;
    const float* bias = impl.has_bias ? impl.bias_values.data() : nullptr;
#pragma omp parallel for schedule(static) if (m * out >= kMinParallelConvert)
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < out; ++j) {
        // The bias was added to both halves.
        const int64_t i = r * out + j;
        y[i] = bias != nullptr ? (hi[i] - bias[j]) + lo[i] : hi[i] + lo[i];
      }
    }
    return;
  }
  Run(impl, m, const_cast<float*>(x), y);
}

void Linear::Run(Impl& impl, int64_t m, void* src, float* y) {
  const Impl::Cached& cached = impl.PrimitiveFor(m);
  const Dt compute = ToDnnl(impl.compute_dtype);
  const dnnl::memory src_mem(dnnl::memory::desc({m, impl.in_features}, compute, Tag::ab),
                             CpuEngine(), src);
  const dnnl::memory dst_mem(dnnl::memory::desc({m, impl.out_features}, Dt::f32, Tag::ab),
                             CpuEngine(), y);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, *cached.weights}, {DNNL_ARG_DST, dst_mem}};
  if (impl.has_bias) args.emplace(DNNL_ARG_BIAS, impl.bias);
  dnnl::stream& stream = ThreadStream();
  cached.primitive.execute(stream, args);
  stream.wait();
}

int64_t Linear::in_features() const { return impl_->in_features; }
int64_t Linear::out_features() const { return impl_->out_features; }
numeric::DType Linear::compute_dtype() const { return impl_->compute_dtype; }
size_t Linear::packed_weight_bytes() const { return impl_->weights.get_desc().get_size(); }

std::string Linear::ImplementationName(int64_t m) const { return impl_->PrimitiveFor(m).impl_name; }

}  // namespace trident::kernels::cpu
