// The step-driven heart of a worker: continuous batching over a paged KV
// cache. Each Step() picks the work of one forward pass under a token
// budget, runs it on the backend, samples and returns the new tokens.
//
// Policy (in this order, each step):
//  1. Running sequences, oldest first, get their next tokens: one for a
//     decoding sequence, the next chunk for one still prefilling. When the
//     KV cache has no block for them, the newest running sequence is
//     preempted: its blocks are freed and it goes back to the head of the
//     waiting queue, to be recomputed (prompt plus the tokens it has
//     generated) when it is admitted again. Its outputs stand; sampling is
//     keyed by (seed, output position), so the continuation is unchanged.
//  2. If nothing was preempted, waiting sequences are admitted in arrival
//     order while budget, sequence slots and blocks last (chunked prefill:
//     a long prompt takes what budget is left and continues next step).
//
// Prefix caching (EngineOptions::prefix_caching, on the allocator's
// AcquireCached/Publish): a sequence admitted with nothing computed first
// takes the longest chain of cached blocks its tokens name (whole blocks,
// at most all its tokens but the last, which must run to give logits) and
// prefills only the rest, from that offset. After every step, each block a
// sequence has filled with computed KV is published under its key (a
// block is matchable only once its KV is written), and a prefilled
// sequence's prompt blocks on adoption. Blocks stay cached after their
// sequence ends, until the allocator evicts them.
//
// Not thread-safe: one thread drives it (see Engine for the threaded shell).

#ifndef TRIDENT_COMMON_ENGINE_ENGINE_CORE_H_
#define TRIDENT_COMMON_ENGINE_ENGINE_CORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/backend/model_backend.h"
#include "common/engine/request.h"
#include "common/kv/block_allocator.h"
#include "common/kv/block_hasher.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"

namespace trident::engine {

struct EngineOptions {
  // Token budget of one forward pass (prefill chunks plus decode tokens).
  int32_t max_batch_tokens = 2048;
  // While any running sequence decodes, prompt chunks (of more than one
  // token) take at most this many of a step's tokens, so that a long prompt
  // arriving does not stretch the decoders' next token (their ITL) by the
  // whole prompt's prefill; it is then computed over several steps. 0: no
  // cap but max_batch_tokens.
  int32_t max_prefill_tokens_while_decoding = 0;
  // While at least prefill_backlog_tokens prompt tokens wait to be computed
  // (over waiting sequences and running ones still in their prompt), the
  // cap above is raised to this many: a backlog the decode batch's steps do
  // not keep up with is prefilled in larger chunks, which compute more
  // tokens per second, at the cost of the decoders' ITL in those steps (a
  // throughput mode under overload; below it the backlog stays short and
  // the cap as it is). 0, or not above the cap: never raised.
  int32_t max_prefill_tokens_when_backlogged = 0;
  int32_t prefill_backlog_tokens = 4096;
  // Most sequences in the running batch.
  int32_t max_running = 256;
  // Reuse the KV of cached prefixes (the allocator must cache: a
  // PrefixCachingBlockAllocator); false: never match nor publish.
  bool prefix_caching = true;
  // What besides the tokens decides the KV (kv::BlockHasher's model): the
  // model, its weights and the KV dtype. Keys agree across processes only
  // where this does.
  std::string cache_model_identity;
  // A waiting prompt whose next uncached block a running sequence is still
  // computing waits for it, at most this many steps (prompts behind it go
  // ahead meanwhile), so that a new shared prefix is computed once rather
  // than by every request that arrives with it. 0: admit in arrival order
  // regardless.
  int32_t shared_prefix_wait_steps = 8;
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t blocks_free = 0;
  int32_t blocks_total = 0;
  // Blocks the first waiting sequence needs before it can start (its next
  // chunk's); 0 when none waits.
  int32_t waiting_head_blocks = 0;
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  // Steps whose prompt chunks took the backlog's raised cap
  // (EngineOptions::max_prefill_tokens_when_backlogged).
  int64_t backlogged_steps_total = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  // Prefix caching, in tokens, counted once per request when it is first
  // admitted (recomputation after preemption is not a query): prompt tokens
  // looked up, and of those found cached.
  int64_t prefix_cache_queries_total = 0;
  int64_t prefix_cache_hits_total = 0;
  // Cached blocks nobody holds (evictable; counted in blocks_free).
  int32_t blocks_cached = 0;
  // The allocator's invariants checked while idle, and found broken.
  int64_t kv_invariant_failures_total = 0;
  // Disaggregated decode: blocks of reserved prompts that the prefix cache
  // held already (the prefill worker did not send them). The Engine
  // shell's.
  int64_t kv_reserved_cached_blocks_total = 0;
  // Tokens of the last step's forward pass.
  int32_t last_step_tokens = 0;
  // Of those, prompt (or recomputation) tokens, and one-token decode
  // sequences.
  int32_t last_step_prefill_tokens = 0;
  int32_t last_step_decode_sequences = 0;
  // Prompt tokens not yet computed, over waiting and running sequences.
  int64_t queued_prefill_tokens = 0;
  // Sum of the context lengths of running sequences past their prompt.
  int64_t batch_context_tokens = 0;
  // The last step ran nothing for want of KV blocks (EngineCore::
  // short_of_blocks).
  bool short_of_blocks = false;
  // CPU-resident sequences (offload): running now, and their KV tokens.
  int32_t remote_running = 0;
  int64_t remote_tokens = 0;
  // Moves to a service, copies released (finished, aborted, demoted), and
  // sequences brought back because their service failed.
  int64_t remote_moves_total = 0;
  // KV tokens of moved sequences: read in place from a service's block
  // store (MoveToRemote's in_place_tokens), and copied there.
  int64_t remote_in_place_tokens_total = 0;
  int64_t remote_copied_tokens_total = 0;
  // Sequences that joined CPU-resident, their prompt written at the
  // service by the prefill worker (AddPrefilled with a remote placement).
  int64_t remote_placed_total = 0;
  int64_t remote_released_total = 0;
  int64_t remote_demoted_total = 0;
  // What else became of moves the offload policy chose
  // (NoteOffloadOutcome): refused by a guard, failed (the sequence stayed
  // resident), or dropped (copied in the background for a sequence that
  // finished or lost its blocks first).
  int64_t remote_held_total = 0;
  int64_t remote_move_failures_total = 0;
  int64_t remote_moves_dropped_total = 0;
  // The offload planner's CPU cost scale (observed over planned CPU
  // attention time, NoteCpuCostScale); 1 without offload.
  double cpu_cost_scale = 1.0;
  // Steps run with a pipelined second sub-batch (BatchPlanner), and the
  // backend's time on CPU-resident sequences' requests: from each request's
  // start to its answer, and of that the time the step stood waiting (the
  // rest was hidden under the backend's work).
  int64_t pipelined_steps_total = 0;
  double remote_round_trip_seconds_total = 0;
  double remote_exposed_seconds_total = 0;
  // The backend's step graphs (ModelBackend::graph_stats).
  backend::GraphStats graphs;
  // Filled in by the Engine shell, which times steps (EWMA over recent
  // steps): prompt tokens per second of steps that computed at least
  // kMinRatePrefillTokens prompt tokens (fewer are all fixed cost), and the
  // duration of decode-only steps. 0 before any such step.
  double prefill_tokens_per_second = 0;
  double decode_step_seconds = 0;
  // Also the Engine shell's: the last step's duration (0 before any), and
  // the loop's time in the step hook before steps (offload moves copy KV
  // there while every running sequence waits).
  double last_step_seconds = 0;
  double step_hook_seconds_total = 0;
  // Also the Engine shell's: the steps' event batches whose callbacks its
  // delivery thread has begun, and their time queued (from the loop's
  // handing them over to that start), summed. A mean lag near a step's
  // duration or above it means the callbacks fall behind the steps.
  int64_t delivered_batches_total = 0;
  double delivery_lag_seconds_total = 0;
};

// A resident decoding sequence that could move to an attention service
// (EngineCore::OffloadCandidates).
// A chosen move that did not happen: refused by a guard, failed, or
// dropped (EngineStats).
enum class OffloadOutcome { kHeld, kFailed, kDropped };

struct OffloadCandidate {
  std::string id;
  // Its blocks (token order), holding positions [0, num_computed).
  std::vector<int32_t> blocks;
  // Keys of its full blocks whose KV is written (prefix caching on), in
  // token order: a service's block store may hold them for the move to
  // read in place.
  std::vector<kv::BlockKey> keys;
  int32_t num_computed = 0;
  // Prompt plus max_tokens: the most positions it can reach.
  int32_t max_len = 0;
  uint64_t arrival = 0;
  // Changes whenever its blocks are freed (preempted, moved): a copy of its
  // KV read from `blocks` while the engine ran on is whole only if the
  // sequence is still a candidate with the same residency afterwards.
  uint32_t residency = 0;
};

// Chooses how a step's batch runs: which CPU-resident sequences form a
// second, pipelined sub-batch (backend::StepSequence::sub_batch). Called on
// the loop thread after the batch is built, only when it has CPU-resident
// sequences and the backend supports_pipelining(); must be quick.
class BatchPlanner {
 public:
  virtual ~BatchPlanner() = default;
  virtual void PlanBatch(absl::Span<backend::StepSequence> batch) = 0;
};

class EngineCore {
 public:
  // `backend` and `allocator` must outlive the core; the allocator must
  // manage exactly the backend's KV blocks.
  EngineCore(backend::ModelBackend* backend, kv::BlockAllocator* allocator, EngineOptions options);
  ~EngineCore();

  // Checks a request against the model and cache limits without queuing it
  // (safe to call from any thread). INVALID_ARGUMENT for an empty prompt, a
  // token outside the vocabulary, max_tokens < 1, or prompt + max_tokens
  // beyond the context window or the whole KV cache.
  // `remote`: the sequence's KV is at an attention service (CPU-placed), so
  // it need not fit this worker's KV cache.
  absl::Status Validate(const EngineRequest& request, bool remote = false) const;

  // Queues a request; ALREADY_EXISTS when its id is live.
  absl::Status Add(EngineRequest request);

  // Adopts a sequence whose prompt KV another engine computed (disaggregated
  // decode): `blocks` (ceil(prompt / block_size) ids from this core's
  // allocator, already holding the prompt's KV, in token order) become the
  // sequence's; `first_token` is its output 0, sampled by the prefill side.
  // The next step decodes output 1. Validate's errors, plus INVALID_ARGUMENT
  // for a wrong block count or a first token outside the vocabulary, and
  // ALREADY_EXISTS for a live id; on error the blocks stay the caller's.
  // With `remote` set, the prompt's KV is at that attention service instead
  // (a CPU-placed sequence, `blocks` empty): the sequence is CPU-resident
  // from its first decode step, as if moved there (MoveToRemote).
  absl::Status AddPrefilled(EngineRequest request, std::vector<int32_t> blocks, int32_t first_token,
                            backend::RemoteKv remote = {}, std::string service_id = "");

  // CPU-resident sequences (NEO-style offload). A sequence moves to an
  // attention service between decode steps, after its caller copied
  // positions [0, num_computed) of its KV there: MoveToRemote frees its
  // blocks, and from then on each step names `remote` for it (the backend
  // sends its q/k/v and takes o). NOT_FOUND for an id not live;
  // FAILED_PRECONDITION if it is not between decode steps or is remote
  // already; INVALID_ARGUMENT for an empty `remote`.
  // `service_id` names the service in the request's placement (on its
  // finishing event); the service read its first `in_place_tokens` from its
  // block store rather than from a copy (counted in the stats).
  absl::Status MoveToRemote(const std::string& id, backend::RemoteKv remote,
                            std::string service_id = "", int32_t in_place_tokens = 0);
  // Resident sequences between decode steps, oldest first.
  std::vector<OffloadCandidate> OffloadCandidates() const;
  // Counts what became of a move the offload policy chose, when it did not
  // happen (EngineStats::remote_held_total and the two after it).
  void NoteOffloadOutcome(OffloadOutcome outcome);
  // The offload planner's current CPU cost scale, for the stats.
  void NoteCpuCostScale(double scale) { stats_.cpu_cost_scale = scale; }
  // Called (on the stepping thread) when a CPU-resident sequence no longer
  // needs its copy at the service: it finished, was aborted, or its service
  // failed (a step's forward named it: its sequences come back and are
  // recomputed here, as preempted ones are).
  // Null: every batch runs as one.
  void set_batch_planner(BatchPlanner* planner) { planner_ = planner; }
  void set_remote_listener(
      std::function<void(const std::string& id, const backend::RemoteKv& remote)> listener) {
    remote_listener_ = std::move(listener);
  }

  // Frees the blocks a kPrefilled event handed over. Returns false when `id`
  // holds none.
  bool ReleasePrefilled(const std::string& id);

  // Ends a request and frees its blocks. Returns false when the id is not
  // live (already finished or never added).
  bool Abort(const std::string& id);

  // Runs one forward pass (if there is work) and returns the tokens it
  // produced, finished requests included. An error from the backend fails
  // every sequence of the step (their events carry kError, and it is logged);
  // the core stays usable. An error status means a broken invariant. When no
  // sequence can get the blocks it needs (they are held outside the running
  // set: KV reservations, prompts handed over and not yet released), it runs
  // nothing, returns no events and short_of_blocks() is true until a step
  // runs again.
  absl::StatusOr<std::vector<TokenEvent>> Step();

  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }
  // The last Step ran nothing for want of KV blocks: stepping again only
  // helps once blocks come back (a release, an abort) or work arrives.
  bool short_of_blocks() const { return short_of_blocks_; }
  // Blocks handed over by kPrefilled events and not yet released.
  int32_t prefilled_blocks_held() const;
  EngineStats stats() const;

  // Immutable after construction (safe from any thread).
  bool prefix_caching() const { return options_.prefix_caching; }
  const kv::BlockHasher& hasher() const { return hasher_; }

  // Checks the allocator's invariants (BlockAllocator::CheckInvariants) and
  // counts a failure in the stats (logged). For idle moments and tests.
  absl::Status CheckKvInvariants();

 private:
  struct Sequence;
  using SeqPtr = std::unique_ptr<Sequence>;

  // Positions a waiting `seq` must hold blocks for to start a chunk of
  // `chunk` tokens (a prefill-only sequence takes its whole prompt's up
  // front).
  static int32_t StartReservation(const Sequence& seq, int32_t chunk);
  // Makes `seq` own enough blocks for `num_tokens` positions; false when
  // the allocator lacks them (nothing is allocated then).
  bool EnsureBlocks(Sequence& seq, int32_t num_tokens);
  void FreeBlocks(Sequence& seq);
  // Prefix caching: `seq` (holding no blocks) takes its longest cached
  // prefix; CountPrefix counts its query once, when it is admitted.
  void MatchPrefix(Sequence& seq);
  void CountPrefix(Sequence& seq);
  // The keys of blocks running sequences are computing (not yet cached).
  absl::flat_hash_set<kv::BlockKey> InFlightKeys() const;
  // Whether waiting `seq`, just matched, should wait for a block in
  // `in_flight` (and so gives its matched blocks back).
  bool WaitsForSharedPrefix(Sequence& seq, const absl::flat_hash_set<kv::BlockKey>& in_flight);
  // Publishes the blocks `seq` has filled with computed KV.
  void PublishBlocks(Sequence& seq);
  void Preempt(std::list<SeqPtr>::iterator it);
  // Forgets `seq`'s remote copy, telling the listener.
  void DropRemote(Sequence& seq);
  // Brings every sequence of `service` back for recompute; returns how many.
  // Those that can never fit this worker's KV cache (placed on the CPU for
  // that reason) end instead: an kError event each in `events`.
  int DemoteRemote(const transport::attention::RemoteAttention* service,
                   std::vector<TokenEvent>* events);
  // Whether a sequence of `total_tokens` can ever fit the KV cache.
  bool FitsCache(int64_t total_tokens) const;

  // Frees the blocks of the newest waiting sequence that holds any (never
  // the oldest), which will be recomputed; false when none holds blocks.
  bool FreeNewestWaitingBlocks();
  // A step's budget: the forward pass's tokens, and of those what prompt
  // chunks (more than one token left to compute) may take.
  struct StepBudget {
    int32_t tokens;
    int32_t prefill;
    // The prompt chunks' cap was raised for a backlog.
    bool backlogged = false;
    // The chunk a sequence with `remaining` tokens to compute gets (0: none).
    int32_t ChunkFor(int32_t remaining) const;
    void Spend(int32_t remaining, int32_t chunk);
  };
  // This step's budget: max_batch_tokens, with prompt chunks capped by
  // max_prefill_tokens_while_decoding while a running sequence decodes
  // (max_prefill_tokens_when_backlogged while the backlog lasts).
  StepBudget NewStepBudget() const;
  // Whether prompt tokens not yet computed number at least `tokens`.
  bool PrefillBacklogAtLeast(int64_t tokens) const;
  // Step's parts. The running sequences' next chunks within `budget`,
  // preempting the newest for blocks (sets `preempted`).
  std::vector<Sequence*> ScheduleRunning(StepBudget* budget, bool* preempted);
  // Admits waiting sequences while budget, slots and blocks last.
  void AdmitWaiting(StepBudget* budget, std::vector<Sequence*>* scheduled);
  // The backend's view of the step; `rows` counts the sequences that sample.
  std::vector<backend::StepSequence> BuildBatch(const std::vector<Sequence*>& scheduled,
                                                int32_t* rows);
  // Runs the forward pass (sampling on the device where the backend does),
  // reporting prompts' layers as they complete.
  absl::Status Forward(const std::vector<Sequence*>& scheduled,
                       const std::vector<backend::StepSequence>& batch, int32_t rows,
                       std::vector<sampling::SampledToken>* sampled_rows);
  // Samples `seq`'s next token from `row` and decides whether it finishes.
  TokenEvent SampleNext(Sequence& seq, int32_t row,
                        std::vector<sampling::SampledToken>* sampled_rows);

  backend::ModelBackend* backend_;
  kv::BlockAllocator* allocator_;
  EngineOptions options_;
  int32_t block_size_;
  int32_t vocab_size_;
  // Oldest first.
  std::list<SeqPtr> running_;
  std::deque<SeqPtr> waiting_;
  absl::flat_hash_map<std::string, Sequence*> live_;
  // kPrefilled requests' blocks, until ReleasePrefilled.
  absl::flat_hash_map<std::string, std::vector<int32_t>> prefilled_;
  uint64_t next_arrival_ = 0;
  sampling::Sampler sampler_;
  std::vector<float> logits_;
  EngineStats stats_;
  std::function<void(const std::string&, const backend::RemoteKv&)> remote_listener_;
  BatchPlanner* planner_ = nullptr;
  bool short_of_blocks_ = false;
  kv::BlockHasher hasher_;
};

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_ENGINE_CORE_H_
