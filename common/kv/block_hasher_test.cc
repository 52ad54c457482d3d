#include "common/kv/block_hasher.h"

#include <numeric>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

std::vector<int32_t> Iota(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// The golden values were computed independently, with Python's hashlib, from
// the layout block_hasher.h states:
//   def key(b): return hashlib.sha256(b).digest()[:16].hex()
//   def field(tag, s): return bytes([tag]) + struct.pack('<I', len(s)) + s.encode()
//   root = key(b"trident.kv.root.v1" + struct.pack('<QI', seed, block_size)
//              + field(1, model) + field(2, salt))
//   next = key(b"trident.kv.block.v1" + bytes.fromhex(parent)
//              + struct.pack('<I', len(tokens)) + b"".join(struct.pack('<I', t) ...))
// Any process, in any language, that frames its input this way gets the same
// keys, which is what lets the router, workers and attention services agree.
TEST(BlockHasherTest, MatchesGoldenVectors) {
  const BlockHasher hasher(16, "llama-tiny|f32");
  const BlockKey root = hasher.Root("");
  EXPECT_EQ(root.ToHex(), "0a84c42a37b552017a8363dc50ca690e");
  const BlockKey k0 = hasher.Next(root, Iota(0, 16));
  EXPECT_EQ(k0.ToHex(), "4813593decb9a2da0b10bd6a997625f4");
  EXPECT_EQ(hasher.Next(k0, Iota(16, 16)).ToHex(), "849cd545aadd24b488efde028811c652");
  EXPECT_EQ(hasher.Root("tenant-a").ToHex(), "f5a5d6debb866657848a952d386af32e");

  const BlockHasher small(4, "m");
  EXPECT_EQ(small.Root("").ToHex(), "a546394493753ef0d512b7c36e37ed6a");
  EXPECT_EQ(small.Next(small.Root(""), {1, 2, 3, 128000}).ToHex(),
            "77efa35b2dd337dd57a173e77fec555a");
}

TEST(BlockHasherTest, ExtendKeysOnlyFullBlocksAndResumes) {
  const BlockHasher hasher(4, "m");
  const BlockKey root = hasher.Root("");
  const std::vector<int32_t> tokens = Iota(100, 11);  // Two full blocks and 3 tokens.
  std::vector<BlockKey> keys;
  hasher.Extend(root, tokens, &keys);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], hasher.Next(root, Iota(100, 4)));
  EXPECT_EQ(keys[1], hasher.Next(keys[0], Iota(104, 4)));

  // Growing the sequence keys only the new block; the old keys stand.
  const std::vector<int32_t> longer = Iota(100, 12);
  hasher.Extend(root, longer, &keys);
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[2], hasher.Next(keys[1], Iota(108, 4)));
  // A shorter view never drops keys.
  hasher.Extend(root, Iota(100, 5), &keys);
  EXPECT_EQ(keys.size(), 3u);
}

TEST(BlockHasherTest, KeysDependOnEveryInput) {
  const BlockHasher hasher(4, "model-a");
  const BlockKey root = hasher.Root("");
  const BlockKey base = hasher.Next(root, {1, 2, 3, 4});
  absl::flat_hash_set<BlockKey> seen = {base};
  // Another token, order, parent, salt, model, block size or seed: another key.
  seen.insert(hasher.Next(root, {1, 2, 3, 5}));
  seen.insert(hasher.Next(root, {2, 1, 3, 4}));
  seen.insert(hasher.Next(base, {1, 2, 3, 4}));
  seen.insert(hasher.Next(hasher.Root("salt"), {1, 2, 3, 4}));
  seen.insert(BlockHasher(4, "model-b").Next(BlockHasher(4, "model-b").Root(""), {1, 2, 3, 4}));
  const BlockHasher other_seed(4, "model-a", kClusterSeed + 1);
  seen.insert(other_seed.Next(other_seed.Root(""), {1, 2, 3, 4}));
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_FALSE(base.empty());
}

TEST(BlockHasherTest, ModelAndSaltAreFramedApart) {
  // Unframed concatenation would make ("ab", "") and ("a", "b") collide, and
  // a model named like a salt meet that salt (vLLM issue 44701's shape).
  EXPECT_NE(BlockHasher(16, "ab").Root(""), BlockHasher(16, "a").Root("b"));
  EXPECT_NE(BlockHasher(16, "x").Root(""), BlockHasher(16, "").Root("x"));
}

TEST(BlockHasherTest, SameInputsAgreeAcrossInstances) {
  // Two processes (two hashers) with the default seed name blocks alike.
  const BlockHasher a(16, "m"), b(16, "m");
  std::vector<BlockKey> ka, kb;
  a.Extend(a.Root("s"), Iota(0, 64), &ka);
  b.Extend(b.Root("s"), Iota(0, 64), &kb);
  EXPECT_EQ(ka, kb);
}

}  // namespace
}  // namespace trident::kv
