#include "common/kv/block_hasher.h"

#include <openssl/sha.h>

#include <algorithm>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "common/logging/log.h"

namespace trident::kv {
namespace {

constexpr absl::string_view kRootDomain = "trident.kv.root.v1";
constexpr absl::string_view kBlockDomain = "trident.kv.block.v1";
// Type tags of the root's string fields.
constexpr uint8_t kModelTag = 1;
constexpr uint8_t kSaltTag = 2;

// Serialises a hash input; 16-token blocks fit inline.
class Input {
 public:
  // Byte by byte: gcc -O2 warns (maybe-uninitialized) inside
  // InlinedVector's range insert.
  void Bytes(absl::string_view s) {
    for (char c : s) buf_.push_back(static_cast<uint8_t>(c));
  }
  void U8(uint8_t v) { buf_.push_back(v); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  // A key as its digest's leading 16 bytes: hi then lo, big-endian.
  void Key(const BlockKey& key) {
    for (int i = 7; i >= 0; --i) buf_.push_back(static_cast<uint8_t>(key.hi >> (8 * i)));
    for (int i = 7; i >= 0; --i) buf_.push_back(static_cast<uint8_t>(key.lo >> (8 * i)));
  }
  void Field(uint8_t tag, absl::string_view value) {
    U8(tag);
    U32(static_cast<uint32_t>(value.size()));
    Bytes(value);
  }

  BlockKey Digest() const {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(buf_.data(), buf_.size(), md);
    BlockKey key;
    for (int i = 0; i < 8; ++i) {
      key.hi = (key.hi << 8) | md[i];
      key.lo = (key.lo << 8) | md[8 + i];
    }
    return key;
  }

 private:
  absl::InlinedVector<uint8_t, 160> buf_;
};

}  // namespace

BlockHasher::BlockHasher(int32_t block_size, std::string model, uint64_t seed)
    : block_size_(block_size), model_(std::move(model)), seed_(seed) {
  TRIDENT_CHECK(block_size_ > 0);
}

BlockKey BlockHasher::Root(absl::string_view cache_salt) const {
  Input in;
  in.Bytes(kRootDomain);
  in.U64(seed_);
  in.U32(static_cast<uint32_t>(block_size_));
  in.Field(kModelTag, model_);
  in.Field(kSaltTag, cache_salt);
  return in.Digest();
}

BlockKey BlockHasher::Next(const BlockKey& parent, absl::Span<const int32_t> tokens) const {
  TRIDENT_CHECK(static_cast<int32_t>(tokens.size()) == block_size_);
  Input in;
  in.Bytes(kBlockDomain);
  in.Key(parent);
  in.U32(static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) in.U32(static_cast<uint32_t>(t));
  return in.Digest();
}

void BlockHasher::Extend(const BlockKey& root, absl::Span<const int32_t> tokens,
                         std::vector<BlockKey>* keys, size_t max_blocks) const {
  const size_t full = std::min(tokens.size() / static_cast<size_t>(block_size_), max_blocks);
  for (size_t i = keys->size(); i < full; ++i) {
    const BlockKey& parent = i == 0 ? root : (*keys)[i - 1];
    keys->push_back(Next(parent, tokens.subspan(i * block_size_, block_size_)));
  }
}

std::vector<BlockKey> BlockHasher::PrefixKeys(absl::string_view cache_salt,
                                              absl::Span<const int32_t> tokens,
                                              size_t max_blocks) const {
  std::vector<BlockKey> keys;
  Extend(Root(cache_salt), tokens, &keys, max_blocks);
  return keys;
}

}  // namespace trident::kv
