#include "kernels/cuda/gemm/skinny_split.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace trident::kernels::cuda::internal {
namespace {

// Every unit has one owner, the CTA whose run holds it; runs differ by one
// unit at most; a tile's CTAs are exactly those whose runs meet it; and the
// partial slots of the CTAs that cover part of a tile are distinct and
// within 2 x grid.
TEST(SkinnySplitTest, RunsOwnersAndSlotsAgree) {
  for (int64_t tiles : {1, 3, 16, 32, 48, 112, 224}) {
    for (int64_t chunks : {1, 2, 7, 64, 224}) {
      for (int64_t ctas : {1, 2, 5, 131, 132}) {
        const int64_t grid = std::min(ctas, tiles * chunks);
        const SkinnySplit split(tiles, chunks, grid);
        ASSERT_EQ(split.Start(0), 0);
        ASSERT_EQ(split.Start(grid), tiles * chunks);
        for (int64_t b = 0; b < grid; ++b) {
          const int64_t size = split.Start(b + 1) - split.Start(b);
          ASSERT_GE(size, (tiles * chunks) / grid);
          ASSERT_LE(size, (tiles * chunks + grid - 1) / grid);
          for (int64_t u = split.Start(b); u < split.Start(b + 1); ++u) {
            ASSERT_EQ(split.Owner(u), b) << tiles << " " << chunks << " " << grid << " " << u;
          }
        }
        std::set<int64_t> slots;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t first = split.FirstCta(t);
          const int64_t last = split.LastCta(t);
          ASSERT_LE(first, last);
          for (int64_t b = first; b <= last; ++b) {
            // b's run meets tile t.
            ASSERT_LT(split.Start(b), (t + 1) * chunks);
            ASSERT_GT(split.Start(b + 1), t * chunks);
            const bool whole =
                split.Start(b) <= t * chunks && split.Start(b + 1) >= (t + 1) * chunks;
            if (whole) {
              ASSERT_EQ(first, last);  // A whole tile has one CTA.
              continue;
            }
            const int64_t slot = split.Slot(b, t);
            ASSERT_GE(slot, 2 * b);
            ASSERT_LT(slot, 2 * b + 2);
            ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " twice";
          }
        }
      }
    }
  }
}

TEST(SkinnySplitTest, ExampleRuns) {
  // 10 units over 4 CTAs: runs of 2, 3, 2, 3 units starting at 0, 2, 5, 7.
  const SkinnySplit split(5, 2, 4);
  EXPECT_EQ(split.Start(1), 2);
  EXPECT_EQ(split.Start(2), 5);
  EXPECT_EQ(split.Start(3), 7);
  // Tile 2 (units 4, 5) is shared by CTAs 1 and 2: CTA 1's last tile (slot
  // 3), CTA 2's first (slot 4).
  EXPECT_EQ(split.FirstCta(2), 1);
  EXPECT_EQ(split.LastCta(2), 2);
  EXPECT_EQ(split.Slot(1, 2), 3);
  EXPECT_EQ(split.Slot(2, 2), 4);
}

}  // namespace
}  // namespace trident::kernels::cuda::internal
