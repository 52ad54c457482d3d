#include "common/model/load_progress.h"

#include <cstdint>

#include "absl/time/time.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(FormatBytesTest, PicksLargestUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(2048), "2 KiB");
  EXPECT_EQ(FormatBytes(850.0 * kMiB), "850 MiB");
  EXPECT_EQ(FormatBytes(1.3 * kGiB), "1.3 GiB");
  EXPECT_EQ(FormatBytes(3.0 * kGiB * 1024), "3.0 TiB");
}

TEST(LoadProgressTest, FormatsPercentSizesAndRate) {
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  const uint64_t total = static_cast<uint64_t>(2.8 * kGiB);
  LoadProgress progress(total, &clock);
  EXPECT_EQ(progress.Line(), "loading weights: 0% (0.0 of 2.8 GiB, -)");
  clock.Advance(absl::Milliseconds(1500));
  progress.Add(static_cast<uint64_t>(0.43 * total) + 1);
  // 1.2 GiB in 1.5 s is 822 MiB/s.
  EXPECT_EQ(progress.Line(), "loading weights: 43% (1.2 of 2.8 GiB, 822 MiB/s)");
}

TEST(LoadProgressTest, SmallTotalsUseSmallerUnits) {
  FakeClock clock;
  LoadProgress progress(280 * kMiB, &clock);
  clock.Advance(absl::Seconds(2));
  progress.Add(120 * kMiB);
  EXPECT_EQ(progress.Line(), "loading weights: 42% (120 of 280 MiB, 60 MiB/s)");
}

TEST(LoadProgressTest, LogsAtMostOncePerSecondAndAtCompletion) {
  FakeClock clock;
  LoadProgress progress(100, &clock);
  progress.Add(10);  // t=0: less than a second since start.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 0);
  clock.Advance(absl::Milliseconds(999));
  progress.Add(10);
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 0);
  clock.Advance(absl::Milliseconds(1));
  progress.Add(10);  // t=1s: logs.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 1);
  clock.Advance(absl::Milliseconds(500));
  progress.Add(10);  // t=1.5s: within a second of the last line.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 1);
  progress.Add(60);  // Reaches 100%: logs at once.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 2);
  EXPECT_EQ(progress.loaded_bytes(), 100u);
  progress.Add(1);  // Past completion, within a second: no second completion line.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 2);
  clock.Advance(absl::Seconds(1));
  progress.Add(1);  // A second later the periodic line still appears.
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 3);
}

TEST(LoadProgressTest, EmptyCheckpointCompletesOnFirstAdd) {
  FakeClock clock;
  LoadProgress progress(0, &clock);
  EXPECT_EQ(progress.Line(), "loading weights: 100% (0 of 0 B, -)");
  progress.Add(0);
  EXPECT_EQ(progress.num_lines_logged_for_testing(), 1);
}

TEST(LoadProgressTest, ALabelBeginsEachLine) {
  FakeClock clock;
  LoadProgress progress(100, &clock, "rank 2: ");
  EXPECT_EQ(progress.Line(), "rank 2: loading weights: 0% (0 of 100 B, -)");
}

}  // namespace
}  // namespace trident::model
