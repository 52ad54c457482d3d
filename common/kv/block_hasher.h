#ifndef TRIDENT_COMMON_KV_BLOCK_HASHER_H_
#define TRIDENT_COMMON_KV_BLOCK_HASHER_H_

// How a block of KV gets its name. Block i of a sequence is keyed by a
// chained hash:
//
//   root   = H("trident.kv.root.v1", seed, block_size, model, cache_salt)
//   key[0] = H("trident.kv.block.v1", root,     tokens[0 .. B))
//   key[i] = H("trident.kv.block.v1", key[i-1], tokens[i*B .. (i+1)*B))
//
// H is SHA-256 truncated to its first 128 bits (big-endian into hi, lo), so
// a crafted collision is out of reach: a cache shared by tenants leaks
// nothing through a forged key. Every field is framed (a one-byte type tag
// and a length before each string, integers little-endian at fixed width),
// so no two different inputs serialise alike: a model named "x" never meets
// a salt "x" (the domain collision vLLM issue 44701 describes).
//
//   * `seed` is cluster-wide and fixed (kClusterSeed unless every process is
//     given the same other one): keys agree across processes and restarts.
//   * `model` names what decides the KV besides the tokens: the model and
//     its weights, the KV dtype and layout (ModelIdentity in the worker).
//     Keys of different models never match.
//   * `cache_salt` (optional, per request) keeps tenants apart: requests
//     with different salts share no block, because the salt is in the root
//     every key chains from.
//
// Only full blocks have keys; a partial last block is never shared.
// golden vectors: block_hasher_test.cc (computed independently with
// Python's hashlib).
//
// Thread-safe (immutable after construction).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/block_key.h"

namespace trident::kv {

// The seed every Trident process uses unless configured otherwise.
inline constexpr uint64_t kClusterSeed = 0x7472696465'6e7430ULL;  // "trident0"

class BlockHasher {
 public:
  // REQUIRES: block_size > 0.
  BlockHasher(int32_t block_size, std::string model, uint64_t seed = kClusterSeed);

  int32_t block_size() const { return block_size_; }
  const std::string& model() const { return model_; }

  // The key every chain of this model and salt starts from.
  BlockKey Root(absl::string_view cache_salt) const;

  // The key of the block holding `tokens` after the block keyed `parent`.
  // REQUIRES: tokens.size() == block_size().
  BlockKey Next(const BlockKey& parent, absl::Span<const int32_t> tokens) const;

  // Appends to `keys` the keys of the full blocks of `tokens` that it lacks,
  // up to `max_blocks`: with k = keys->size() on entry, blocks k, k + 1, ...
  // while a whole block of `tokens` remains (so keys->size() becomes
  // min(tokens.size() / B, max_blocks), or stays k if that is not more).
  // `root` is Root(cache_salt) of the sequence.
  void Extend(const BlockKey& root, absl::Span<const int32_t> tokens, std::vector<BlockKey>* keys,
              size_t max_blocks = std::numeric_limits<size_t>::max()) const;

  // The keys of `tokens`' leading whole blocks (at most `max_blocks`) in
  // `cache_salt`'s namespace: Extend from Root(cache_salt).
  std::vector<BlockKey> PrefixKeys(absl::string_view cache_salt, absl::Span<const int32_t> tokens,
                                   size_t max_blocks = std::numeric_limits<size_t>::max()) const;

 private:
  int32_t block_size_;
  std::string model_;
  uint64_t seed_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_BLOCK_HASHER_H_
