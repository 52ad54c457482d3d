// What a token source (the engine, or the router's remote prefill ->
// decode path) is asked and what it answers: a request, its token events
// and how it finished. Plain types with no backend behind them, so that a
// front end that knows no model backend (the router) can use them.

#ifndef TRIDENT_COMMON_ENGINE_REQUEST_H_
#define TRIDENT_COMMON_ENGINE_REQUEST_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "common/sampling/sampling_params.h"

namespace trident::engine {

// What one request asks of the engine. Text-level conditions (stop strings)
// are the caller's business: it calls Abort when one matches.
struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;
  sampling::SamplingParams sampling;
  int32_t max_tokens = 16;
  // Sampling one of these ends the request with kStop (the token is
  // returned). The caller adds the model's EOS ids unless ignore_eos.
  std::vector<int32_t> stop_token_ids;
  // A resumed request (migrated from a worker that died): the last
  // `resumed_outputs` tokens of `prompt` are outputs this request generated
  // before. They count as outputs for penalties, for the sampling position
  // (seeded draws are keyed by output position, so the continuation is the
  // one the first worker would have drawn) and in max_tokens, which stays
  // the request's whole: max_tokens - resumed_outputs more are generated.
  // Their KV is computed like the prompt's (or found in a prefix cache).
  int32_t resumed_outputs = 0;
  // Disaggregated prefill: compute the prompt and sample the first token,
  // then stop with kPrefilled and keep the prompt's KV blocks (the event
  // lists them) until ReleasePrefilled, so they can be sent to a decode
  // worker. The prompt's blocks are allocated whole when the request is
  // admitted, and such a sequence is never preempted. If the first token
  // ends the request (stop token, max_tokens 1) it finishes as usual and
  // its blocks are freed.
  bool prefill_only = false;
  // For prefill_only requests on a backend that reports layer progress
  // (ModelBackend::reports_layer_progress): called for each layer, in order,
  // as soon as the whole prompt's KV of that layer is in the cache (during
  // the step that computes the prompt's last chunk, while later layers still
  // compute), with the prompt's blocks in token order. From the engine's
  // thread or a backend thread; it must be quick. The blocks stay the
  // request's until ReleasePrefilled (or its end, if it fails).
  std::function<void(int32_t layer, const std::vector<int32_t>& blocks)> on_layer_done;
  // Keeps tenants' cached prefixes apart: requests share cached KV only
  // with requests of the same salt (kv::BlockHasher). Empty: the shared
  // namespace.
  std::string cache_salt;
  // Admission inputs (the router's); the engine ignores them. Empty class:
  // the default; unset targets: the class's.
  std::string qos_class;
  absl::optional<absl::Duration> ttft_slo;
  absl::optional<absl::Duration> tpot_slo;
  // How long the client lets the request run, from its submission (the
  // call's deadline); unset: no limit. The engine ignores it; the router
  // bounds its waits by it.
  absl::optional<absl::Duration> time_limit;
};

enum class FinishReason {
  kNone,
  kStop,
  kLength,
  kAborted,
  kError,
  // A prefill_only request's prompt is computed and its first token sampled.
  kPrefilled,
};

// Where a request ran and where its time went, as a token source that
// spans several workers (the router's remote path) knows it. Unset phases
// did not happen or are unknown.
struct RequestPlacement {
  std::string prefill_worker_id;
  std::string decode_worker_id;
  std::string attention_service_id;
  // Before prefill started: waiting in the router plus the prefill queue.
  absl::optional<absl::Duration> queued;
  // Prefill compute, first layer to first token.
  absl::optional<absl::Duration> prefill;
  // KV transfer, first write to the decode side accepting it.
  absl::optional<absl::Duration> kv_transfer;
};

// One sampled token of one request.
struct TokenEvent {
  std::string request_id;
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // Index of this token among the request's outputs.
  int32_t output_index = 0;
  FinishReason finish = FinishReason::kNone;
  // For kStop: the stop token sampled.
  int32_t matched_stop_token = -1;
  // For kPrefilled: the blocks holding the prompt's KV, in token order
  // (ceil(prompt / block_size) of them), owned by the caller until
  // ReleasePrefilled.
  std::vector<int32_t> prefilled_blocks;
  // On output 0's event: prompt tokens whose KV was reused from a cache
  // instead of computed (0 when nothing was).
  int32_t cached_tokens = 0;
  // Of cached_tokens, those fetched from an attention service's block store
  // (the DRAM tier) just before the request entered the engine; set by the
  // KV tier (services/worker/kv_tier), 0 from the engine.
  int32_t dram_cached_tokens = 0;
  // For kError: what went wrong (INTERNAL when not set), which the serving
  // front half returns as the call's status.
  absl::Status error;
  // On the finishing event, from token sources that know it.
  absl::optional<RequestPlacement> placement;
};

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_REQUEST_H_
