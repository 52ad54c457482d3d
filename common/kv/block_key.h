#ifndef TRIDENT_COMMON_KV_BLOCK_KEY_H_
#define TRIDENT_COMMON_KV_BLOCK_KEY_H_

// The name of one full block of KV: a 128-bit key that every process of a
// cluster (router, workers, attention services) computes alike for the same
// tokens of the same model, so any of them can tell whether it holds a
// prompt's prefix without asking (see block_hasher.h for how keys are made).
//
// Light on purpose (no hashing library): the allocator interface, the KV
// events and the router's index use it.

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace trident::kv {

// Keys compare by value. All zeros is "no key" (a key made by BlockHasher
// is all zeros with probability 2^-128).
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  bool empty() const { return hi == 0 && lo == 0; }
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  friend bool operator!=(const BlockKey& a, const BlockKey& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& key) {
    return H::combine(std::move(h), key.hi, key.lo);
  }
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_BLOCK_KEY_H_
