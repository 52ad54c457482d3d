#include "common/numa/numa_arena.h"

#include <numaif.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/numa/numa_binding.h"
#include "common/numa/numa_topology.h"
#include "common/numa/spin_pool.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::numa {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

const int64_t kPageBytes = sysconf(_SC_PAGESIZE);

NumaTopology ReadTopology() {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  EXPECT_THAT(topology, IsOk());
  return *std::move(topology);
}

// The fields of /proc/self/smaps for the mapping that starts at `base`
// ("VmFlags" -> "rd wr mr mw me ac hg"), values trimmed.
std::map<std::string, std::string> SmapsOf(const void* base) {
  std::ifstream in("/proc/self/smaps");
  const std::string start = absl::StrFormat("%x-", reinterpret_cast<uintptr_t>(base));
  std::map<std::string, std::string> fields;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    const std::string first_word = line.substr(0, line.find(' '));
    const bool header =
        first_word.find('-') != std::string::npos && first_word.find(':') == std::string::npos;
    if (header) {
      if (inside) break;
      inside = absl::StartsWith(line, start);
      continue;
    }
    if (!inside) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    fields[line.substr(0, colon)] =
        std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
  }
  return fields;
}

void ExpectEveryPageOnNode(const NumaArena& arena, int node) {
  absl::StatusOr<std::vector<int>> nodes =
      NodesOfPages(arena.base(), static_cast<size_t>(arena.capacity_bytes()));
  ASSERT_THAT(nodes, IsOk());
  ASSERT_EQ(static_cast<int64_t>(nodes->size()), arena.capacity_bytes() / kPageBytes);
  // Pre-faulted: every page present (no -ENOENT) and on the node.
  EXPECT_THAT(*nodes, Each(node));
  EXPECT_THAT(NodeOfAddress(arena.base()), IsOkAndHolds(node));
  EXPECT_THAT(NodeOfAddress(static_cast<char*>(arena.base()) + arena.capacity_bytes() - 1),
              IsOkAndHolds(node));
  // The mapping carries the node's MPOL_BIND.
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(get_mempolicy(&mode, mask, 16 * 8 * sizeof(unsigned long), arena.base(), MPOL_F_ADDR),
            0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[node / 64], 1UL << (node % 64));
}

TEST(NumaArenaTest, EveryPageIsPresentOnTheRequestedNodeAfterCreate) {
  const NumaTopology topology = ReadTopology();
  const int node = topology.DefaultNode();
  absl::StatusOr<std::unique_ptr<NumaArena>> arena =
      NumaArena::Create(topology, {.node = node, .capacity_bytes = (6 << 20) + 1});
  ASSERT_THAT(arena, IsOk());
  EXPECT_EQ((*arena)->capacity_bytes(), (6 << 20) + kPageBytes);  // Rounded up to a page.
  EXPECT_EQ((*arena)->node(), node);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->base()) % (2 << 20), 0u);
  ExpectEveryPageOnNode(**arena, node);
}

TEST(NumaArenaTest, PoolThreadsPrefaultEveryPageOnTheNode) {
  const NumaTopology topology = ReadTopology();
  const int node = topology.DefaultNode();
  absl::StatusOr<std::unique_ptr<SpinPool>> pool = SpinPool::CreateOnNode(topology, node);
  ASSERT_THAT(pool, IsOk());
  // Not a multiple of the pool size in huge pages, nor of a huge page.
  absl::StatusOr<std::unique_ptr<NumaArena>> arena = NumaArena::Create(
      topology,
      {.node = node, .capacity_bytes = (5 << 20) + 3 * kPageBytes, .prefault_pool = pool->get()});
  ASSERT_THAT(arena, IsOk());
  ExpectEveryPageOnNode(**arena, node);
}

TEST(NumaArenaTest, AdvisesHugePagesUnlessAskedNotTo) {
  const NumaTopology topology = ReadTopology();
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (!thp || absl::StrContains(mode, "[never]")) GTEST_SKIP() << "no transparent huge pages";
  absl::StatusOr<std::unique_ptr<NumaArena>> huge =
      NumaArena::Create(topology, {.node = topology.DefaultNode(), .capacity_bytes = 4 << 20});
  ASSERT_THAT(huge, IsOk());
  std::map<std::string, std::string> fields = SmapsOf((*huge)->base());
  EXPECT_THAT(fields["VmFlags"], HasSubstr("hg"));
  EXPECT_EQ(fields["THPeligible"], "1");
  absl::StatusOr<std::unique_ptr<NumaArena>> small = NumaArena::Create(
      topology, {.node = topology.DefaultNode(), .capacity_bytes = 4 << 20, .huge_pages = false});
  ASSERT_THAT(small, IsOk());
  fields = SmapsOf((*small)->base());
  ASSERT_TRUE(fields.contains("VmFlags"));
  EXPECT_THAT(fields["VmFlags"], Not(HasSubstr("hg")));
}

TEST(NumaArenaTest, RangesAreWritableAndCoalesceBackToOne) {
  const NumaTopology topology = ReadTopology();
  absl::StatusOr<std::unique_ptr<NumaArena>> arena =
      NumaArena::Create(topology, {.node = topology.DefaultNode(), .capacity_bytes = 1 << 20});
  ASSERT_THAT(arena, IsOk());
  NumaArena& kv = **arena;
  std::vector<ByteRange> ranges;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<ByteRange> range = kv.Allocate(64 << 10);
    ASSERT_THAT(range, IsOk());
    std::memset(kv.Pointer(*range), i, static_cast<size_t>(range->length));
    ranges.push_back(*range);
  }
  EXPECT_EQ(kv.used_bytes(), kv.capacity_bytes());
  EXPECT_THAT(kv.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("largest free range 0 bytes")));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kv.Pointer(ranges[i])[100], static_cast<char>(i));
  for (int i = 0; i < 16; i += 2) ASSERT_THAT(kv.Free(ranges[i]), IsOk());
  EXPECT_EQ(kv.num_free_ranges(), 8);
  EXPECT_EQ(kv.largest_free_range(), 64 << 10);
  EXPECT_THAT(kv.Allocate(128 << 10),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("524288 bytes free")));
  for (int i = 1; i < 16; i += 2) ASSERT_THAT(kv.Free(ranges[i]), IsOk());
  EXPECT_EQ(kv.num_free_ranges(), 1);
  EXPECT_EQ(kv.largest_free_range(), kv.capacity_bytes());
  EXPECT_EQ(kv.used_bytes(), 0);
}

TEST(NumaArenaTest, LockedArenaIsCreated) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  if (geteuid() != 0 && limit.rlim_cur < (1u << 20)) GTEST_SKIP() << "RLIMIT_MEMLOCK < 1 MiB";
  const NumaTopology topology = ReadTopology();
  absl::StatusOr<std::unique_ptr<NumaArena>> arena = NumaArena::Create(
      topology, {.node = topology.DefaultNode(), .capacity_bytes = 1 << 20, .lock = true});
  ASSERT_THAT(arena, IsOk());
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  // (The sanitizers' runtimes turn mlock into a no-op.)
  EXPECT_EQ(SmapsOf((*arena)->base())["Locked"], "1024 kB");
#endif
  ExpectEveryPageOnNode(**arena, topology.DefaultNode());
}

TEST(NumaArenaTest, RejectsUnknownNodesBadSizesAndMoreThanTheNodeHolds) {
  const NumaTopology topology = ReadTopology();
  const int node = topology.DefaultNode();
  EXPECT_THAT(NumaArena::Create(
                  topology, {.node = topology.nodes().back().id + 1, .capacity_bytes = 1 << 20}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
  EXPECT_THAT(NumaArena::Create(topology, {.node = node, .capacity_bytes = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      NumaArena::Create(topology, {.node = node, .capacity_bytes = 1 << 20, .alignment_bytes = 3}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("power of two")));
  EXPECT_THAT(NumaArena::Create(topology, {.node = node, .capacity_bytes = int64_t{1} << 50}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("bytes in all")));
}

TEST(NumaArenaTest, LargeAlignmentRoundsTheCapacity) {
  const NumaTopology topology = ReadTopology();
  absl::StatusOr<std::unique_ptr<NumaArena>> arena = NumaArena::Create(
      topology,
      {.node = topology.DefaultNode(), .capacity_bytes = 3 << 20, .alignment_bytes = 2 << 20});
  ASSERT_THAT(arena, IsOk());
  EXPECT_EQ((*arena)->capacity_bytes(), 4 << 20);
  EXPECT_THAT((*arena)->Allocate(1), IsOkAndHolds(ByteRange{0, 2 << 20}));
}

}  // namespace
}  // namespace trident::numa
