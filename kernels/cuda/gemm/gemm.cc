#include "kernels/cuda/gemm/gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/gemm/gemm_skinny_sm90_kernel.h"
#include "kernels/cuda/gemm/gemv_kernel.h"
#include "kernels/cuda/gemm/gemv_sm90_kernel.h"

namespace trident::kernels::cuda {
namespace {

// cuBLASLt is loaded at run time rather than linked: its large static TLS
// would otherwise shrink the usable stack of every thread in the process
// below what small-stack threads (civetweb's 100 KiB ones, for /metrics)
// need, and pthread_create would fail for them.
struct CublasLtApi {
  absl::Status status;
#define TRIDENT_LT_FN(name) decltype(&cublasLt##name) name = nullptr;
  TRIDENT_LT_FN(Create)
  TRIDENT_LT_FN(Destroy)
  TRIDENT_LT_FN(GetStatusString)
  TRIDENT_LT_FN(Matmul)
  TRIDENT_LT_FN(MatmulAlgoGetHeuristic)
  TRIDENT_LT_FN(MatmulDescCreate)
  TRIDENT_LT_FN(MatmulDescDestroy)
  TRIDENT_LT_FN(MatmulDescSetAttribute)
  TRIDENT_LT_FN(MatmulPreferenceCreate)
  TRIDENT_LT_FN(MatmulPreferenceDestroy)
  TRIDENT_LT_FN(MatmulPreferenceSetAttribute)
  TRIDENT_LT_FN(MatrixLayoutCreate)
  TRIDENT_LT_FN(MatrixLayoutDestroy)
#undef TRIDENT_LT_FN
};

const CublasLtApi& Lt() {
  static const CublasLtApi* api = [] {
    auto* a = new CublasLtApi();
    void* lib = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      a->status = absl::FailedPreconditionError(
          absl::StrCat("cannot load cuBLASLt (libcublasLt.so.13): ", dlerror()));
      return a;
    }
#define TRIDENT_LT_LOAD(name)                                                   \
  a->name = reinterpret_cast<decltype(a->name)>(dlsym(lib, "cublasLt" #name));  \
  if (a->name == nullptr && a->status.ok()) {                                   \
    a->status = absl::FailedPreconditionError("cuBLASLt lacks cublasLt" #name); \
  }
    TRIDENT_LT_LOAD(Create)
    TRIDENT_LT_LOAD(Destroy)
    TRIDENT_LT_LOAD(GetStatusString)
    TRIDENT_LT_LOAD(Matmul)
    TRIDENT_LT_LOAD(MatmulAlgoGetHeuristic)
    TRIDENT_LT_LOAD(MatmulDescCreate)
    TRIDENT_LT_LOAD(MatmulDescDestroy)
    TRIDENT_LT_LOAD(MatmulDescSetAttribute)
    TRIDENT_LT_LOAD(MatmulPreferenceCreate)
    TRIDENT_LT_LOAD(MatmulPreferenceDestroy)
    TRIDENT_LT_LOAD(MatmulPreferenceSetAttribute)
    TRIDENT_LT_LOAD(MatrixLayoutCreate)
    TRIDENT_LT_LOAD(MatrixLayoutDestroy)
#undef TRIDENT_LT_LOAD
    return a;
  }();
  return *api;
}

absl::Status CublasError(const char* what, cublasStatus_t status) {
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": ", Lt().GetStatusString(status)));
}

#define TRIDENT_CUBLAS(call, what)                                 \
  do {                                                             \
    cublasStatus_t s_ = (call);                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) return CublasError(what, s_); \
  } while (0)

// Rows longer than this go to cuBLASLt, which splits k across CTAs: at m =
// 1 it read the 8B shape's down projection (k = 14336) in 33.8 µs against
// the GEMV's 36.6 (bench/RESULTS.md).
constexpr int64_t kGemvMaxK = 8192;

// Whether the GEMV kernel takes the call: one row of x, of at most
// kGemvMaxK, 16-byte loads along k (k a multiple of 8, x and W 16-byte
// aligned).
bool GemvSuits(const GemmArgs& args) {
  return args.m == 1 && args.k % 8 == 0 && reinterpret_cast<uintptr_t>(args.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.w) % 16 == 0;
}

// Which single-row kernel takes the call, if any. Hopper's (`sm90`: the
// Gemm's device is one) streams any k (its pipeline does not depend on k);
// the other, k up to kGemvMaxK.
enum class GemvPath { kNone, kRegisters, kBulk };

GemvPath ChooseGemv(const GemmOptions& options, bool sm90, const GemmArgs& args) {
  if (!options.gemv || !GemvSuits(args)) return GemvPath::kNone;
  if (options.gemv_bulk && sm90) return GemvPath::kBulk;
  return args.k <= kGemvMaxK ? GemvPath::kRegisters : GemvPath::kNone;
}

// Tiles the skinny GEMM's counters cover (the largest n / 64 it takes).
constexpr size_t kSkinnyMaxTiles = size_t{1} << 16;
// Hopper's GEMV with dynamic items: a ring of counter pairs, one per launch
// in turn, so launches that overlap (programmatic dependent launch lets the
// next few start early) never share one; each launch leaves its pair zero.
constexpr uint32_t kGemvCounterPairs = 1024;

internal::SkinnyArgs SkinnyArgsOf(const GemmOptions& options, const GemmArgs& args, bool silu_mul) {
  internal::SkinnyArgs s;
  s.x = args.x;
  s.x_stride = args.x_stride;
  s.w = args.w;
  s.bias = args.bias;
  s.y = args.y;
  s.y_stride = args.y_stride;
  s.m = args.m;
  s.n = silu_mul ? args.n / 2 : args.n;
  s.k = args.k;
  s.f32_out = !silu_mul && args.y_dtype == numeric::DType::kF32;
  s.accumulate = !silu_mul && args.accumulate;
  s.silu_mul = silu_mul;
  s.tile_rows = silu_mul ? 128 : options.skinny_tile_rows;
  s.cluster_split = options.skinny_cluster_split;
  s.pdl = options.pdl;
  return s;
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  GemmOptions options;
  // The device's SMs, queried once on an sm_90 device, else 0 (Hopper's GEMV
  // and skinny GEMM are taken only when positive, and size their grids by
  // it).
  int sms = 0;
  // The skinny GEMM's counters (zeroed once; the kernel leaves them zero),
  // when options let it take calls. Its partial sums live in the cuBLASLt
  // workspace: neither keeps anything between calls on the one stream a
  // Gemm serves at a time.
  int32_t* skinny_counters = nullptr;
  uint32_t* gemv_counters = nullptr;  // kGemvCounterPairs pairs (options.gemv_dynamic)
  uint32_t next_gemv_counter = 0;

  // The next launch's counter pair for Hopper's GEMV, or null (static items).
  uint32_t* GemvCounter() {
    if (gemv_counters == nullptr) return nullptr;
    uint32_t* const pair = gemv_counters + 2 * next_gemv_counter;
    next_gemv_counter = (next_gemv_counter + 1) % kGemvCounterPairs;
    return pair;
  }

  // Whether the skinny GEMM takes the call: every suitable call with
  // options.skinny, else the fused gate/up + SwiGLU of up to
  // skinny_silu_max_rows rows.
  bool TakesSkinny(const internal::SkinnyArgs& s) const {
    const bool wanted = options.skinny || (s.silu_mul && s.m <= options.skinny_silu_max_rows);
    return wanted && skinny_counters != nullptr && internal::SkinnySuits(s) &&
           internal::SkinnyPartialBytes(s, sms) <= options.workspace_bytes &&
           internal::SkinnyCounterBytes(s) <= kSkinnyMaxTiles * sizeof(int32_t);
  }

  absl::Status RunSkinny(const internal::SkinnyArgs& s, cudaStream_t stream) {
    const internal::SkinnyScratch scratch{workspace, options.workspace_bytes, skinny_counters,
                                          kSkinnyMaxTiles * sizeof(int32_t)};
    const cudaError_t error = internal::GemmSkinny(s, scratch, sms, stream);
    if (error != cudaSuccess) {
      return absl::InternalError(absl::StrCat("Gemm: skinny GEMM launch (m=", s.m, " n=", s.n,
                                              " k=", s.k, "): ", cudaGetErrorString(error)));
    }
    return absl::OkStatus();
  }

  // Key: m, n, k, x_stride, y_stride, bias, y dtype. Value: descriptors and
  // algorithm.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, Plan> plans;

  // Tuning (options.tune_algos > 1): its stream, events, output and
  // workspace, apart from everything a call uses.
  cudaStream_t tune_stream = nullptr;
  cudaEvent_t tune_events[2] = {nullptr, nullptr};
  void* tune_y = nullptr;
  void* tune_workspace = nullptr;
  Gemm::TuneStats tune_stats;

  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.op) Lt().MatmulDescDestroy(p.op);
      if (p.a) Lt().MatrixLayoutDestroy(p.a);
      if (p.b) Lt().MatrixLayoutDestroy(p.b);
      if (p.c) Lt().MatrixLayoutDestroy(p.c);
    }
    if (workspace) cudaFree(workspace);
    if (skinny_counters) cudaFree(skinny_counters);
    if (gemv_counters) cudaFree(gemv_counters);
    if (tune_y) cudaFree(tune_y);
    if (tune_workspace) cudaFree(tune_workspace);
    for (cudaEvent_t e : tune_events) {
      if (e) cudaEventDestroy(e);
    }
    if (tune_stream) cudaStreamDestroy(tune_stream);
    if (handle) Lt().Destroy(handle);
  }

  // cuBLASLt is column-major. Row-major y[m][n] is column-major yᵀ [n][m]:
  // yᵀ = W · xᵀ, with W [n][k] row-major = column-major Wᵀ [k][n] taken
  // transposed (op T), and x [m][k] row-major = column-major xᵀ [k][m].
  absl::StatusOr<const Plan*> PlanFor(const GemmArgs& args, cudaStream_t stream) {
    const bool f32_out = args.y_dtype == numeric::DType::kF32;
    const cudaDataType_t y_type = f32_out ? CUDA_R_32F : CUDA_R_16BF;
    const auto key = std::make_tuple(args.m, args.n, args.k, args.x_stride, args.y_stride,
                                     args.bias != nullptr, f32_out);
    if (auto it = plans.find(key); it != plans.end()) return &it->second;
    Plan p;
    TRIDENT_CUBLAS(Lt().MatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    TRIDENT_CUBLAS(
        Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
        "transa");
    TRIDENT_CUBLAS(
        Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
        "transb");
    if (args.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      TRIDENT_CUBLAS(Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof(epilogue)),
                     "epilogue");
      const cudaDataType_t bias_type = y_type;
      TRIDENT_CUBLAS(Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof(bias_type)),
                     "bias type");
    }
    // A = W as stored: column-major [k][n] with ld k (op T makes it [n][k]).
    TRIDENT_CUBLAS(Lt().MatrixLayoutCreate(&p.a, CUDA_R_16BF, args.k, args.n, args.k), "A");
    // B = xᵀ: column-major [k][m], ld x_stride.
    TRIDENT_CUBLAS(Lt().MatrixLayoutCreate(&p.b, CUDA_R_16BF, args.k, args.m, args.x_stride), "B");
    // C = D = yᵀ: column-major [n][m], ld y_stride.
    TRIDENT_CUBLAS(Lt().MatrixLayoutCreate(&p.c, y_type, args.n, args.m, args.y_stride), "C");
    cublasLtMatmulPreference_t pref = nullptr;
    TRIDENT_CUBLAS(Lt().MatmulPreferenceCreate(&pref), "preference");
    TRIDENT_CUBLAS(Lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &options.workspace_bytes,
                                                     sizeof(options.workspace_bytes)),
                   "workspace preference");
    std::vector<cublasLtMatmulHeuristicResult_t> results(
        Tunes(args, stream) ? static_cast<size_t>(options.tune_algos) : 1);
    int found = 0;
    const cublasStatus_t status =
        Lt().MatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref,
                                    static_cast<int>(results.size()), results.data(), &found);
    Lt().MatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      Lt().MatmulDescDestroy(p.op);
      Lt().MatrixLayoutDestroy(p.a);
      Lt().MatrixLayoutDestroy(p.b);
      Lt().MatrixLayoutDestroy(p.c);
      return absl::InternalError(
          absl::StrCat("cuBLASLt has no algorithm for m=", args.m, " n=", args.n, " k=", args.k));
    }
    p.algo = results[found > 1 ? Fastest(p, args, absl::MakeSpan(results.data(), found)) : 0].algo;
    return &plans.emplace(key, p).first->second;
  }

  // What tuning needs, apart from what a call uses.
  absl::Status StartTuning() {
    cudaError_t err = cudaStreamCreateWithFlags(&tune_stream, cudaStreamNonBlocking);
    for (cudaEvent_t& e : tune_events) {
      if (err == cudaSuccess) err = cudaEventCreate(&e);
    }
    if (err == cudaSuccess) err = cudaMalloc(&tune_y, options.tune_scratch_bytes);
    if (err == cudaSuccess) err = cudaMemset(tune_y, 0, options.tune_scratch_bytes);
    if (err == cudaSuccess && options.workspace_bytes > 0) {
      err = cudaMalloc(&tune_workspace, options.workspace_bytes);
    }
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Gemm tuning's stream and scratch: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }

  // Whether a call's plan is chosen by timing: tuning on, the call's stream
  // being captured, and y fitting the scratch.
  bool Tunes(const GemmArgs& args, cudaStream_t stream) const {
    if (tune_stream == nullptr) return false;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusActive) {
      return false;
    }
    const size_t elem = args.y_dtype == numeric::DType::kF32 ? 4 : 2;
    return static_cast<size_t>(args.m) * args.y_stride * elem <= options.tune_scratch_bytes;
  }

  // The index of the fastest candidate (0 when none ran), by the sum of
  // kTuneRuns runs after a warm-up, on the tuning stream into the scratch
  // output with its own workspace. Each run starts with L2 cleared of W (the
  // scratch, larger than L2, is rewritten untimed), as a forward pass finds
  // each layer's weights. The capturing thread may not wait on events, so
  // it is relaxed meanwhile; the captured stream sees none of it.
  int Fastest(const Plan& p, const GemmArgs& args,
              absl::Span<const cublasLtMatmulHeuristicResult_t> candidates) {
    constexpr int kTuneRuns = 4;
    const absl::Time start = absl::Now();
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (args.bias != nullptr) {
      Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                                  sizeof(args.bias));
    }
    const float alpha = 1.0f, beta = args.accumulate ? 1.0f : 0.0f;
    int best = 0;
    float best_ms = std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
      bool ran = true;
      float total_ms = 0;
      for (int r = 0; r <= kTuneRuns && ran; ++r) {
        float ms = 0;
        ran = cudaMemsetAsync(tune_y, 0, options.tune_scratch_bytes, tune_stream) == cudaSuccess &&
              cudaEventRecord(tune_events[0], tune_stream) == cudaSuccess &&
              Lt().Matmul(handle, p.op, &alpha, args.w, p.a, args.x, p.b, &beta, tune_y, p.c,
                          tune_y, p.c, &candidates[i].algo, tune_workspace, options.workspace_bytes,
                          tune_stream) == CUBLAS_STATUS_SUCCESS &&
              cudaEventRecord(tune_events[1], tune_stream) == cudaSuccess &&
              cudaEventSynchronize(tune_events[1]) == cudaSuccess &&
              cudaEventElapsedTime(&ms, tune_events[0], tune_events[1]) == cudaSuccess;
        if (r > 0) total_ms += ms;
      }
      if (ran && total_ms < best_ms) {
        best = static_cast<int>(i);
        best_ms = total_ms;
      }
    }
    cudaGetLastError();  // A candidate that failed to launch leaves nothing behind.
    cudaThreadExchangeStreamCaptureMode(&mode);
    ++tune_stats.shapes;
    if (best != 0) ++tune_stats.changed;
    tune_stats.seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return best;
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

namespace {

// `bytes` of device memory set to zero (the kernels' counters), freed by
// the caller; kResourceExhausted without memory.
absl::StatusOr<void*> ZeroedCounters(size_t bytes, const char* what) {
  void* counters = nullptr;
  cudaError_t err = cudaMalloc(&counters, bytes);
  if (err == cudaSuccess) {
    err = cudaMemset(counters, 0, bytes);
    if (err != cudaSuccess) cudaFree(counters);
  }
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
  }
  return counters;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(const GemmOptions& options) {
  if (!Lt().status.ok()) return Lt().status;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const size_t workspace_bytes = options.workspace_bytes;
  TRIDENT_CUBLAS(Lt().Create(&impl->handle), "create");
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMalloc(&impl->workspace, workspace_bytes);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Gemm workspace of ", workspace_bytes, " bytes: ", cudaGetErrorString(err)));
    }
  }
  if (options.tune_algos > 1) {
    if (absl::Status s = impl->StartTuning(); !s.ok()) return s;
  }
  if (!CurrentDeviceIsSm90()) return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&impl->sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("Gemm: SM count: ", cudaGetErrorString(err)));
  }
  if ((options.skinny || options.skinny_silu_max_rows >= 2) && workspace_bytes > 0) {
    absl::StatusOr<void*> counters =
        ZeroedCounters(kSkinnyMaxTiles * sizeof(int32_t), "Gemm skinny GEMM counters");
    if (!counters.ok()) return counters.status();
    impl->skinny_counters = static_cast<int32_t*>(*counters);
  }
  if (options.gemv && options.gemv_bulk && options.gemv_dynamic) {
    absl::StatusOr<void*> counters =
        ZeroedCounters(2 * kGemvCounterPairs * sizeof(uint32_t), "Gemm GEMV counters");
    if (!counters.ok()) return counters.status();
    impl->gemv_counters = static_cast<uint32_t*>(*counters);
  }
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

Gemm::TuneStats Gemm::tune_stats() const { return impl_->tune_stats; }

absl::Status Gemm::Run(const GemmArgs& args, cudaStream_t stream) {
  if (args.m < 0 || args.n <= 0 || args.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: m=", args.m, " n=", args.n, " k=", args.k, " must be m>=0, n,k>0"));
  }
  if (args.m == 0) return absl::OkStatus();
  if (args.x == nullptr || args.w == nullptr || args.y == nullptr) {
    return absl::InvalidArgumentError("Gemm: x, w and y must not be null");
  }
  if (args.x_stride < args.k || args.y_stride < args.n) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: strides x ", args.x_stride, " y ",
                                                   args.y_stride, " smaller than rows"));
  }
  if (args.y_dtype != numeric::DType::kBF16 && args.y_dtype != numeric::DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: y dtype ", numeric::DTypeName(args.y_dtype), " is not supported (bf16 or f32)"));
  }
  if (absl::Status s = CheckNorm(args); !s.ok()) return s;
  const GemvPath gemv = ChooseGemv(impl_->options, impl_->sms > 0, args);
  if (gemv != GemvPath::kNone) {
    const bool f32_out = args.y_dtype == numeric::DType::kF32;
    const cudaError_t error =
        gemv == GemvPath::kBulk
            ? internal::GemvBf16Bulk(args.x, args.w, args.bias, args.y, args.n, args.k, f32_out,
                                     args.accumulate, impl_->sms, impl_->options.pdl, stream,
                                     {args.norm_weight, args.norm_eps}, {impl_->GemvCounter()})
            : internal::GemvBf16(args.x, args.w, args.bias, args.y, args.n, args.k, f32_out,
                                 args.accumulate, impl_->options.pdl, stream);
    if (error != cudaSuccess) {
      return absl::InternalError(absl::StrCat("Gemm: GEMV launch: ", cudaGetErrorString(error)));
    }
    return absl::OkStatus();
  }
  if (const internal::SkinnyArgs skinny = SkinnyArgsOf(impl_->options, args, false);
      impl_->TakesSkinny(skinny)) {
    return impl_->RunSkinny(skinny, stream);
  }
  auto plan = impl_->PlanFor(args, stream);
  if (!plan.ok()) return plan.status();
  const Impl::Plan& p = **plan;
  if (args.bias != nullptr) {
    TRIDENT_CUBLAS(Lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                                               sizeof(args.bias)),
                   "bias pointer");
  }
  const float alpha = 1.0f, beta = args.accumulate ? 1.0f : 0.0f;
  TRIDENT_CUBLAS(
      Lt().Matmul(impl_->handle, p.op, &alpha, args.w, p.a, args.x, p.b, &beta, args.y, p.c, args.y,
                  p.c, &p.algo, impl_->workspace, impl_->options.workspace_bytes, stream),
      "matmul");
  return absl::OkStatus();
}

bool Gemm::FusesNorm(const GemmArgs& args) const {
  return ChooseGemv(impl_->options, impl_->sms > 0, args) == GemvPath::kBulk &&
         args.k <= internal::GemvBulkNormMaxK() &&
         reinterpret_cast<uintptr_t>(args.norm_weight) % 16 == 0;
}

absl::Status Gemm::CheckNorm(const GemmArgs& args) const {
  if (args.norm_weight == nullptr || FusesNorm(args)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "Gemm: a fused norm needs Hopper's GEMV (one row on an sm_90 device, the option on), k a "
      "multiple of 8 up to ",
      internal::GemvBulkNormMaxK(), " (", args.k, " here), x and the norm weight 16-byte aligned"));
}

bool Gemm::FusesRope(const GemmArgs& args, const GemmRope& rope) const {
  return ChooseGemv(impl_->options, impl_->sms > 0, args) == GemvPath::kBulk &&
         args.y_dtype == numeric::DType::kBF16 && !args.accumulate && rope.head_dim > 0 &&
         rope.head_dim % 8 == 0 && rope.num_q_heads >= 0 && rope.num_kv_heads >= 0 &&
         args.n == int64_t{rope.num_q_heads + 2 * rope.num_kv_heads} * rope.head_dim &&
         rope.positions != nullptr && rope.inv_freq != nullptr &&
         (rope.kv.base == nullptr ||
          ValidateKvStore(rope.kv, rope.slots, rope.num_kv_heads, rope.head_dim).ok());
}

absl::Status Gemm::RunRope(const GemmArgs& args, const GemmRope& rope, cudaStream_t stream) {
  if (args.x == nullptr || args.w == nullptr || args.y == nullptr) {
    return absl::InvalidArgumentError("Gemm RoPE: x, w and y must not be null");
  }
  if (!FusesRope(args, rope)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Gemm RoPE: needs Hopper's GEMV (one row on an sm_90 device, the option on, k a multiple "
        "of 8, x and W 16-byte aligned), bf16 y without accumulate, positions and inv_freq, and n ",
        args.n, " = (q heads ", rope.num_q_heads, " + 2 x kv heads ", rope.num_kv_heads,
        ") x head_dim ", rope.head_dim, " (a multiple of 8)"));
  }
  if (absl::Status s = CheckNorm(args); !s.ok()) return s;
  const cudaError_t error = internal::GemvRopeBulk(
      args.x, args.w, args.bias, args.y, args.n, args.k, impl_->sms, impl_->options.pdl, stream,
      {args.norm_weight, args.norm_eps},
      {rope.positions, rope.inv_freq, rope.head_dim, rope.num_q_heads + rope.num_kv_heads,
       rope.num_q_heads, SlotTargetOf(rope.kv, rope.slots)},
      {impl_->GemvCounter()});
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("Gemm RoPE launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

bool Gemm::FusesSiluMul(const GemmArgs& args) const {
  if (args.n % 2 != 0) return false;
  return ChooseGemv(impl_->options, impl_->sms > 0, args) == GemvPath::kBulk ||
         impl_->TakesSkinny(SkinnyArgsOf(impl_->options, args, true));
}

int Gemm::SkinnyClusterSize(const GemmArgs& args) const {
  const internal::SkinnyArgs skinny = SkinnyArgsOf(impl_->options, args, false);
  return impl_->TakesSkinny(skinny) ? internal::SkinnyClusterSize(skinny, impl_->sms) : 0;
}

absl::Status Gemm::RunSiluMul(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0 || args.n % 2 != 0 || args.k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm SiLU-mul: m=", args.m, " n=", args.n,
                                                   " k=", args.k,
                                                   " must be m, k > 0 and n even and positive"));
  }
  if (args.x == nullptr || args.w == nullptr || args.y == nullptr) {
    return absl::InvalidArgumentError("Gemm SiLU-mul: x, w and y must not be null");
  }
  if (!FusesSiluMul(args)) {
    return absl::FailedPreconditionError(
        "Gemm SiLU-mul: needs Hopper's GEMV (one row) or skinny GEMM (2-64 rows): an sm_90 "
        "device, the kernel's option on, k a multiple of 8, x and W 16-byte aligned");
  }
  if (absl::Status s = CheckNorm(args); !s.ok()) return s;
  if (args.m > 1) return impl_->RunSkinny(SkinnyArgsOf(impl_->options, args, true), stream);
  const cudaError_t error = internal::GemvSiluMulBulk(
      args.x, args.w, args.bias, args.y, args.n / 2, args.k, impl_->sms, impl_->options.pdl, stream,
      {args.norm_weight, args.norm_eps}, {impl_->GemvCounter()});
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("Gemm SiLU-mul launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
