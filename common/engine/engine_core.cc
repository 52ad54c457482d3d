#include "common/engine/engine_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::engine {

struct EngineCore::Sequence {
  EngineRequest request;
  // Prompt followed by the outputs so far.
  std::vector<int32_t> tokens;
  int32_t prompt_len = 0;
  // Positions whose KV is in the cache.
  int32_t num_computed = 0;
  std::vector<int32_t> blocks;
  // How many times its blocks were freed (OffloadCandidate::residency).
  uint32_t blocks_freed = 0;
  int32_t num_outputs = 0;
  uint64_t arrival = 0;
  std::unique_ptr<sampling::PenaltyState> penalties;
  // This step's chunk (set while a step is built).
  int32_t chunk = 0;
  // Set while the sequence is CPU-resident: an attention service holds its
  // KV (it holds no blocks then).
  backend::RemoteKv remote;
  // The last attention service it moved to (placement), even if it came
  // back.
  std::string attention_service_id;
  // Prefix caching: the chain's root (model and salt), the keys of its full
  // blocks so far (they depend only on the tokens, so they outlive its
  // blocks), how many of its blocks are published, whether its first
  // admission counted its query, and its prompt tokens found cached then.
  kv::BlockKey root;
  std::vector<kv::BlockKey> keys;
  int32_t num_published = 0;
  bool prefix_counted = false;
  int32_t cached_tokens = 0;
  // Steps it has waited for a shared prefix another sequence computes.
  int32_t shared_prefix_waits = 0;

  // Prompt tokens whose KV is still to be computed (queued prefill).
  int32_t UncomputedPromptTokens() const { return std::max(0, prompt_len - num_computed); }
};

EngineCore::EngineCore(backend::ModelBackend* backend, kv::BlockAllocator* allocator,
                       EngineOptions options)
    : backend_(backend),
      allocator_(allocator),
      options_(options),
      block_size_(backend->kv_capacity().block_size),
      vocab_size_(backend->vocab_size()),
      hasher_(block_size_, options_.cache_model_identity) {
  TRIDENT_CHECK(options_.max_batch_tokens > 0);
  TRIDENT_CHECK(options_.max_running > 0);
  TRIDENT_CHECK(allocator_->num_total() == backend->kv_capacity().num_blocks);
}

EngineCore::~EngineCore() {
  for (auto& seq : running_) FreeBlocks(*seq);
  for (auto& seq : waiting_) FreeBlocks(*seq);
  for (auto& [id, blocks] : prefilled_) TRIDENT_CHECK_OK(allocator_->Free(blocks));
}

namespace {

// The most positions a request can reach: its prompt (without the outputs
// it resumes with) plus max_tokens.
int64_t MaxLen(const EngineRequest& request) {
  return static_cast<int64_t>(request.prompt.size()) - request.resumed_outputs +
         request.max_tokens;
}

// The sampling penalties' state of a new sequence: the prompt, then the
// outputs it resumes with.
std::unique_ptr<sampling::PenaltyState> PenaltiesFor(const EngineRequest& request) {
  const auto prompt_end = request.prompt.end() - request.resumed_outputs;
  auto penalties = std::make_unique<sampling::PenaltyState>(absl::MakeConstSpan(
      request.prompt.data(), request.prompt.size() - request.resumed_outputs));
  for (auto it = prompt_end; it != request.prompt.end(); ++it) penalties->AddOutputToken(*it);
  return penalties;
}

}  // namespace

bool EngineCore::FitsCache(int64_t total_tokens) const {
  return (total_tokens + block_size_ - 1) / block_size_ <= allocator_->num_total();
}

absl::Status EngineCore::Validate(const EngineRequest& request, bool remote) const {
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("prompt has no tokens");
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", request.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab_size_,
                                                     ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be at least 1, got ", request.max_tokens));
  }
  if (request.resumed_outputs < 0 || request.resumed_outputs >= request.max_tokens ||
      static_cast<size_t>(request.resumed_outputs) >= request.prompt.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resumed_outputs is ", request.resumed_outputs, "; it must be in [0, max_tokens ",
        request.max_tokens, ") and leave a prompt token of the ", request.prompt.size()));
  }
  const int64_t total = MaxLen(request);
  if (total > backend_->max_model_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request.prompt.size() - request.resumed_outputs, " tokens) + max_tokens (",
        request.max_tokens, ") exceeds the context window of ", backend_->max_model_len(),
        " tokens"));
  }
  const int64_t blocks_needed = (total + block_size_ - 1) / block_size_;
  if (!remote && !FitsCache(total)) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + max_tokens needs ", blocks_needed,
                                                   " KV blocks but the cache has ",
                                                   allocator_->num_total()));
  }
  return absl::OkStatus();
}

absl::Status EngineCore::Add(EngineRequest request) {
  TRIDENT_RETURN_IF_ERROR(Validate(request));
  if (live_.contains(request.id) || prefilled_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already running"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->prompt_len = static_cast<int32_t>(request.prompt.size());
  seq->num_outputs = request.resumed_outputs;
  seq->arrival = next_arrival_++;
  seq->penalties = PenaltiesFor(request);
  seq->root = hasher_.Root(request.cache_salt);
  seq->request = std::move(request);
  live_[seq->request.id] = seq.get();
  stats_.prompt_tokens_total += seq->prompt_len;
  waiting_.push_back(std::move(seq));
  return absl::OkStatus();
}

absl::Status EngineCore::AddPrefilled(EngineRequest request, std::vector<int32_t> blocks,
                                      int32_t first_token, backend::RemoteKv remote,
                                      std::string service_id) {
  TRIDENT_RETURN_IF_ERROR(Validate(request, remote.service != nullptr));
  if (live_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already running"));
  }
  const int32_t prompt_len = static_cast<int32_t>(request.prompt.size());
  const size_t want = remote.service != nullptr
                          ? 0
                          : static_cast<size_t>((prompt_len + block_size_ - 1) / block_size_);
  if (blocks.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("a prompt of ", prompt_len, " tokens needs ",
                                                   want, " KV blocks, got ", blocks.size()));
  }
  if (first_token < 0 || first_token >= vocab_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "first token ", first_token, " outside the vocabulary [0, ", vocab_size_, ")"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->tokens.push_back(first_token);
  seq->prompt_len = prompt_len;
  seq->num_computed = prompt_len;
  seq->blocks = std::move(blocks);
  seq->remote = remote;
  seq->attention_service_id = std::move(service_id);
  if (remote.service != nullptr) ++stats_.remote_placed_total;
  seq->num_outputs = request.resumed_outputs + 1;
  seq->arrival = next_arrival_++;
  seq->penalties = PenaltiesFor(request);
  seq->penalties->AddOutputToken(first_token);
  seq->root = hasher_.Root(request.cache_salt);
  seq->request = std::move(request);
  live_[seq->request.id] = seq.get();
  ++stats_.generated_tokens_total;
  // Its prompt's KV is here, whole: a later turn of the conversation finds
  // it.
  PublishBlocks(*seq);
  waiting_.push_back(std::move(seq));
  return absl::OkStatus();
}

bool EngineCore::ReleasePrefilled(const std::string& id) {
  auto it = prefilled_.find(id);
  if (it == prefilled_.end()) return false;
  TRIDENT_CHECK_OK(allocator_->Free(it->second));
  prefilled_.erase(it);
  return true;
}

int32_t EngineCore::prefilled_blocks_held() const {
  int32_t n = 0;
  for (const auto& [id, blocks] : prefilled_) n += static_cast<int32_t>(blocks.size());
  return n;
}

int32_t EngineCore::StartReservation(const Sequence& seq, int32_t chunk) {
  return seq.request.prefill_only ? seq.prompt_len : seq.num_computed + chunk;
}

bool EngineCore::EnsureBlocks(Sequence& seq, int32_t num_tokens) {
  if (seq.remote.service != nullptr) return true;  // Its KV grows at the service.
  const int32_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const int32_t missing = needed - static_cast<int32_t>(seq.blocks.size());
  if (missing <= 0) return true;
  if (allocator_->num_free() < missing) return false;
  auto blocks = allocator_->Allocate(missing);
  if (!blocks.ok()) return false;
  seq.blocks.insert(seq.blocks.end(), blocks->begin(), blocks->end());
  return true;
}

void EngineCore::FreeBlocks(Sequence& seq) {
  if (seq.blocks.empty()) return;
  TRIDENT_CHECK_OK(allocator_->Free(seq.blocks));
  seq.blocks.clear();
  seq.num_published = 0;
  ++seq.blocks_freed;
}

void EngineCore::MatchPrefix(Sequence& seq) {
  // Whole blocks only, and never the last token: it must run to give the
  // logits of the next.
  const size_t usable = (seq.tokens.size() - 1) / static_cast<size_t>(block_size_);
  hasher_.Extend(seq.root, seq.tokens, &seq.keys, usable);
  seq.blocks =
      allocator_->AcquireCached(absl::MakeConstSpan(seq.keys).first(std::min(usable, seq.keys.size())));
  seq.num_published = static_cast<int32_t>(seq.blocks.size());
  seq.num_computed = seq.num_published * block_size_;
}

void EngineCore::CountPrefix(Sequence& seq) {
  if (seq.prefix_counted) return;
  seq.prefix_counted = true;
  seq.cached_tokens = std::min(seq.num_computed, seq.prompt_len);
  stats_.prefix_cache_queries_total += seq.prompt_len;
  stats_.prefix_cache_hits_total += seq.cached_tokens;
}

void EngineCore::PublishBlocks(Sequence& seq) {
  if (!options_.prefix_caching || seq.remote.service != nullptr) return;
  const int32_t full =
      std::min(seq.num_computed / block_size_, static_cast<int32_t>(seq.blocks.size()));
  if (full <= seq.num_published) return;
  hasher_.Extend(seq.root, seq.tokens, &seq.keys, static_cast<size_t>(full));
  for (int32_t i = seq.num_published; i < full; ++i) {
    // False for a duplicate (another block holds the key): this one stays
    // the sequence's alone.
    allocator_->Publish(seq.blocks[i], seq.keys[i]);
  }
  seq.num_published = full;
}

absl::Status EngineCore::CheckKvInvariants() {
  absl::Status status = allocator_->CheckInvariants();
  if (!status.ok()) {
    ++stats_.kv_invariant_failures_total;
    TRIDENT_LOG(ERROR) << "KV block pool invariant broken: " << status;
  }
  return status;
}

bool EngineCore::FreeNewestWaitingBlocks() {
  for (auto it = waiting_.rbegin(); it != waiting_.rend() && std::next(it) != waiting_.rend();
       ++it) {
    Sequence& seq = **it;
    if (seq.blocks.empty()) continue;
    FreeBlocks(seq);
    seq.num_computed = 0;
    seq.chunk = 0;
    ++stats_.preemptions_total;
    TRIDENT_LOG(DEBUG) << "freed the blocks of waiting request " << seq.request.id << " at "
                       << seq.tokens.size() << " tokens";
    return true;
  }
  return false;
}

void EngineCore::Preempt(std::list<SeqPtr>::iterator it) {
  SeqPtr seq = std::move(*it);
  running_.erase(it);
  FreeBlocks(*seq);
  seq->num_computed = 0;
  seq->chunk = 0;
  ++stats_.preemptions_total;
  TRIDENT_LOG(DEBUG) << "preempted request " << seq->request.id << " at " << seq->tokens.size()
                     << " tokens";
  waiting_.push_front(std::move(seq));
}

bool EngineCore::Abort(const std::string& id) {
  auto live = live_.find(id);
  if (live == live_.end()) return false;
  Sequence* target = live->second;
  live_.erase(live);
  DropRemote(*target);
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == target) {
      FreeBlocks(**it);
      running_.erase(it);
      return true;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->get() == target) {
      FreeBlocks(**it);
      waiting_.erase(it);
      return true;
    }
  }
  return true;
}

absl::StatusOr<std::vector<TokenEvent>> EngineCore::Step() {
  std::vector<TokenEvent> events;
  if (!HasWork()) return events;
  StepBudget budget = NewStepBudget();
  if (budget.backlogged) ++stats_.backlogged_steps_total;
  bool preempted = false;
  // 1. Running sequences, oldest first; 2. waiting ones, unless a running
  // sequence had to be preempted.
  std::vector<Sequence*> scheduled = ScheduleRunning(&budget, &preempted);
  if (!preempted) AdmitWaiting(&budget, &scheduled);
  // Nothing runs and the oldest waiting sequence lacks blocks: newer waiting
  // sequences give theirs up (those handed over by a prefill worker hold
  // their prompt's), to be recomputed when their turn comes, as a
  // preempted one is.
  while (scheduled.empty() && running_.empty() && FreeNewestWaitingBlocks()) {
    AdmitWaiting(&budget, &scheduled);
  }
  short_of_blocks_ = scheduled.empty();
  if (scheduled.empty()) {
    // Every free block is spoken for outside the running set (KV
    // reservations, prompts handed over but not yet released): nothing can
    // run until some come back. The caller waits for a change.
    return events;
  }

  // 3. Forward.
  int32_t rows = 0;
  std::vector<backend::StepSequence> batch = BuildBatch(scheduled, &rows);
  if (planner_ != nullptr && backend_->supports_pipelining() &&
      std::any_of(batch.begin(), batch.end(),
                  [](const backend::StepSequence& s) { return s.remote.service != nullptr; })) {
    planner_->PlanBatch(absl::MakeSpan(batch));
    if (std::any_of(batch.begin(), batch.end(),
                    [](const backend::StepSequence& s) { return s.sub_batch != 0; })) {
      ++stats_.pipelined_steps_total;
    }
  }
  std::vector<sampling::SampledToken> sampled_rows;
  const absl::Status status = Forward(scheduled, batch, rows, &sampled_rows);
  const transport::attention::RemoteAttention* failed_service =
      status.ok() ? nullptr : backend::FailedRemoteAttention(status);
  if (failed_service != nullptr) {
    // An attention service is gone: its sequences come back here and are
    // recomputed; the step is retried without them (its outputs stand:
    // nothing was sampled).
    // Before the demotion, which may end (and free) sequences of this step
    // that no longer fit here.
    for (Sequence* seq : scheduled) seq->chunk = 0;
    const int demoted = DemoteRemote(failed_service, &events);
    TRIDENT_LOG(WARNING) << status.message() << "; its " << demoted
                         << " sequences are recomputed here";
    return events;
  }
  if (!status.ok()) {
    for (Sequence* seq : scheduled) {
      TokenEvent ev;
      ev.request_id = seq->request.id;
      ev.output_index = seq->num_outputs;
      ev.finish = FinishReason::kError;
      events.push_back(std::move(ev));
      Abort(seq->request.id);
    }
    TRIDENT_LOG(ERROR) << "forward pass failed; failing its " << scheduled.size()
                       << " sequences: " << status;
    return events;
  }

  // 4. Sample and check stops.
  int32_t row = 0;
  std::vector<std::string> finished;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i];
    seq.num_computed += seq.chunk;
    seq.chunk = 0;
    PublishBlocks(seq);
    if (!batch[i].want_logits) continue;
    TokenEvent ev = SampleNext(seq, row, &sampled_rows);
    ++row;
    if (ev.finish != FinishReason::kNone) finished.push_back(seq.request.id);
    events.push_back(std::move(ev));
  }
  for (const std::string& id : finished) Abort(id);
  return events;
}

int32_t EngineCore::StepBudget::ChunkFor(int32_t remaining) const {
  return remaining > 1 ? std::min({remaining, tokens, prefill}) : std::min(remaining, tokens);
}

void EngineCore::StepBudget::Spend(int32_t remaining, int32_t chunk) {
  tokens -= chunk;
  if (remaining > 1) prefill -= chunk;
}

EngineCore::StepBudget EngineCore::NewStepBudget() const {
  StepBudget budget{options_.max_batch_tokens, options_.max_batch_tokens};
  if (options_.max_prefill_tokens_while_decoding <= 0) return budget;
  for (const SeqPtr& seq : running_) {
    if (seq->num_computed >= seq->prompt_len &&
        seq->num_computed + 1 == static_cast<int32_t>(seq->tokens.size())) {
      int32_t cap = options_.max_prefill_tokens_while_decoding;
      if (options_.max_prefill_tokens_when_backlogged > cap &&
          PrefillBacklogAtLeast(options_.prefill_backlog_tokens)) {
        cap = options_.max_prefill_tokens_when_backlogged;
        budget.backlogged = true;
      }
      budget.prefill = std::min(budget.prefill, cap);
      break;
    }
  }
  return budget;
}

bool EngineCore::PrefillBacklogAtLeast(int64_t tokens) const {
  int64_t backlog = 0;
  auto add = [&](const SeqPtr& seq) {
    backlog += seq->UncomputedPromptTokens();
    return backlog >= tokens;
  };
  return std::any_of(waiting_.begin(), waiting_.end(), add) ||
         std::any_of(running_.begin(), running_.end(), add);
}

std::vector<EngineCore::Sequence*> EngineCore::ScheduleRunning(StepBudget* budget,
                                                               bool* preempted) {
  std::vector<Sequence*> scheduled;
  for (auto it = running_.begin(); it != running_.end() && budget->tokens > 0;) {
    Sequence& seq = **it;
    const int32_t remaining = static_cast<int32_t>(seq.tokens.size()) - seq.num_computed;
    const int32_t chunk = budget->ChunkFor(remaining);
    if (chunk == 0 && remaining > 0) {
      ++it;  // A prompt, with the step's prompt tokens spent: the decoders go on.
      continue;
    }
    bool ok = EnsureBlocks(seq, seq.num_computed + chunk);
    while (!ok) {
      // Preempt the newest running sequence; it may be this one. Prefill-only
      // sequences own their whole prompt's blocks and are never victims.
      auto victim = std::prev(running_.end());
      // CPU-resident ones hold no blocks: preempting them frees nothing.
      while (victim != it &&
             ((*victim)->request.prefill_only || (*victim)->remote.service != nullptr)) {
        --victim;
      }
      *preempted = true;
      if (victim == it) {
        Preempt(victim);
        it = running_.end();
        break;
      }
      Preempt(victim);
      ok = EnsureBlocks(seq, seq.num_computed + chunk);
    }
    if (!ok) break;
    seq.chunk = chunk;
    budget->Spend(remaining, chunk);
    scheduled.push_back(&seq);
    ++it;
  }
  return scheduled;
}

absl::flat_hash_set<kv::BlockKey> EngineCore::InFlightKeys() const {
  absl::flat_hash_set<kv::BlockKey> keys;
  if (!options_.prefix_caching || options_.shared_prefix_wait_steps <= 0) return keys;
  for (const SeqPtr& seq : running_) {
    for (size_t i = static_cast<size_t>(seq->num_published); i < seq->keys.size(); ++i) {
      keys.insert(seq->keys[i]);
    }
  }
  return keys;
}

bool EngineCore::WaitsForSharedPrefix(Sequence& seq,
                                      const absl::flat_hash_set<kv::BlockKey>& in_flight) {
  const size_t next = seq.blocks.size();
  if (seq.shared_prefix_waits >= options_.shared_prefix_wait_steps || next >= seq.keys.size() ||
      !in_flight.contains(seq.keys[next])) {
    return false;
  }
  ++seq.shared_prefix_waits;
  // Matched again, further, once the block is cached.
  if (!seq.blocks.empty()) TRIDENT_CHECK_OK(allocator_->Free(seq.blocks));
  seq.blocks.clear();
  seq.num_published = 0;
  seq.num_computed = 0;
  return true;
}

void EngineCore::AdmitWaiting(StepBudget* budget, std::vector<Sequence*>* scheduled) {
  absl::flat_hash_set<kv::BlockKey> in_flight = InFlightKeys();
  size_t i = 0;
  while (budget->tokens > 0 && i < waiting_.size() &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    Sequence& seq = *waiting_[i];
    if (budget->prefill <= 0 && static_cast<int32_t>(seq.tokens.size()) - seq.num_computed > 1) {
      ++i;  // A prompt, with the step's prompt tokens spent; a handed-over one may go.
      continue;
    }
    if (options_.prefix_caching && seq.blocks.empty() && seq.num_computed == 0 &&
        seq.remote.service == nullptr) {
      MatchPrefix(seq);
      if (WaitsForSharedPrefix(seq, in_flight)) {
        ++i;  // The ones behind it go ahead.
        continue;
      }
      CountPrefix(seq);
    }
    const int32_t remaining = static_cast<int32_t>(seq.tokens.size()) - seq.num_computed;
    const int32_t chunk = budget->ChunkFor(remaining);
    if (!EnsureBlocks(seq, StartReservation(seq, chunk))) break;
    seq.chunk = chunk;
    budget->Spend(remaining, chunk);
    scheduled->push_back(&seq);
    // What it computes from now on is in flight for those behind it.
    for (size_t k = seq.blocks.size(); k < seq.keys.size(); ++k) in_flight.insert(seq.keys[k]);
    running_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

std::vector<backend::StepSequence> EngineCore::BuildBatch(const std::vector<Sequence*>& scheduled,
                                                          int32_t* rows) {
  std::vector<backend::StepSequence> batch;
  batch.reserve(scheduled.size());
  int32_t step_tokens = 0;
  int32_t prefill_tokens = 0;
  int32_t decode_sequences = 0;
  for (Sequence* seq : scheduled) {
    const bool decoding = seq->chunk == 1 &&
                          seq->num_computed + 1 == static_cast<int32_t>(seq->tokens.size()) &&
                          seq->num_computed >= seq->prompt_len;
    if (decoding) {
      ++decode_sequences;
    } else {
      prefill_tokens += seq->chunk;
    }
    backend::StepSequence s;
    s.tokens = absl::MakeConstSpan(seq->tokens).subspan(seq->num_computed, seq->chunk);
    s.start_position = seq->num_computed;
    s.block_table = seq->blocks;
    s.remote = seq->remote;
    s.want_logits = seq->num_computed + seq->chunk == static_cast<int32_t>(seq->tokens.size());
    *rows += s.want_logits ? 1 : 0;
    step_tokens += seq->chunk;
    batch.push_back(s);
  }
  ++stats_.steps_total;
  stats_.last_step_tokens = step_tokens;
  stats_.last_step_prefill_tokens = prefill_tokens;
  stats_.last_step_decode_sequences = decode_sequences;
  return batch;
}

absl::Status EngineCore::Forward(const std::vector<Sequence*>& scheduled,
                                 const std::vector<backend::StepSequence>& batch, int32_t rows,
                                 std::vector<sampling::SampledToken>* sampled_rows) {
  // Prompts whose last chunk runs now report each layer as it completes.
  struct LayerWatcher {
    std::function<void(int32_t, const std::vector<int32_t>&)> fn;
    std::vector<int32_t> blocks;
  };
  std::vector<LayerWatcher> watchers;
  if (backend_->reports_layer_progress()) {
    for (size_t i = 0; i < scheduled.size(); ++i) {
      const Sequence& seq = *scheduled[i];
      if (!seq.request.prefill_only || !seq.request.on_layer_done || !batch[i].want_logits) {
        continue;
      }
      const size_t prompt_blocks =
          static_cast<size_t>((seq.prompt_len + block_size_ - 1) / block_size_);
      watchers.push_back(
          {seq.request.on_layer_done,
           std::vector<int32_t>(seq.blocks.begin(), seq.blocks.begin() + prompt_blocks)});
    }
  }
  if (!watchers.empty()) {
    backend_->set_layer_observer([&watchers](int32_t layer) {
      for (const LayerWatcher& w : watchers) w.fn(layer, w.blocks);
    });
  }
  absl::Status status;
  if (backend_->samples_on_device()) {
    std::vector<backend::RowSampling> row_params;
    row_params.reserve(static_cast<size_t>(rows));
    for (size_t i = 0; i < scheduled.size(); ++i) {
      if (!batch[i].want_logits) continue;
      const Sequence& seq = *scheduled[i];
      row_params.push_back({&seq.request.sampling, seq.penalties.get(), seq.num_outputs});
    }
    sampled_rows->resize(static_cast<size_t>(rows));
    status = backend_->ForwardSample(batch, row_params, absl::MakeSpan(*sampled_rows));
  } else {
    logits_.resize(static_cast<size_t>(rows) * vocab_size_);
    status = backend_->Forward(batch, logits_.data());
  }
  if (!watchers.empty()) backend_->set_layer_observer(nullptr);
  return status;
}

TokenEvent EngineCore::SampleNext(Sequence& seq, int32_t row,
                                  std::vector<sampling::SampledToken>* sampled_rows) {
  sampling::SampledToken sampled;
  if (backend_->samples_on_device()) {
    sampled = std::move((*sampled_rows)[static_cast<size_t>(row)]);
  } else {
    const float* row_logits = logits_.data() + static_cast<size_t>(row) * vocab_size_;
    sampled = sampler_.Sample(absl::MakeConstSpan(row_logits, vocab_size_), seq.request.sampling,
                              *seq.penalties, seq.num_outputs);
  }
  TokenEvent ev;
  ev.request_id = seq.request.id;
  ev.token = sampled.token;
  ev.logprob = sampled.logprob;
  ev.top_logprobs = std::move(sampled.top_logprobs);
  ev.output_index = seq.num_outputs;
  if (seq.num_outputs == seq.request.resumed_outputs) ev.cached_tokens = seq.cached_tokens;
  seq.tokens.push_back(sampled.token);
  seq.penalties->AddOutputToken(sampled.token);
  ++seq.num_outputs;
  ++stats_.generated_tokens_total;
  const auto& stops = seq.request.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), sampled.token) != stops.end()) {
    ev.finish = FinishReason::kStop;
    ev.matched_stop_token = sampled.token;
  } else if (seq.num_outputs >= seq.request.max_tokens ||
             static_cast<int32_t>(seq.tokens.size()) >= backend_->max_model_len()) {
    ev.finish = FinishReason::kLength;
  }
  if (ev.finish == FinishReason::kNone && seq.request.prefill_only) {
    // Hand the prompt's blocks over; the sequence ends here.
    ev.finish = FinishReason::kPrefilled;
    seq.blocks.resize(static_cast<size_t>((seq.prompt_len + block_size_ - 1) / block_size_));
    ev.prefilled_blocks = seq.blocks;
    prefilled_[seq.request.id] = std::move(seq.blocks);
    seq.blocks.clear();
  }
  if (ev.finish != FinishReason::kNone && !seq.attention_service_id.empty()) {
    RequestPlacement placement;
    placement.attention_service_id = seq.attention_service_id;
    ev.placement = std::move(placement);
  }
  return ev;
}

void EngineCore::DropRemote(Sequence& seq) {
  if (seq.remote.service == nullptr) return;
  const backend::RemoteKv remote = seq.remote;
  seq.remote = backend::RemoteKv{};
  ++stats_.remote_released_total;
  if (remote_listener_) remote_listener_(seq.request.id, remote);
}

int EngineCore::DemoteRemote(const transport::attention::RemoteAttention* service,
                             std::vector<TokenEvent>* events) {
  int demoted = 0;
  std::vector<std::string> unfittable;
  auto demote = [&](Sequence& seq) {
    DropRemote(seq);
    ++stats_.remote_demoted_total;
    ++demoted;
    if (!FitsCache(MaxLen(seq.request))) {
      unfittable.push_back(seq.request.id);
    }
  };
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if ((*it)->remote.service == service) {
      demote(**it);
      Preempt(it);
    }
    it = next;
  }
  for (auto& seq : waiting_) {
    if (seq->remote.service != service) continue;
    demote(*seq);
    seq->num_computed = 0;
  }
  for (const std::string& id : unfittable) {
    TokenEvent ev;
    ev.request_id = id;
    ev.output_index = live_.at(id)->num_outputs;
    ev.finish = FinishReason::kError;
    ev.error = absl::UnavailableError(
        "the sequence lost its attention service and cannot fit this worker's KV cache");
    events->push_back(std::move(ev));
    TRIDENT_LOG(WARNING) << "request " << id
                         << " lost its attention service and cannot fit this worker's KV cache";
    Abort(id);
  }
  return demoted;
}

std::vector<OffloadCandidate> EngineCore::OffloadCandidates() const {
  std::vector<OffloadCandidate> candidates;
  for (const SeqPtr& seq : running_) {
    if (seq->remote.service != nullptr || seq->request.prefill_only) continue;
    // Decoding: every token but the last (its KV comes with the next step)
    // is in the cache.
    if (seq->num_computed + 1 != static_cast<int32_t>(seq->tokens.size()) ||
        seq->num_computed < seq->prompt_len) {
      continue;
    }
    const size_t published = std::min(seq->keys.size(), static_cast<size_t>(seq->num_published));
    candidates.push_back(OffloadCandidate{.id = seq->request.id,
                                          .blocks = seq->blocks,
                                          .keys = {seq->keys.begin(), seq->keys.begin() + published},
                                          .num_computed = seq->num_computed,
                                          .max_len = static_cast<int32_t>(MaxLen(seq->request)),
                                          .arrival = seq->arrival,
                                          .residency = seq->blocks_freed});
  }
  return candidates;
}

void EngineCore::NoteOffloadOutcome(OffloadOutcome outcome) {
  switch (outcome) {
    case OffloadOutcome::kHeld:
      ++stats_.remote_held_total;
      break;
    case OffloadOutcome::kFailed:
      ++stats_.remote_move_failures_total;
      break;
    case OffloadOutcome::kDropped:
      ++stats_.remote_moves_dropped_total;
      break;
  }
}

absl::Status EngineCore::MoveToRemote(const std::string& id, backend::RemoteKv remote,
                                      std::string service_id, int32_t in_place_tokens) {
  auto live = live_.find(id);
  if (live == live_.end()) return absl::NotFoundError(absl::StrCat("request ", id, " is not live"));
  Sequence& seq = *live->second;
  if (remote.service == nullptr) return absl::InvalidArgumentError("no attention service named");
  if (seq.remote.service != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, " is CPU-resident already"));
  }
  if (seq.num_computed + 1 != static_cast<int32_t>(seq.tokens.size()) ||
      seq.num_computed < seq.prompt_len) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", id, " is not between decode steps"));
  }
  in_place_tokens = std::clamp(in_place_tokens, 0, seq.num_computed);
  stats_.remote_in_place_tokens_total += in_place_tokens;
  stats_.remote_copied_tokens_total += seq.num_computed - in_place_tokens;
  FreeBlocks(seq);
  seq.remote = remote;
  seq.attention_service_id = std::move(service_id);
  ++stats_.remote_moves_total;
  return absl::OkStatus();
}

EngineStats EngineCore::stats() const {
  EngineStats s = stats_;
  s.queued_prefill_tokens = 0;
  s.batch_context_tokens = 0;
  auto add = [&s](const Sequence& seq) {
    s.queued_prefill_tokens += seq.UncomputedPromptTokens();
  };
  for (const auto& seq : waiting_) add(*seq);
  s.remote_running = 0;
  s.remote_tokens = 0;
  for (const auto& seq : running_) {
    add(*seq);
    if (seq->num_computed >= seq->prompt_len) s.batch_context_tokens += seq->num_computed;
    if (seq->remote.service != nullptr) {
      ++s.remote_running;
      s.remote_tokens += seq->num_computed;
    }
  }
  s.running = static_cast<int32_t>(running_.size());
  s.waiting = static_cast<int32_t>(waiting_.size());
  if (!waiting_.empty() && waiting_.front()->remote.service == nullptr) {
    // As AdmitWaiting reserves them, with a whole step's budget.
    const Sequence& seq = *waiting_.front();
    const int32_t remaining = static_cast<int32_t>(seq.tokens.size()) - seq.num_computed;
    const int32_t reserve = StartReservation(seq, std::min(remaining, options_.max_batch_tokens));
    s.waiting_head_blocks = std::max(
        0, (reserve + block_size_ - 1) / block_size_ - static_cast<int32_t>(seq.blocks.size()));
  }
  s.blocks_free = allocator_->num_free();
  s.blocks_cached = allocator_->num_cached();
  s.blocks_total = allocator_->num_total();
  s.short_of_blocks = short_of_blocks_;
  const backend::RemoteAttentionTiming timing = backend_->remote_attention_timing();
  s.remote_round_trip_seconds_total = timing.round_trip_seconds;
  s.remote_exposed_seconds_total = timing.exposed_seconds;
  s.graphs = backend_->graph_stats();
  return s;
}

}  // namespace trident::engine
