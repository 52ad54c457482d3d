#include "services/attention/kv_store/block_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace trident::attention {

uint64_t BlockFormat::block_bytes() const {
  return uint64_t{2} * num_layers * num_kv_heads * block_size * head_dim *
         numeric::ElementSize(dtype);
}

std::string BlockFormat::Describe() const {
  return absl::StrCat(model_identity.substr(0, 16), " (", num_layers, " layers, ", num_kv_heads,
                      " kv heads of ", head_dim, ", ", block_size, "-token blocks, ",
                      numeric::DTypeName(dtype), ")");
}

absl::Status ValidateBlockFormat(const BlockFormat& format) {
  if (format.model_identity.empty() || format.model_identity.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format.model_identity: expected 1 to 256 bytes, got ", format.model_identity.size()));
  }
  const auto check = [](absl::string_view name, int32_t value, int32_t max) {
    if (value >= 1 && value <= max) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("format.layout.", name, ": expected 1 to ", max, ", got ", value));
  };
  if (absl::Status s = check("num_layers", format.num_layers, 1024); !s.ok()) return s;
  if (absl::Status s = check("num_kv_heads", format.num_kv_heads, 1024); !s.ok()) return s;
  if (absl::Status s = check("head_dim", format.head_dim, 512); !s.ok()) return s;
  return check("block_size_tokens", format.block_size, 1024);
}

namespace {

// `copy` when given, else memcpy on this thread.
void RunCopies(absl::Span<const BlockStore::BlockCopy> copies, const BlockStore::CopyFn& copy) {
  if (copy) {
    copy(copies);
    return;
  }
  for (const BlockStore::BlockCopy& c : copies) std::memcpy(c.to, c.from, c.bytes);
}

}  // namespace

BlockStore::BlockStore(KvPool* pool, Clock* clock, BlockStoreOptions options)
    : pool_(pool), clock_(clock), options_(options) {}

BlockStore::~BlockStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, block] : blocks_) pool_->Free(block.span);
}

absl::Status BlockStore::CheckFormat(const BlockFormat& format,
                                     absl::Span<const kv::BlockKey> keys, bool bind) {
  if (absl::Status s = ValidateBlockFormat(format); !s.ok()) return s;
  if (keys.empty() || static_cast<int64_t>(keys.size()) > options_.max_keys) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys: expected 1 to ", options_.max_keys, ", got ", keys.size()));
  }
  if (!format_.has_value()) {
    if (!bind) return absl::OkStatus();
    format_ = format;
    block_bytes_ = format.block_bytes();
    return absl::OkStatus();
  }
  if (*format_ == format) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("this block store holds blocks of ",
                                                    format_->Describe(), ", not of ",
                                                    format.Describe()));
}

std::optional<KvSpan> BlockStore::AllocateBlock() {
  while (true) {
    const bool within_budget =
        bytes_ + static_cast<int64_t>(block_bytes_) <= options_.capacity_bytes;
    if (within_budget) {
      absl::StatusOr<KvSpan> span = pool_->Allocate(block_bytes_);
      if (span.ok()) {
        bytes_ += static_cast<int64_t>(block_bytes_);
        return *span;
      }
    }
    // Evict the least recently used unpinned block.
    auto victim = lru_.begin();
    while (victim != lru_.end() && blocks_.at(*victim).pins > 0) ++victim;
    if (victim == lru_.end()) return std::nullopt;
    FreeBlock(*victim);
    ++counters_.evictions_total;
  }
}

void BlockStore::FreeBlock(const kv::BlockKey key) {
  // By value: the eviction passes a key that lives in the LRU list's node,
  // which is erased below.
  auto it = blocks_.find(key);
  if (it == blocks_.end()) return;
  if (it->second.written) {
    lru_.erase(it->second.lru);
    events_.Removed(key);
  }
  pool_->Free(it->second.span);
  bytes_ -= static_cast<int64_t>(block_bytes_);
  blocks_.erase(it);
}

absl::StatusOr<BlockStore::Reservation> BlockStore::Reserve(const BlockOwner& owner,
                                                            const BlockFormat& format,
                                                            absl::Span<const kv::BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckFormat(format, keys, /*bind=*/true); !s.ok()) return s;
  Reservation reservation{.block_bytes = block_bytes_,
                          .refused_from = static_cast<int32_t>(keys.size())};
  Ticket ticket{.owner = owner, .put = true, .expires = clock_->Now() + options_.put_lease};
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) return absl::InvalidArgumentError(absl::StrCat("keys[", i, "] is zero"));
    if (blocks_.contains(keys[i])) continue;  // Held, or being written.
    std::optional<KvSpan> span = AllocateBlock();
    if (!span.has_value()) {
      counters_.blocks_refused_total += static_cast<int64_t>(keys.size() - i);
      reservation.refused_from = static_cast<int32_t>(i);
      break;
    }
    blocks_.emplace(keys[i], Block{.key = keys[i], .span = *span});
    ticket.keys.push_back(keys[i]);
    reservation.write.push_back(static_cast<int32_t>(i));
  }
  if (ticket.keys.empty()) return reservation;
  reservation.ticket = next_ticket_++;
  tickets_.emplace(reservation.ticket, std::move(ticket));
  return reservation;
}

absl::StatusOr<BlockStore::Ticket*> BlockStore::FindTicket(uint64_t incarnation, uint64_t ticket,
                                                           bool put, int32_t first, int32_t count,
                                                           size_t bytes) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.owner.incarnation != incarnation) {
    return absl::NotFoundError(absl::StrCat("no block ticket ", ticket, " is live"));
  }
  Ticket& t = it->second;
  if (t.borrow) {
    return absl::NotFoundError(absl::StrCat("no block ticket ", ticket, " is live"));
  }
  if (t.put != put) {
    return absl::InvalidArgumentError(absl::StrCat("block ticket ", ticket, " is a ",
                                                   t.put ? "put's" : "lookup's", ", not a ",
                                                   put ? "put's" : "lookup's"));
  }
  if (first < 0 || count < 1 || int64_t{first} + count > static_cast<int64_t>(t.keys.size())) {
    return absl::InvalidArgumentError(absl::StrCat("blocks [", first, ", ", int64_t{first} + count,
                                                   ") are not in ticket ", ticket, " (",
                                                   t.keys.size(), " blocks)"));
  }
  if (bytes != static_cast<size_t>(count) * block_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(count, " blocks are ", count * block_bytes_,
                                                   " bytes, not ", bytes));
  }
  return &t;
}

absl::Status BlockStore::Write(uint64_t incarnation, uint64_t ticket, int32_t first,
                               int32_t count, const char* data, size_t bytes, const CopyFn& copy) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Ticket*> t = FindTicket(incarnation, ticket, /*put=*/true, first, count, bytes);
  if (!t.ok()) return t.status();
  for (int32_t i = first; i < first + count; ++i) {
    const Block& block = blocks_.at((*t)->keys[i]);
    if (block.written) {
      return absl::InvalidArgumentError(absl::StrCat("block ", i, " of ticket ", ticket,
                                                     " is written already"));
    }
  }
  std::vector<BlockCopy> copies;
  copies.reserve(static_cast<size_t>(count));
  for (int32_t i = first; i < first + count; ++i) {
    Block& block = blocks_.at((*t)->keys[i]);
    copies.push_back(BlockCopy{.from = data + static_cast<size_t>(i - first) * block_bytes_,
                               .to = block.span.data,
                               .bytes = block_bytes_});
    block.written = true;
    block.lru = lru_.insert(lru_.end(), block.key);
    events_.Stored(block.key);
  }
  RunCopies(copies, copy);
  counters_.blocks_written_total += count;
  return absl::OkStatus();
}

absl::StatusOr<BlockStore::Match> BlockStore::Lookup(const BlockOwner& owner,
                                                     const BlockFormat& format,
                                                     absl::Span<const kv::BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckFormat(format, keys, /*bind=*/false); !s.ok()) return s;
  ++counters_.lookups_total;
  Match match{.block_bytes = block_bytes_};
  Ticket ticket{.owner = owner, .put = false, .expires = clock_->Now() + options_.read_lease};
  PinChain(keys, &ticket, nullptr);
  match.matched = static_cast<int32_t>(ticket.keys.size());
  counters_.blocks_matched_total += match.matched;
  if (match.matched == 0) return match;
  match.ticket = next_ticket_++;
  tickets_.emplace(match.ticket, std::move(ticket));
  return match;
}

void BlockStore::PinChain(absl::Span<const kv::BlockKey> keys, Ticket* ticket,
                          std::vector<const char*>* data) {
  for (const kv::BlockKey& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || !it->second.written) break;
    Block& block = it->second;
    ++block.pins;
    lru_.splice(lru_.end(), lru_, block.lru);  // Most recently used.
    ticket->keys.push_back(key);
    if (data != nullptr) data->push_back(block.span.data);
  }
}

absl::StatusOr<BlockStore::Borrowed> BlockStore::Borrow(const BlockFormat& format,
                                                        absl::Span<const kv::BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckFormat(format, keys, /*bind=*/false); !s.ok()) return s;
  ++counters_.lookups_total;
  Borrowed borrowed;
  Ticket ticket{.put = false, .borrow = true, .expires = absl::InfiniteFuture()};
  PinChain(keys, &ticket, &borrowed.blocks);
  counters_.blocks_matched_total += static_cast<int64_t>(borrowed.blocks.size());
  if (borrowed.blocks.empty()) return borrowed;
  borrowed.ticket = next_ticket_++;
  tickets_.emplace(borrowed.ticket, std::move(ticket));
  return borrowed;
}

bool BlockStore::Return(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || !it->second.borrow) return false;
  EndTicketLocked(ticket);
  return true;
}

absl::Status BlockStore::Read(uint64_t incarnation, uint64_t ticket, int32_t first, int32_t count,
                              char* out, size_t bytes, const CopyFn& copy) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Ticket*> t = FindTicket(incarnation, ticket, /*put=*/false, first, count, bytes);
  if (!t.ok()) return t.status();
  std::vector<BlockCopy> copies;
  copies.reserve(static_cast<size_t>(count));
  for (int32_t i = first; i < first + count; ++i) {
    copies.push_back(BlockCopy{.from = blocks_.at((*t)->keys[i]).span.data,
                               .to = out + static_cast<size_t>(i - first) * block_bytes_,
                               .bytes = block_bytes_});
  }
  RunCopies(copies, copy);
  counters_.blocks_read_total += count;
  return absl::OkStatus();
}

void BlockStore::EndTicketLocked(uint64_t id) {
  auto it = tickets_.find(id);
  if (it == tickets_.end()) return;
  for (const kv::BlockKey& key : it->second.keys) {
    auto block = blocks_.find(key);
    if (block == blocks_.end()) continue;
    if (it->second.put) {
      if (!block->second.written) FreeBlock(key);
    } else {
      --block->second.pins;
    }
  }
  tickets_.erase(it);
}

bool BlockStore::Release(const BlockOwner& owner, uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.borrow || it->second.owner.owner_id != owner.owner_id ||
      it->second.owner.incarnation != owner.incarnation) {
    return false;
  }
  EndTicketLocked(ticket);
  return true;
}

int BlockStore::ReleaseOwner(const std::string& owner_id) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, ticket] : tickets_) {
    if (!ticket.borrow && ticket.owner.owner_id == owner_id) ids.push_back(id);
  }
  for (uint64_t id : ids) EndTicketLocked(id);
  return static_cast<int>(ids.size());
}

int BlockStore::Sweep() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> ids;
  for (const auto& [id, ticket] : tickets_) {
    if (ticket.expires <= now) ids.push_back(id);
  }
  for (uint64_t id : ids) EndTicketLocked(id);
  return static_cast<int>(ids.size());
}

BlockStoreStats BlockStore::Stats() const {
  absl::MutexLock lock(&mu_);
  BlockStoreStats stats = counters_;
  absl::flat_hash_set<kv::BlockKey> borrowed;
  for (const auto& [id, ticket] : tickets_) {
    if (!ticket.borrow) continue;
    ++stats.borrows;
    borrowed.insert(ticket.keys.begin(), ticket.keys.end());
  }
  stats.borrowed_blocks = static_cast<int64_t>(borrowed.size());
  for (const auto& [key, block] : blocks_) {
    if (block.written) {
      ++stats.blocks;
      if (block.pins > 0) ++stats.pinned_blocks;
    } else {
      ++stats.reserved_blocks;
    }
  }
  stats.bytes = bytes_;
  stats.capacity_bytes = options_.capacity_bytes;
  return stats;
}

absl::Status BlockStore::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<kv::BlockKey, int32_t> pins;
  for (const auto& [id, ticket] : tickets_) {
    for (const kv::BlockKey& key : ticket.keys) {
      auto it = blocks_.find(key);
      if (!ticket.put && it == blocks_.end()) {
        return absl::InternalError(absl::StrCat("lookup ", id, " pins a block not held"));
      }
      if (!ticket.put) ++pins[key];
    }
  }
  size_t written = 0;
  for (const auto& [key, block] : blocks_) {
    const int32_t want = pins.contains(key) ? pins.at(key) : 0;
    if (block.pins != want) {
      return absl::InternalError(absl::StrCat("block ", key.ToHex(), " has ", block.pins,
                                              " pins; lookups and borrows hold ", want));
    }
    if (block.written) ++written;
  }
  if (written != lru_.size()) {
    return absl::InternalError(
        absl::StrCat(written, " written blocks, ", lru_.size(), " in the LRU list"));
  }
  if (bytes_ != static_cast<int64_t>(blocks_.size() * block_bytes_)) {
    return absl::InternalError(absl::StrCat(bytes_, " bytes counted for ", blocks_.size(),
                                            " blocks of ", block_bytes_));
  }
  return absl::OkStatus();
}

void CopyPart(absl::Span<const BlockStore::BlockCopy> copies, size_t parts, size_t part) {
  size_t total = 0;
  for (const BlockStore::BlockCopy& c : copies) total += c.bytes;
  const size_t begin = total * part / parts, end = total * (part + 1) / parts;
  size_t at = 0;
  for (const BlockStore::BlockCopy& c : copies) {
    const size_t lo = std::max(begin, at), hi = std::min(end, at + c.bytes);
    if (lo < hi) std::memcpy(c.to + (lo - at), c.from + (lo - at), hi - lo);
    at += c.bytes;
    if (at >= end) break;
  }
}

}  // namespace trident::attention
