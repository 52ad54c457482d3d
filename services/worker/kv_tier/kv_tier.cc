#include "services/worker/kv_tier/kv_tier.h"

#include "common/telemetry/metric_families.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/status.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

// Keys the writer remembers as stored before it forgets them all.
constexpr size_t kMaxRemembered = size_t{1} << 20;
// Keys per ReserveBlocks.
constexpr size_t kWriteBatch = 256;

template <typename Request>
void FillKeys(absl::Span<const kv::BlockKey> keys, Request* request) {
  for (const kv::BlockKey& key : keys) {
    request->add_key_hi(key.hi);
    request->add_key_lo(key.lo);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTier>> KvTier::Create(KvTierOptions options,
                                                        AttentionServicePool* pool,
                                                        engine::Engine* engine) {
  if (engine->kv_events() == nullptr) {
    return absl::InvalidArgumentError("the KV tier needs prefix caching (--prefix_caching)");
  }
  if (options.fetch_threads < 1 || options.fetch_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tier_fetch_threads: expected 1 to 64, got ", options.fetch_threads));
  }
  auto tier = std::unique_ptr<KvTier>(new KvTier(std::move(options), pool, engine));
  TRIDENT_RETURN_IF_ERROR(tier->Start());
  return tier;
}

KvTier::KvTier(KvTierOptions options, AttentionServicePool* pool, engine::Engine* engine)
    : options_(std::move(options)), pool_(pool), engine_(engine) {}

absl::Status KvTier::Start() {
  TRIDENT_ASSIGN_OR_RETURN(memory_, engine_->backend().kv_memory());
  if (memory_.device) {
    TRIDENT_ASSIGN_OR_RETURN(copier_, engine_->backend().CreateKvCopier());
  }
  format_.set_model_identity(engine_->cache_hasher().model());
  *format_.mutable_layout() = kv::ToProto(memory_.spec);
  store_ = FindStore();
  if (store_ == nullptr) {
    TRIDENT_LOG(WARNING) << "KV tier idle: no attention service has a block store "
                            "(start one with --kv_store_mb)";
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.active = true;
  }
  TRIDENT_LOG(INFO) << "KV tier: writing cached blocks through to, and fetching from, "
                    << "attention service " << store_->address << " ("
                    << memory_.spec.BytesPerBlockAllLayers() << " bytes a block)";
  // Blocks held for the writer at most: a quarter of the pool.
  engine_->HoldPublishedBlocks(std::max(1, memory_.spec.num_blocks / 4));
  writer_ = std::thread([this] { WriterLoop(); });
  copy_thread_ = std::thread([this] { CopyLoop(); });
  for (int32_t i = 0; i < options_.fetch_threads; ++i) {
    fetchers_.emplace_back([this] { FetchLoop(); });
  }
  return absl::OkStatus();
}

KvTier::~KvTier() {
  std::deque<Job> jobs;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    jobs.swap(jobs_);
  }
  for (Job& job : jobs) job.done(TierFetch{});
  if (writer_.joinable()) writer_.join();
  for (std::thread& fetcher : fetchers_) fetcher.join();
  if (copy_thread_.joinable()) copy_thread_.join();
}

AttentionServicePool::Service* KvTier::FindStore() {
  for (AttentionServicePool::Service* service : pool_->services()) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    v1::AttentionStats stats;
    const absl::Status status =
        FromGrpcStatus(service->stub->GetStats(&context, v1::GetAttentionStatsRequest(), &stats));
    if (status.ok() && stats.block_store().capacity_bytes() > 0) return service;
  }
  return nullptr;
}

void KvTier::BlockRanges(int32_t block, std::vector<backend::KvRange>* ranges) const {
  const kv::KvCacheSpec& spec = memory_.spec;
  for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
    ranges->push_back({spec.KeyOffsetBytes(layer, block), spec.block_stride_bytes()});
  }
}

absl::Status KvTier::CopyOut(absl::Span<const int32_t> blocks, char* dst) {
  std::vector<backend::KvRange> ranges;
  for (int32_t block : blocks) BlockRanges(block, &ranges);
  if (copier_ != nullptr) return copier_->CopyToHost(ranges, dst);
  for (const backend::KvRange& range : ranges) {
    std::memcpy(dst, static_cast<const char*>(memory_.base) + range.offset_bytes,
                range.length_bytes);
    dst += range.length_bytes;
  }
  return absl::OkStatus();
}

absl::Status KvTier::CopyIn(const char* src, absl::Span<const int32_t> blocks) {
  std::vector<backend::KvRange> ranges;
  for (int32_t block : blocks) BlockRanges(block, &ranges);
  if (copier_ != nullptr) return copier_->CopyFromHost(src, ranges);
  for (const backend::KvRange& range : ranges) {
    std::memcpy(static_cast<char*>(memory_.base) + range.offset_bytes, src, range.length_bytes);
    src += range.length_bytes;
  }
  return absl::OkStatus();
}

int32_t KvTier::BlocksPerMessage(uint64_t block_bytes) const {
  return static_cast<int32_t>(
      std::max<uint64_t>(1, static_cast<uint64_t>(options_.message_bytes) / block_bytes));
}

void KvTier::WriterLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.write_interval)) break;
    }
    // The blocks the engine named since, each held for us (it can be
    // neither evicted nor rewritten while it is copied).
    const std::vector<std::pair<kv::BlockKey, int32_t>> held = engine_->TakeHeldBlocks();
    for (size_t begin = 0; begin < held.size(); begin += kWriteBatch) {
      const size_t count = std::min(kWriteBatch, held.size() - begin);
      absl::Status written = WriteBlocks(absl::MakeConstSpan(held).subspan(begin, count));
      if (!written.ok()) {
        pool_->NoteFailure(*store_, written);
        absl::MutexLock lock(&mu_);
        stats_.failed_writes += static_cast<int64_t>(count);
        TRIDENT_LOG(WARNING) << "KV tier: blocks not written through: " << written;
      }
    }
    absl::MutexLock lock(&mu_);
    stats_.dropped_writes = engine_->held_blocks_dropped();
  }
  // Stopping: the blocks still held go back to the engine.
  std::vector<int32_t> blocks;
  for (const auto& [key, block] : engine_->TakeHeldBlocks()) blocks.push_back(block);
  engine_->FreeBlocks(blocks).IgnoreError();
}

absl::Status KvTier::WriteBlocks(absl::Span<const std::pair<kv::BlockKey, int32_t>> taken) {
  std::vector<int32_t> blocks;
  std::vector<kv::BlockKey> held;
  for (const auto& [key, block] : taken) {
    if (written_.contains(key)) continue;  // The store has it.
    blocks.push_back(block);
    held.push_back(key);
  }
  absl::Cleanup release = [&] {
    std::vector<int32_t> all;
    for (const auto& [key, block] : taken) all.push_back(block);
    engine_->FreeBlocks(all).IgnoreError();
  };
  if (blocks.empty()) return absl::OkStatus();
  if (written_.size() > kMaxRemembered) written_.clear();
  v1::ReserveBlocksRequest request;
  request.set_owner_id(pool_->options().worker_id);
  request.set_owner_incarnation(pool_->options().incarnation);
  *request.mutable_format() = format_;
  FillKeys(held, &request);
  v1::ReserveBlocksResponse reserved;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  TRIDENT_RETURN_IF_ERROR(FromGrpcStatus(store_->stub->ReserveBlocks(&context, request, &reserved)));
  // The store holds (or is about to) every key before the first it refused
  // for room; those it refused may be offered again if cached again.
  for (int32_t i = 0; i < std::min<int32_t>(reserved.refused_from(), held.size()); ++i) {
    written_.insert(held[i]);
  }
  if (reserved.ticket() == 0 || reserved.write().empty()) return absl::OkStatus();
  transport::attention::RemoteAttention* channel = pool_->channel(*store_);
  if (channel == nullptr) return absl::UnavailableError("the block store's service is not connected");
  const uint64_t block_bytes = static_cast<uint64_t>(reserved.block_bytes());
  const int32_t per_message = BlocksPerMessage(block_bytes);
  // The client copies a put's bytes as it starts it, so one staging buffer
  // serves every put, and up to kInFlight of them travel at once.
  HostSlots staging = AllocateSlots(1, static_cast<size_t>(per_message) * block_bytes);
  std::deque<transport::attention::RemoteAttention::Ticket> puts;
  absl::Status status;
  std::vector<int32_t> chunk;
  for (int32_t first = 0; status.ok() && first < reserved.write_size(); first += per_message) {
    const int32_t count = std::min(per_message, reserved.write_size() - first);
    chunk.clear();
    for (int32_t i = first; i < first + count; ++i) chunk.push_back(blocks[reserved.write(i)]);
    status = CopyOut(chunk, staging.slots[0]);
    if (!status.ok()) break;
    absl::StatusOr<transport::attention::RemoteAttention::Ticket> put =
        channel->StartBlockPut({.ticket = reserved.ticket(),
                                .first = first,
                                .count = count,
                                .data = staging.slots[0],
                                .bytes = count * block_bytes});
    status = put.status();
    if (!status.ok()) break;
    puts.push_back(*put);
    if (static_cast<int>(puts.size()) >= kInFlight) {
      status = channel->Wait(puts.front(), options_.timeout);
      puts.pop_front();
    }
  }
  for (const auto put : puts) {
    const absl::Status waited = channel->Wait(put, options_.timeout);
    if (status.ok()) status = waited;
  }
  TRIDENT_RETURN_IF_ERROR(status);
  absl::MutexLock lock(&mu_);
  stats_.written_blocks += reserved.write_size();
  stats_.write_bytes += static_cast<int64_t>(reserved.write_size() * block_bytes);
  return absl::OkStatus();
}

void KvTier::Prepare(const engine::EngineRequest& request, std::function<void(TierFetch)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (store_ != nullptr && !stopping_) {
      jobs_.push_back(Job{request, std::move(done)});
      return;
    }
  }
  done(TierFetch{});
}

void KvTier::FetchLoop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvTier* tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier->mu_) {
            return tier->stopping_ || !tier->jobs_.empty();
          },
          this));
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job.done(Fetch(job.request));
  }
}

std::optional<double> KvTier::FetchSaving(uint64_t block_bytes) const {
  const double rate = engine_->stats().prefill_tokens_per_second;
  double bandwidth;
  {
    absl::MutexLock lock(&mu_);
    bandwidth = fetch_bandwidth_;
  }
  if (rate <= 0 || bandwidth <= 0) return std::nullopt;
  const double fetch_per_token =
      static_cast<double>(block_bytes) / memory_.spec.block_size / bandwidth;
  return 1.0 - fetch_per_token * rate;
}

bool KvTier::FetchPays(uint64_t block_bytes) const {
  // Nothing measured yet: fetch (the first fetch measures the bandwidth the
  // later ones are judged by).
  const std::optional<double> saving = FetchSaving(block_bytes);
  return !saving.has_value() || *saving > 0;
}

absl::Status KvTier::ReleaseTicket(uint64_t ticket) {
  v1::ReleaseBlocksRequest request;
  request.set_owner_id(pool_->options().worker_id);
  request.set_owner_incarnation(pool_->options().incarnation);
  request.set_ticket(ticket);
  v1::ReleaseBlocksResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  return FromGrpcStatus(store_->stub->ReleaseBlocks(&context, request, &response));
}

KvTier::HostSlots KvTier::TakeFetchSlots(size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = spare_fetch_slots_.begin(); it != spare_fetch_slots_.end(); ++it) {
      if (it->bytes != bytes) continue;
      HostSlots slots = std::move(*it);
      spare_fetch_slots_.erase(it);
      return slots;
    }
  }
  return AllocateSlots(kInFlight + 2, bytes);
}

void KvTier::ReturnFetchSlots(HostSlots slots) {
  absl::MutexLock lock(&mu_);
  // One set per fetch thread at most.
  if (static_cast<int>(spare_fetch_slots_.size()) < options_.fetch_threads) {
    spare_fetch_slots_.push_back(std::move(slots));
  }
}

KvTier::HostSlots KvTier::AllocateSlots(int count, size_t bytes) const {
  HostSlots slots;
  slots.bytes = bytes;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::unique_ptr<backend::HostBuffer>> buffer =
        copier_ != nullptr ? copier_->AllocateHost(bytes)
                           : absl::StatusOr<std::unique_ptr<backend::HostBuffer>>(nullptr);
    if (buffer.ok() && *buffer != nullptr) {
      slots.slots.push_back((*buffer)->data());
      slots.pinned.push_back(*std::move(buffer));
    } else {
      slots.plain.emplace_back(bytes);
      slots.slots.push_back(slots.plain.back().data());
    }
  }
  return slots;
}

absl::Status KvTier::ReadBlocks(uint64_t ticket, absl::Span<const int32_t> blocks,
                                uint64_t block_bytes, FetchTiming* timing) {
  transport::attention::RemoteAttention* channel = pool_->channel(*store_);
  if (channel == nullptr) return absl::UnavailableError("the block store's service is not connected");
  const int32_t total = static_cast<int32_t>(blocks.size());
  const int32_t per_message = BlocksPerMessage(block_bytes);
  // kInFlight gets at once, each into a buffer of its own, and two buffers
  // more: replies are copied into the pool on the copy thread while
  // kInFlight others travel.
  HostSlots buffers = TakeFetchSlots(static_cast<size_t>(per_message) * block_bytes);
  const std::vector<char*>& slots = buffers.slots;
  std::vector<int> free_slots;
  for (int i = kInFlight + 1; i >= 0; --i) free_slots.push_back(i);
  struct Get {
    transport::attention::RemoteAttention::Ticket ticket;
    int32_t first, count, slot;
  };
  std::deque<Get> gets;
  auto copies = std::make_shared<FetchCopies>();
  absl::Status status;
  int32_t next = 0;
  // Takes back the buffers whose copies are done; with `block`, waits for
  // one first when none is free.
  auto reclaim = [&](bool block) {
    absl::MutexLock lock(&copies->mu);
    if (block && free_slots.empty()) {
      copies->mu.Await(absl::Condition(
          +[](FetchCopies* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
            return !c->done_slots.empty() || c->outstanding == 0;
          },
          copies.get()));
    }
    free_slots.insert(free_slots.end(), copies->done_slots.begin(), copies->done_slots.end());
    copies->done_slots.clear();
    if (status.ok()) status = copies->status;
  };
  while (status.ok() && (next < total || !gets.empty())) {
    reclaim(/*block=*/gets.empty());
    while (status.ok() && next < total && static_cast<int>(gets.size()) < kInFlight &&
           !free_slots.empty()) {
      const int32_t count = std::min(per_message, total - next);
      const int slot = free_slots.back();
      absl::StatusOr<transport::attention::RemoteAttention::Ticket> started =
          channel->StartBlockGet({.ticket = ticket,
                                  .first = next,
                                  .count = count,
                                  .out = slots[slot],
                                  .bytes = count * block_bytes});
      status = started.status();
      if (!status.ok()) break;
      free_slots.pop_back();
      gets.push_back(Get{*started, next, count, slot});
      next += count;
    }
    if (!status.ok() || gets.empty()) continue;
    const Get get = gets.front();
    gets.pop_front();
    const absl::Time wait_start = absl::Now();
    status = channel->Wait(get.ticket, options_.timeout);
    timing->wait += absl::ToDoubleSeconds(absl::Now() - wait_start);
    if (!status.ok()) break;
    {
      absl::MutexLock lock(&copies->mu);
      ++copies->outstanding;
    }
    CopyTask task{.src = slots[get.slot],
                  .blocks = blocks.subspan(get.first, get.count),
                  .slot = get.slot,
                  .fetch = copies};
    {
      absl::MutexLock lock(&mu_);
      // The copy thread may have ended (shutting down): copy here then.
      if (!stopping_) {
        copies_.push_back(std::move(task));
        continue;
      }
    }
    RunCopy(task);
  }
  // No reply may land in a buffer freed here, nor a copy read one: wait for
  // every request sent and every copy queued.
  for (const Get& get : gets) channel->Wait(get.ticket, options_.timeout).IgnoreError();
  absl::MutexLock lock(&copies->mu);
  copies->mu.Await(absl::Condition(
      +[](FetchCopies* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->outstanding == 0; },
      copies.get()));
  timing->copy += copies->seconds;
  if (status.ok()) status = copies->status;
  ReturnFetchSlots(std::move(buffers));
  return status;
}

void KvTier::CopyLoop() {
  while (true) {
    CopyTask task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvTier* tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier->mu_) {
            return tier->stopping_ || !tier->copies_.empty();
          },
          this));
      // Stopping: the fetches still running wait for their copies.
      if (copies_.empty()) return;
      task = std::move(copies_.front());
      copies_.pop_front();
    }
    RunCopy(task);
  }
}

void KvTier::RunCopy(const CopyTask& task) {
  const absl::Time start = absl::Now();
  const absl::Status status = CopyIn(task.src, task.blocks);
  absl::MutexLock lock(&task.fetch->mu);
  task.fetch->seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok() && task.fetch->status.ok()) task.fetch->status = status;
  task.fetch->done_slots.push_back(task.slot);
  --task.fetch->outstanding;
}

TierFetch KvTier::Fetch(const engine::EngineRequest& request) {
  TierFetch fetch;
  const int32_t block_size = memory_.spec.block_size;
  const int32_t max_blocks = (static_cast<int32_t>(request.prompt.size()) - 1) / block_size;
  if (max_blocks <= 0) return fetch;
  const std::vector<kv::BlockKey> keys = engine_->cache_hasher().PrefixKeys(
      request.cache_salt, request.prompt, static_cast<size_t>(max_blocks));
  fetch.held_blocks = engine_->AcquireCachedKeys(keys);
  const size_t local = fetch.held_blocks.size();
  if (local >= keys.size()) return fetch;
  v1::LookupBlocksRequest lookup;
  lookup.set_owner_id(pool_->options().worker_id);
  lookup.set_owner_incarnation(pool_->options().incarnation);
  *lookup.mutable_format() = format_;
  FillKeys(absl::MakeConstSpan(keys).subspan(local), &lookup);
  v1::LookupBlocksResponse match;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  const absl::Status looked = FromGrpcStatus(store_->stub->LookupBlocks(&context, lookup, &match));
  {
    absl::MutexLock lock(&mu_);
    ++stats_.lookups;
  }
  if (!looked.ok()) {
    TRIDENT_LOG(WARNING) << "KV tier: lookup failed (computing instead): " << looked;
    pool_->NoteFailure(*store_, looked);  // Unreachable: reconnect.
    return fetch;
  }
  if (match.matched() == 0) return fetch;
  absl::Cleanup release_ticket = [&] { ReleaseTicket(match.ticket()).IgnoreError(); };
  const uint64_t block_bytes = static_cast<uint64_t>(match.block_bytes());
  if (match.matched() < options_.min_fetch_blocks ||
      (!options_.always_fetch && !FetchPays(block_bytes))) {
    absl::MutexLock lock(&mu_);
    ++stats_.skipped_fetches;
    return fetch;
  }
  absl::StatusOr<std::vector<int32_t>> blocks = engine_->ReserveBlocks(match.matched());
  if (!blocks.ok()) return fetch;  // The pool is full: compute instead.
  const absl::Time start = absl::Now();
  FetchTiming timing;
  const absl::Status read = ReadBlocks(match.ticket(), *blocks, block_bytes, &timing);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!read.ok()) {
    pool_->NoteFailure(*store_, read);
    engine_->FreeBlocks(*blocks).IgnoreError();
    TRIDENT_LOG(WARNING) << "KV tier: fetch failed (computing instead): " << read;
    absl::MutexLock lock(&mu_);
    ++stats_.failed_fetches;
    return fetch;
  }
  engine_->PublishBlocks(*blocks, absl::MakeConstSpan(keys).subspan(local, blocks->size()));
  fetch.held_blocks.insert(fetch.held_blocks.end(), blocks->begin(), blocks->end());
  fetch.fetched_tokens = match.matched() * block_size;
  const int64_t bytes = static_cast<int64_t>(match.matched() * block_bytes);
  absl::MutexLock lock(&mu_);
  ++stats_.fetches;
  stats_.fetched_blocks += match.matched();
  stats_.fetched_tokens += fetch.fetched_tokens;
  stats_.fetch_bytes += bytes;
  stats_.fetch_seconds += seconds;
  stats_.fetch_wait_seconds += timing.wait;
  stats_.fetch_copy_seconds += timing.copy;
  if (seconds > 0) {
    const double bandwidth = static_cast<double>(bytes) / seconds;
    fetch_bandwidth_ = fetch_bandwidth_ > 0 ? 0.8 * fetch_bandwidth_ + 0.2 * bandwidth : bandwidth;
  }
  return fetch;
}

void KvTier::PollStoreEvents(kv::KvEventLog& mirror) {
  if (store_ == nullptr) return;
  v1::GetKvEventsRequest request;
  request.set_cursor(store_cursor_);
  v1::GetKvEventsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  if (!store_->stub->GetKvEvents(&context, request, &response).ok()) return;
  store_cursor_ = response.cursor();
  const v1::KvEvents& events = response.events();
  // Keys of another model (or none yet) mean nothing here: an empty view.
  const bool ours = events.cache_identity() == format_.model_identity() &&
                    events.block_size_tokens() == memory_.spec.block_size;
  if (events.snapshot() || !ours) {
    absl::flat_hash_set<kv::BlockKey> now;
    for (int i = 0; ours && i < events.key_hi_size(); ++i) {
      if (events.stored(i)) now.insert(kv::BlockKey{.hi = events.key_hi(i), .lo = events.key_lo(i)});
    }
    for (const kv::BlockKey& key : mirrored_) {
      if (!now.contains(key)) mirror.Removed(key);
    }
    for (const kv::BlockKey& key : now) {
      if (!mirrored_.contains(key)) mirror.Stored(key);
    }
    mirrored_ = std::move(now);
    return;
  }
  for (int i = 0; i < events.key_hi_size(); ++i) {
    const kv::BlockKey key{.hi = events.key_hi(i), .lo = events.key_lo(i)};
    if (events.stored(i) && mirrored_.insert(key).second) mirror.Stored(key);
    if (!events.stored(i) && mirrored_.erase(key) > 0) mirror.Removed(key);
  }
}

double KvTier::DramHitValue() const {
  if (options_.testonly_dram_hit_value >= 0) return std::min(options_.testonly_dram_hit_value, 1.0);
  return std::clamp(FetchSaving(memory_.spec.BytesPerBlockAllLayers()).value_or(0.5), 0.0, 1.0);
}

void KvTier::Release(TierFetch& fetch) {
  if (fetch.held_blocks.empty()) return;
  engine_->FreeBlocks(fetch.held_blocks).IgnoreError();
  fetch.held_blocks.clear();
}

KvTierStats KvTier::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status TieredTokenSource::Submit(engine::EngineRequest request,
                                       engine::TokenCallback callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!preparing_.emplace(request.id, false).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already running"));
    }
  }
  // The tier reads its own copy: the callback owns the request.
  const engine::EngineRequest prepared = request;
  tier_->Prepare(prepared, [this, request = std::move(request),
                            callback = std::move(callback)](TierFetch fetch) mutable {
    Enter(std::move(request), std::move(callback), std::move(fetch));
  });
  return absl::OkStatus();
}

void TieredTokenSource::Enter(engine::EngineRequest request, engine::TokenCallback callback,
                              TierFetch fetch) {
  const std::string id = request.id;
  auto held = std::make_shared<TierFetch>(std::move(fetch));
  auto released = std::make_shared<std::atomic<bool>>(false);
  KvTier* tier = tier_;
  engine::TokenCallback wrapped = [tier, held, released, callback,
                                   on_dram_hit = on_dram_hit_](const engine::TokenEvent& ev) {
    engine::TokenEvent event = ev;
    event.dram_cached_tokens = std::min(held->fetched_tokens, ev.cached_tokens);
    // Admitted (or ended): the blocks it found need no holding any more.
    if (!released->exchange(true)) {
      tier->Release(*held);
      if (on_dram_hit && event.dram_cached_tokens > 0) on_dram_hit(event.dram_cached_tokens);
    }
    callback(event);
  };
  absl::Status status;
  {
    // Under the lock, so that an Abort either finds it preparing or reaches
    // the engine after it.
    absl::MutexLock lock(&mu_);
    const bool aborted = preparing_[id];
    preparing_.erase(id);
    status = aborted ? absl::CancelledError("aborted") : engine_->Submit(std::move(request), wrapped);
  }
  if (status.ok()) return;
  if (!released->exchange(true)) tier_->Release(*held);
  engine::TokenEvent event;
  event.request_id = id;
  event.finish = absl::IsCancelled(status) ? engine::FinishReason::kAborted
                                           : engine::FinishReason::kError;
  event.error = status;
  callback(event);
}

void TieredTokenSource::Abort(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = preparing_.find(request_id);
  if (it != preparing_.end()) {
    it->second = true;
    return;
  }
  engine_->Abort(request_id);
}

namespace {

using telemetry::CounterOf;

}  // namespace

KvTierMetrics::KvTierMetrics(prometheus::Registry& r)
    : lookups_(CounterOf(r, "trident_worker_kv_tier_lookups_total",
                           "Block-store lookups for arriving prompts (the DRAM tier).")),
      fetches_(CounterOf(r, "trident_worker_kv_tier_fetches_total",
                           "Block-store lookups that fetched blocks into the KV pool.")),
      fetched_bytes_(CounterOf(r, "trident_worker_kv_tier_fetched_bytes_total",
                                 "KV bytes fetched from the block store.")),
      fetch_seconds_(CounterOf(r, "trident_worker_kv_tier_fetch_seconds_total",
                                 "Time spent fetching from the block store.")),
      fetch_wait_seconds_(CounterOf(r, "trident_worker_kv_tier_fetch_stage_seconds_total",
                                    "Fetch time waiting for the store's replies (wait), and "
                                    "copying them into the KV pool (copy, on the copy thread, "
                                    "overlapping the waits).",
                                    {{"stage", "wait"}})),
      fetch_copy_seconds_(CounterOf(r, "trident_worker_kv_tier_fetch_stage_seconds_total",
                                    "Fetch time waiting for the store's replies (wait), and "
                                    "copying them into the KV pool (copy, on the copy thread, "
                                    "overlapping the waits).",
                                    {{"stage", "copy"}})),
      skipped_(CounterOf(r, "trident_worker_kv_tier_skipped_total",
                           "Block-store hits left to compute: the cost model found computing "
                           "them faster than fetching.")),
      written_blocks_(CounterOf(r, "trident_worker_kv_tier_written_blocks_total",
                                  "KV blocks written through to the block store.")),
      written_bytes_(CounterOf(r, "trident_worker_kv_tier_written_bytes_total",
                                 "KV bytes written through to the block store.")),
      failed_fetches_(CounterOf(r, "trident_worker_kv_tier_failures_total",
                                  "Block-store operations that failed, by operation.",
                                  {{"op", "fetch"}})),
      failed_writes_(CounterOf(r, "trident_worker_kv_tier_failures_total",
                                 "Block-store operations that failed, by operation.",
                                 {{"op", "write"}})),
      dropped_writes_(CounterOf(r, "trident_worker_kv_tier_dropped_blocks_total",
                                  "Cached KV blocks not written through: the writer was a "
                                  "quarter of the KV pool behind.")) {}

void KvTierMetrics::Sample(const KvTierStats& s) {
  telemetry::FollowTotal(lookups_, s.lookups, &last_.lookups);
  telemetry::FollowTotal(fetches_, s.fetches, &last_.fetches);
  telemetry::FollowTotal(fetched_bytes_, s.fetch_bytes, &last_.fetch_bytes);
  telemetry::FollowTotal(fetch_seconds_, s.fetch_seconds, &last_.fetch_seconds);
  telemetry::FollowTotal(fetch_wait_seconds_, s.fetch_wait_seconds, &last_.fetch_wait_seconds);
  telemetry::FollowTotal(fetch_copy_seconds_, s.fetch_copy_seconds, &last_.fetch_copy_seconds);
  telemetry::FollowTotal(skipped_, s.skipped_fetches, &last_.skipped_fetches);
  telemetry::FollowTotal(written_blocks_, s.written_blocks, &last_.written_blocks);
  telemetry::FollowTotal(written_bytes_, s.write_bytes, &last_.write_bytes);
  telemetry::FollowTotal(failed_fetches_, s.failed_fetches, &last_.failed_fetches);
  telemetry::FollowTotal(failed_writes_, s.failed_writes, &last_.failed_writes);
  telemetry::FollowTotal(dropped_writes_, s.dropped_writes, &last_.dropped_writes);
}

}  // namespace trident::worker
