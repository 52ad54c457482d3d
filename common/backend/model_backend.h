// The interface every model backend (cpu, cuda) implements: one forward pass
// over a batch of sequences whose KV lives in the backend's paged cache.
//
// The engine owns scheduling and block allocation; the backend owns the
// weights and the KV storage, and is driven by one thread at a time.

#ifndef TRIDENT_COMMON_BACKEND_MODEL_BACKEND_H_
#define TRIDENT_COMMON_BACKEND_MODEL_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/backend/kv_copier.h"
#include "common/backend/kv_peer_lane.h"
#include "common/kv/kv_layout.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/transport/attention/remote_attention.h"

namespace trident::backend {

// Where a CPU-resident sequence's KV lives: an attention service holds it
// and computes its attention (common/transport/attention).
struct RemoteKv {
  // Null: the sequence is resident in the backend's own KV cache.
  transport::attention::RemoteAttention* service = nullptr;
  // The sequence's handle at the service (AdmitSequenceResponse.handle).
  uint64_t handle = 0;
};

// One sequence's share of a forward step.
struct StepSequence {
  // New tokens to run this step: a prefill chunk, or one decode token.
  absl::Span<const int32_t> tokens;
  // Position of tokens[0]; positions [0, start_position) are already in the
  // KV cache.
  int32_t start_position = 0;
  // KV block ids covering positions [0, start_position + tokens.size()).
  absl::Span<const int32_t> block_table;
  // Whether the logits of the last token are wanted (false for the
  // non-final chunks of a chunked prefill).
  bool want_logits = false;
  // Set for a CPU-resident sequence: one decode token, no blocks of ours;
  // each layer sends its q, k, v to the service and takes o back. Backends
  // without offload refuse it (supports_remote_attention()).
  RemoteKv remote;
  // Asymmetric pipelining (supports_pipelining()): the sequences with
  // sub_batch 1, all CPU-resident, form a second sub-batch whose layers
  // interleave with sub-batch 0's, so that their attention at the service
  // runs while the backend computes sub-batch 0's layer. 0 everywhere: one
  // batch, whose CPU-resident sequences' attention overlaps only the local
  // attention.
  int32_t sub_batch = 0;
};

// Time spent on CPU-resident sequences' attention requests, summed over
// every request since the backend was made: from each request's start to
// its answer (round_trip), and of that the time the forward pass stood
// waiting for it (exposed; the rest was hidden under the backend's work).
struct RemoteAttentionTiming {
  int64_t requests = 0;
  double round_trip_seconds = 0;
  double exposed_seconds = 0;
};

// A device backend's step graphs (CUDA graphs): captured at start-up, and
// what became of decode steps since.
struct GraphStats {
  int64_t captured = 0;        // graphs captured, all at start-up
  double capture_seconds = 0;  // the start-up capture's wall time
  int64_t replays = 0;         // decode steps replayed from a graph
  int64_t misses = 0;          // decode steps with no graph for their shape
};

// A forward step failed because an attention service did not answer (it
// died, or timed out): the status carries this payload (type URL
// kRemoteAttentionFailureUrl), naming the service, so that the engine can
// move that service's sequences back into the backend's own cache (a
// recompute) instead of failing them.
inline constexpr char kRemoteAttentionFailureUrl[] = "trident.backend/remote-attention-failure";

// UNAVAILABLE (whatever `cause` was) naming `service` in the payload.
inline absl::Status RemoteAttentionFailure(const transport::attention::RemoteAttention* service,
                                           const absl::Status& cause) {
  absl::Status status =
      absl::UnavailableError(absl::StrCat("attention service failed: ", cause.message()));
  status.SetPayload(kRemoteAttentionFailureUrl,
                    absl::Cord(absl::StrCat(reinterpret_cast<uintptr_t>(service))));
  return status;
}

// The service a failed forward step names, or null when the failure is not
// an attention service's.
inline const transport::attention::RemoteAttention* FailedRemoteAttention(
    const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kRemoteAttentionFailureUrl);
  uintptr_t address = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &address)) return nullptr;
  return reinterpret_cast<const transport::attention::RemoteAttention*>(address);
}

// How to sample one wanted row, for backends that sample on the device.
struct RowSampling {
  const sampling::SamplingParams* params = nullptr;
  const sampling::PenaltyState* penalties = nullptr;
  // Index of the token being sampled among the request's outputs (the
  // Philox counter).
  int64_t output_position = 0;
};

// Where a backend's paged KV cache lives, for a transport to register it and
// for peers to write blocks into it: `spec` lays the pool out (blocks
// [0, usable_blocks) are the engine's; a backend may keep private blocks
// after them).
struct KvMemory {
  void* base = nullptr;
  size_t bytes = 0;
  kv::KvCacheSpec spec;
  int32_t usable_blocks = 0;
  // CUDA device memory on device `device_ordinal`; else host memory.
  bool device = false;
  int32_t device_ordinal = -1;
  // The pool is a view of several (a tensor-parallel backend's ranks,
  // model/tensor_parallel/kv_view.h) in `spec`'s layout: `base` only anchors
  // offsets and is never to be dereferenced or registered; only
  // CreateKvCopier() reaches the bytes.
  bool view = false;
};

// Shape of the KV cache a backend holds, which the engine needs to allocate
// blocks.
struct KvCapacity {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // Rows of logits per wanted sequence.
  virtual int32_t vocab_size() const = 0;
  // Longest sequence (prompt + output) the model accepts.
  virtual int32_t max_model_len() const = 0;
  virtual KvCapacity kv_capacity() const = 0;
  // Human-readable description for logs ("cpu f32, 4 threads").
  virtual std::string Describe() const = 0;

  // Runs the batch: writes every token's KV into its slot and, for each
  // sequence with want_logits, one row of vocab_size() logits into `logits`
  // (rows in batch order, skipping sequences without want_logits).
  virtual absl::Status Forward(absl::Span<const StepSequence> batch, float* logits) = 0;

  // The KV pool's memory; UNIMPLEMENTED for backends whose KV cannot be
  // exported (the fake).
  virtual absl::StatusOr<KvMemory> kv_memory() const {
    return absl::UnimplementedError("this backend's KV cache cannot be exported");
  }

  // A copier between the KV pool and host memory, for KV transports that
  // cannot reach the pool (device memory, UCX without CUDA): see
  // kv_copier.h. Each call makes a new one (the CUDA backend: with its own
  // streams). UNIMPLEMENTED for backends whose pool transports reach
  // directly (host memory) or that have none.
  virtual absl::StatusOr<std::unique_ptr<KvCopier>> CreateKvCopier() const {
    return absl::UnimplementedError("this backend's KV pool needs no copier");
  }

  // A GPU-to-GPU lane to and from other processes' KV pools on this host
  // (kv_peer_lane.h); each call makes a new one. UNIMPLEMENTED for backends
  // whose pool is not in GPU memory.
  virtual absl::StatusOr<std::unique_ptr<KvPeerLane>> CreateKvPeerLane() const {
    return absl::UnimplementedError("this backend's KV pool has no peer lane");
  }

  // Whether Forward takes StepSequences with `remote` set.
  virtual bool supports_remote_attention() const { return false; }
  // Whether Forward runs StepSequence::sub_batch 1 as a pipelined second
  // sub-batch (else it refuses sub_batch other than 0).
  virtual bool supports_pipelining() const { return false; }
  // Totals so far (zero for backends without remote attention). Called on
  // the forward's thread.
  virtual RemoteAttentionTiming remote_attention_timing() const { return {}; }
  // Zero for backends without graphs. Thread-safe.
  virtual GraphStats graph_stats() const { return {}; }

  // How long a forward step waits for an attention service's answer before
  // it fails the step (kRemoteAttentionFailureUrl).
  void set_remote_attention_timeout(absl::Duration timeout) { remote_timeout_ = timeout; }

  // Whether ForwardSample is implemented: the backend samples where the
  // logits are (the GPU) and only tokens and logprobs reach the host.
  virtual bool samples_on_device() const { return false; }

  // Forward, then samples each wanted row (rows[i] for the i-th sequence with
  // want_logits) exactly as sampling::Sampler specifies, into out[i].
  virtual absl::Status ForwardSample(absl::Span<const StepSequence> batch,
                                     absl::Span<const RowSampling> rows,
                                     absl::Span<sampling::SampledToken> out) {
    (void)batch;
    (void)rows;
    (void)out;
    return absl::UnimplementedError("this backend samples on the host");
  }

  // Layer progress, for sending a prompt's KV while its later layers still
  // compute. A backend that reports it calls the observer set here once per
  // layer l, in order, during Forward / ForwardSample, as soon as layer l's
  // KV of every sequence in the batch is in the cache: on the forward's
  // thread, or (device backends) on a driver thread once the device wrote
  // it, and always before Forward returns. The engine sets it around a
  // forward and clears it after; it must be quick and must not call into
  // the backend.
  virtual bool reports_layer_progress() const { return false; }
  void set_layer_observer(std::function<void(int32_t layer)> observer) {
    layer_observer_ = std::move(observer);
  }

 protected:
  const std::function<void(int32_t)>& layer_observer() const { return layer_observer_; }
  absl::Duration remote_timeout() const { return remote_timeout_; }

 private:
  absl::Duration remote_timeout_ = absl::Seconds(5);
  std::function<void(int32_t)> layer_observer_;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_MODEL_BACKEND_H_
