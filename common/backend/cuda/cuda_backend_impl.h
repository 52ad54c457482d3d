// The CUDA backend's state and step machinery (cuda_backend.h has the
// contract). Private to the package: cuda_backend.cc loads the model and
// sizes the memory; cuda_step.cc stages and enqueues forward steps.
//
// A step's sequences are split into passes (sub-batches). Pass 0 carries
// every sequence unless the step is pipelined, when pass 1 carries the
// CPU-resident sequences marked sub_batch 1. Within a pass, the sequences
// whose KV is resident here come first and the CPU-resident ones last, so
// that their rows form one contiguous slab: after each layer's RoPE the
// slab's q/k/v go to pinned host memory in one copy, and their attention
// outputs come back in one copy.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_IMPL_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_IMPL_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/backend/cuda/sampling_batch.h"
#include "common/backend/remote_rows.h"
#include "common/kv/kv_layout.h"
#include "common/model/checkpoint.h"
#include "common/model/load_progress.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/parallel/nccl_group.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"

namespace trident::backend::cuda_internal {

namespace kc = ::trident::kernels::cuda;

using ::trident::backend::CudaCheck;

// Owns one CUDA allocation: device memory (DeviceBuffer) or page-locked
// host memory (PinnedBuffer).
template <bool kPinnedHost>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(CudaBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~CudaBuffer() { Free(); }
  // Replaces what it held with `bytes` new bytes.
  absl::Status Allocate(size_t bytes, const char* what) {
    Free();
    const cudaError_t err = kPinnedHost ? cudaMallocHost(&ptr_, bytes) : cudaMalloc(&ptr_, bytes);
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      const char* kind = kPinnedHost ? "pinned host" : "device";
      return kPinnedHost
                 ? absl::ResourceExhaustedError(absl::StrCat(
                       "cannot allocate ", bytes, " bytes of ", kind, " memory for ", what))
                 : absl::FailedPreconditionError(absl::StrCat(
                       "cannot allocate ", bytes, " bytes of ", kind, " memory for ", what));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Free() {
    if (ptr_ != nullptr) kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};
using DeviceBuffer = CudaBuffer<false>;
using PinnedBuffer = CudaBuffer<true>;

// Step metadata, host and device alike: slots [T] int64; tokens, positions
// [T] int32; logit rows, context lens, query lens, query starts [S] int32;
// then the block tables, [S][table_stride] int32 with a per-step stride.
// Only the used prefix is copied each step.
struct MetaView {
  int64_t* slots = nullptr;
  int32_t* tokens = nullptr;
  int32_t* positions = nullptr;
  int32_t* rows = nullptr;
  int32_t* context_lens = nullptr;
  int32_t* query_lens = nullptr;
  int32_t* query_starts = nullptr;
  int32_t* tables = nullptr;
};
MetaView ViewMeta(void* base, int64_t max_tokens, int64_t max_seqs);
size_t MetaBytes(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq);

// The shape of one pass's device work: everything the enqueueing needs that
// is not in the metadata buffer.
struct StepShape {
  int64_t total = 0;  // token rows
  int32_t num_seqs = 0;
  // Sequences [0, local_seqs) and rows [0, local_tokens) are resident here;
  // rows [local_tokens, total) are CPU-resident (one per sequence).
  int32_t local_seqs = 0;
  int64_t local_tokens = 0;
  bool all_decode = false;  // every resident sequence runs one token
  // Resident sequences [0, decode_seqs) run one token each (the pass orders
  // them first) over contexts up to max_decode_context; plan is theirs.
  int32_t decode_seqs = 0;
  int32_t max_decode_context = 0;
  int32_t max_query = 0;
  int32_t table_stride = 0;
  kc::DecodePlan plan;
  int64_t head_rows = 0;  // rows of logits
  bool gather = false;    // head rows are meta.rows of the token rows
  int64_t remote_rows() const { return total - local_tokens; }
};

// A decode graph's key: (padded batch, splits * 16 + kernel variant, table
// stride).
using GraphMapKey = std::tuple<int32_t, int32_t, int32_t>;
GraphMapKey GraphKey(const StepShape& shape);

// One pass's activations, metadata and CPU-resident rows.
struct Pass {
  // Capacity: passes[0] takes max_batch_tokens, passes[1] (decode rows
  // only) max_batch_sequences.
  int64_t max_tokens = 0;
  int64_t max_seqs = 0;
  DeviceBuffer residual;                 // f32 [T][hidden]
  DeviceBuffer qkv32, gate_up32;         // f32 projections
  DeviceBuffer hn, qkv, attn, tmp, act;  // bf16
  DeviceBuffer meta;
  PinnedBuffer host_meta;
  MetaView hmeta, dmeta;
  // This step's sequences (indices into the caller's batch) in pass order:
  // those resident here first.
  std::vector<int32_t> order;
  StepShape shape;
  // The CPU-resident rows: their q/k/v (bf16 qkv rows) land in
  // host_remote_qkv once qkv_ready fires; their o (bf16) goes back from
  // host_remote_o.
  RemoteRows remote;
  PinnedBuffer host_remote_qkv, host_remote_o;
  cudaEvent_t qkv_ready = nullptr;
  // First row of the shared logits buffer that this pass's head writes.
  int64_t logits_row0 = 0;

  ~Pass() {
    if (qkv_ready != nullptr) cudaEventDestroy(qkv_ready);
  }
};

struct Impl;

// Tensor parallelism (cuda_tensor_parallel.cc): one Impl per rank, each on
// its GPU, all driven from rank 0's calls on the caller's thread. Collectives
// run on the devices (the peer kernel's flag barriers, NCCL), so one thread
// enqueues every rank without waiting on any. Row-parallel projections (o,
// down) sum over ranks into every rank's residual stream: small steps
// through the peer all-reduce (captured in decode graphs; each rank's
// partial in TpRank::partial), larger ones through NCCL in place (rank 0
// adds its partial to the residual, the others replace theirs with theirs).
// The LM head is split by vocabulary: each rank writes its columns of rank
// 0's logits, and an empty peer all-reduce (a barrier) orders rank 0's
// sampling after every rank's columns.
struct TpGroup {
  std::vector<Impl*> ranks;                   // rank order; ranks[0] drives the others
  std::vector<std::unique_ptr<Impl>> owned;   // ranks 1..N-1
  std::unique_ptr<parallel::NcclGroup> nccl;  // null: the peer kernel at every size
  // Row-parallel sums of at least this many bytes take NCCL.
  int64_t nccl_min_bytes = int64_t{4} << 20;
  int64_t nccl_steps = 0;  // steps whose sums went through NCCL
};

// One rank's part (group null: TP = 1).
struct TpRank {
  TpGroup* group = nullptr;
  std::unique_ptr<TpGroup> owned_group;  // rank 0's
  model::TensorParallelLayout layout;
  // f32 [2][max_tokens][hidden]: the o and the down projection's parts.
  DeviceBuffer partial;
  DeviceBuffer signals;  // the peer all-reduce's signal area
  DeviceBuffer barrier;  // f32 [8]: the head barrier's empty all-reduce
  // This step's row-parallel sums go through NCCL.
  bool nccl_step = false;
  int rank() const { return layout.rank; }
};

struct Impl {
  // The engine's layer observer during a forward with one; null otherwise.
  const std::function<void(int32_t)>* layer_observer = nullptr;
  // cudaLaunchHostFunc payloads: (this, layer) for each layer.
  std::vector<std::pair<Impl*, int32_t>> layer_marks;
  static void CUDART_CB LayerDone(void* mark);

  // The rank's model (its heads and intermediate block under tensor
  // parallelism), and the whole model.
  model::ModelConfig config;
  model::ModelConfig full_config;
  TpRank tp;
  CudaBackendOptions options;
  int32_t max_model_len = 0;
  int32_t num_sms = 132;
  cudaStream_t stream = nullptr;
  std::unique_ptr<kc::Gemm> gemm;

  struct Layer {
    DeviceBuffer input_norm, post_norm;                      // f32 [hidden]
    DeviceBuffer qkv, o, gate_up, down;                      // bf16
    DeviceBuffer qkv_bias, o_bias, gate_up_bias, down_bias;  // f32 (the GEMM output type)
  };
  std::vector<Layer> layers;
  // [vocab][hidden], f32 when the checkpoint stores it in f32 (lookups read
  // one row per token, so keeping it exact costs no bandwidth), else bf16.
  DeviceBuffer embedding;
  bool f32_embedding = false;
  DeviceBuffer lm_head;     // bf16 [vocab][hidden]; empty when tied to a bf16 embedding
  DeviceBuffer final_norm;  // f32 [hidden]
  DeviceBuffer inv_freq;    // f32 [head_dim / 2]
  // The pool holds num_blocks + 1 blocks; the last is the scratch block that
  // padding sequences of a graph-replayed step write.
  kv::KvCacheSpec kv_spec;
  int32_t scratch_block = 0;
  DeviceBuffer kv_pool;

  Pass passes[2];
  int num_passes = 1;
  // Row r of this step's logits (pass order) is the caller's wanted row
  // row_origin[r].
  std::vector<int32_t> row_origin;
  std::vector<int32_t> wanted_index;  // Split's scratch: batch index -> caller's row
  DeviceBuffer last, logits;          // bf16 [S][hidden], f32 [S][vocab]
  DeviceBuffer decode_workspace;
  PinnedBuffer host_logits;

  // CPU-resident sequences' attention: the wait for an answer, and totals.
  absl::Duration remote_timeout = absl::Seconds(5);
  RemoteAttentionTiming remote_timing;

  // GPU sampling: per-row parameters and penalty lists (pinned staging and
  // device copies, grown on demand), the sampler's workspace and outputs.
  SamplingBatchBuilder sample_batch;
  DeviceBuffer sample_ws;
  DeviceBuffer sample_in;  // rows, then seen tokens, then output counts
  PinnedBuffer host_sample_in;
  DeviceBuffer sample_out;  // tokens [S], logprobs [S], top ids / logprobs [S][20]
  PinnedBuffer host_sample_out;

  // Decode graphs by (padded batch, splits, table stride), captured by
  // CaptureGraphs at start-up; sealed after it (nothing is captured while
  // serving).
  std::map<GraphMapKey, cudaGraphExec_t> graphs;
  bool graphs_sealed = false;
  double graph_capture_seconds = 0;
  std::atomic<int64_t> graph_replays{0};
  std::atomic<int64_t> graph_misses{0};

  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    tp.owned_group.reset();  // The other ranks first: their graphs read our buffers.
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Free device memory when Load began: what the backend has taken since is
  // its own use, budgeted against gpu_memory_fraction.
  size_t free_at_start = 0;
  // Loading computes the reader's streams on the device (GenerateBf16).
  bool device_streams = false;

  kc::DecodePlan PlanDecode(int32_t batch, int32_t max_context) const {
    if (options.decode_variant < 0 && options.kv_cache_dtype != numeric::DType::kFP8E4M3) {
      return kc::PlanDecodeAuto(batch, config.num_key_value_heads, config.head_dim, max_context,
                                num_sms);
    }
    const int32_t default_variant =
        options.kv_cache_dtype == numeric::DType::kFP8E4M3
            ? kc::DefaultFp8DecodeVariant(batch, config.num_key_value_heads, config.head_dim,
                                          num_sms)
            : kc::DefaultDecodeVariant(batch, config.num_key_value_heads, config.head_dim, num_sms);
    return kc::PlanDecodeVariant(
        batch, config.num_key_value_heads, config.head_dim, max_context, num_sms,
        options.decode_variant >= 0 ? options.decode_variant : default_variant);
  }
  const void* head() const { return lm_head.get() != nullptr ? lm_head.get() : embedding.get(); }
  int64_t q_out() const { return int64_t{config.num_attention_heads} * config.head_dim; }
  int64_t kv_out() const { return int64_t{config.num_key_value_heads} * config.head_dim; }
  int64_t qkv_width() const { return q_out() + 2 * kv_out(); }
  // Rows of the LM head this rank holds (its vocabulary block).
  int64_t head_vocab() const { return tp.group != nullptr ? tp.layout.vocab : config.vocab_size; }

  // Loading (cuda_backend.cc).
  absl::Status Load(const std::string& dir);
  // The weights from any reader (a checkpoint, or generated ones); `source`
  // names their config in messages. LoadFrom = LoadWeights, AllocateWorkspace,
  // AllocateKv(KvBlocksAvailable()) and CaptureGraphs; a tensor-parallel
  // group takes the KV blocks every rank has room for.
  absl::Status LoadFrom(const model::TensorReader& weights, const model::ModelConfig& model_config,
                        const std::string& source);
  // The rank's part of the weights (all of them at TP = 1).
  absl::Status LoadWeights(const model::TensorReader& weights,
                           const model::ModelConfig& model_config, const std::string& source);
  // The rank's part of a tensor (the whole tensor at TP = 1), in bf16.
  // `whole`: every rank holds all of it (the embedding).
  absl::Status ReadBf16(const model::TensorReader& ckpt, const std::string& name,
                        std::vector<uint16_t>& host, model::LoadProgress& progress,
                        bool whole = false);
  absl::Status UploadBf16(const model::TensorReader& ckpt, const std::vector<std::string>& names,
                          DeviceBuffer* out, model::LoadProgress& progress, bool whole = false);
  // UploadBf16 for a reader whose tensors are counter-based streams: each
  // rank's part computed on the device (kernels/cuda's random_fill).
  absl::Status GenerateBf16(const model::TensorReader& weights,
                            const std::vector<std::string>& names, DeviceBuffer* out,
                            model::LoadProgress& progress, bool whole);
  absl::Status UploadF32(const model::TensorReader& ckpt, const std::vector<std::string>& names,
                         DeviceBuffer* out, model::LoadProgress& progress, bool whole = false);
  absl::Status AllocateWorkspace();
  // KV blocks (the scratch block included) the memory budget leaves room for.
  absl::StatusOr<int32_t> KvBlocksAvailable();
  absl::Status AllocateKv(int32_t num_blocks);
  absl::Status AllocatePass(Pass& pass, int64_t max_tokens, int64_t max_seqs);

  // Steps (cuda_step.cc).
  // Validates the batch, splits it into passes, stages their metadata and
  // enqueues the step (graph replay, launches, or layer by layer with the
  // CPU-resident rows' requests); returns the number of logit rows, in
  // pass order (row_origin maps them to the caller's).
  absl::StatusOr<int64_t> Run(absl::Span<const StepSequence> batch);
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits_out);
  absl::Status ForwardSample(absl::Span<const StepSequence> batch,
                             absl::Span<const RowSampling> rows,
                             absl::Span<sampling::SampledToken> out);
  absl::Status StageSampling(absl::Span<const RowSampling> rows, size_t* in_bytes, size_t* seen_at,
                             size_t* counts_at);
  absl::Status Validate(const StepSequence& s) const;
  absl::Status Split(absl::Span<const StepSequence> batch);
  // Fills the pass's metadata and shape; `graphable`: a decode step with
  // no CPU-resident rows may be padded for a graph.
  absl::StatusOr<bool> Stage(Pass& pass, absl::Span<const StepSequence> batch, bool graphable);
  // A whole step of one pass from its device metadata.
  absl::Status Enqueue(Pass& pass);
  // Its parts: the embedding; a layer up to the attention (norm, qkv, RoPE,
  // the resident rows' KV append, the CPU-resident rows' copy to the host);
  // the resident rows' paged attention; the rest of the layer (the
  // CPU-resident rows' o copied in, o projection, MLP); the head.
  absl::Status EnqueueEmbedding(Pass& pass);
  absl::Status EnqueuePreAttention(Pass& pass, int32_t layer);
  // After a layer's KV append: tells the layer observer (prompts' layer
  // progress) once the device has written it.
  absl::Status ReportLayer(Pass& pass, int32_t layer);
  absl::Status EnqueueLocalAttention(Pass& pass, int32_t layer);
  // The o projection (and, under tensor parallelism, the peer all-reduce
  // that sums it), then the MLP (and its sum).
  absl::Status EnqueuePostAttention(Pass& pass, int32_t layer);
  absl::Status EnqueueOProj(Pass& pass, int32_t layer);
  absl::Status EnqueueMlp(Pass& pass, int32_t layer);
  // Where a row-parallel projection (o, down) writes, and whether it adds.
  // `down`: the MLP's down projection (else o), whose partial has a half
  // of its own.
  std::pair<float*, bool> RowParallelOut(Pass& pass, bool down);
  float* Partial(bool down) const {
    return tp.partial.get<float>() + (down ? passes[0].max_tokens * config.hidden_size : 0);
  }
  // Tensor parallelism (cuda_tensor_parallel.cc): this rank's peer
  // all-reduce adding every rank's partial into its residual stream; the
  // head barrier; a whole step of every rank; recovery after a failed one.
  absl::Status EnqueuePeerSum(Pass& pass, bool down);
  absl::Status EnqueueHeadBarrier();
  absl::StatusOr<int64_t> RunTensorParallel(absl::Span<const StepSequence> batch);
  absl::Status EnqueueTensorParallel();
  absl::Status SumOverRanks(bool down, int32_t layer);
  void RecoverTensorParallel();
  absl::Status EnqueueHead(Pass& pass);
  absl::Status Norm(Pass& pass, const DeviceBuffer& weight, int64_t rows);
  // Layer l's part of the pool as a bf16 cache (a bf16 kv_spec).
  kc::PagedKvBf16 LayerCacheBf16(int32_t l);
  // Layer l's norm, q/k/v projection and RoPE, into pass.qkv; *kv_stored:
  // whether the projection also stored the step's k and v in the cache.
  absl::Status EnqueueQkv(Pass& pass, int32_t l, bool* kv_stored);
  // The norm ahead of projection `g` (whose x is pass.hn): fused into it
  // where the GEMM takes it (g then reads the residual), else Norm().
  absl::Status NormInto(Pass& pass, const DeviceBuffer& weight, int64_t rows, kc::GemmArgs& g);
  // Layer by layer with the passes' remote requests (and, with two passes,
  // pass 1's requests in flight while pass 0's layer runs).
  absl::Status RunLayers();
  absl::Status SendRemote(Pass& pass, int32_t layer);
  absl::Status ReceiveRemote(Pass& pass);
  // Replays the decode graph for passes[0]'s shape (capturing it while the
  // graphs are not sealed); with none, launches the step's kernels.
  absl::Status LaunchGraph(Pass& pass);
  // The shape Stage gives a graph-replayed decode step of `padded`
  // sequences whose longest context is `max_context`.
  StepShape GraphShape(int32_t padded, int32_t max_context) const;
  int32_t TableStride(int32_t max_context) const;
  // Captures every graph the options ask for, then seals them.
  absl::Status CaptureGraphs();
};

// A tensor-parallel group over options.tensor_parallel ranks
// (cuda_tensor_parallel.cc): rank r on tensor_parallel_devices[r] (or
// device + r), each loading its shard of `weights`; returns rank 0, which
// owns the others. kInvalidArgument for a model that does not split over
// the ranks; kFailedPrecondition for missing devices or GPUs without peer
// access.
absl::StatusOr<std::unique_ptr<Impl>> LoadTensorParallel(const model::TensorReader& weights,
                                                         const model::ModelConfig& config,
                                                         const std::string& source,
                                                         const CudaBackendOptions& options);

}  // namespace trident::backend::cuda_internal

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_IMPL_H_
