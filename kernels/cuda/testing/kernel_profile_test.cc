#include "kernels/cuda/testing/kernel_profile.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda::testing {
namespace {

using ::testing::HasSubstr;

// Appends a kernel of `name` over [start, end) ns.
void Add(std::vector<KernelRecord>& records, const std::string& name, uint64_t start,
         uint64_t end) {
  records.push_back({name, start, end});
}

TEST(ShortKernelNameTest, DropsNamespacesReturnTypeAndParameters) {
  // void trident::k::(anonymous namespace)::Gemv<(trident::k::Out)1>(float const*, int)
  EXPECT_EQ(ShortKernelName("_ZN7trident1k12_GLOBAL__N_14GemvILNS0_3OutE1EEEvPKfi"),
            "Gemv<(Out)1>");
  EXPECT_EQ(ShortKernelName("nvjet_sm90_tss_64x32_64x16_1x2_h_bz_NNT"),
            "nvjet_sm90_tss_64x32_64x16_1x2_h_bz_NNT");
  EXPECT_EQ(ShortKernelName("void a::b::Kernel<a::T, 4>(a::T*)"), "Kernel<T, 4>");
  EXPECT_EQ(ShortKernelName(std::string(100, 'x')).size(), 72u);
}

// Two steps of: an embedding, three layers of (norm, gemv, gemv) where the
// second gemv starts early (PDL) and waits, then a head.
std::vector<KernelRecord> TwoSteps(uint64_t second) {
  std::vector<KernelRecord> r;
  for (uint64_t base : {uint64_t{1000}, second}) {
    uint64_t t = base;
    Add(r, "embed", t, t + 2000);
    t += 2000;
    for (int l = 0; l < 3; ++l) {
      Add(r, "norm", t + 500, t + 1500);   // 500 ns idle ahead of it
      Add(r, "gemv", t + 1500, t + 5500);  // 4 µs
      Add(r, "gemv", t + 3000, t + 8500);  // starts early: 3 µs exposed
      t += 8500;
    }
    Add(r, "head", t, t + 10000);
  }
  return r;
}

TEST(ProfileStepsTest, FoldsTheLayersAndChargesOnlyExposedTime) {
  // Records out of order, as a trace may deliver them.
  std::vector<KernelRecord> records = TwoSteps(100000);
  std::swap(records[0], records[7]);
  auto profile = ProfileSteps(records, {0, 100000, 200000}, /*layers=*/3);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->steps, 2);
  EXPECT_EQ(profile->kernels_per_step, 11);
  EXPECT_EQ(profile->layer_kernels, 3);
  EXPECT_DOUBLE_EQ(profile->wall_us, 100.0);
  // 2 + 3 x 8.5 + 10 µs, of which 3 x 0.5 idle.
  EXPECT_DOUBLE_EQ(profile->span_us, 37.5);
  EXPECT_DOUBLE_EQ(profile->busy_us, 36.0);
  ASSERT_EQ(profile->before.size(), 1u);
  EXPECT_EQ(profile->before[0].name, "embed");
  ASSERT_EQ(profile->layer.size(), 3u);
  EXPECT_EQ(profile->layer[2].name, "gemv");
  EXPECT_DOUBLE_EQ(profile->layer[0].exposed_us, 1.0);
  EXPECT_DOUBLE_EQ(profile->layer[1].exposed_us, 4.0);
  EXPECT_DOUBLE_EQ(profile->layer[2].exposed_us, 3.0);
  EXPECT_DOUBLE_EQ(profile->layer[2].duration_us, 5.5);
  ASSERT_EQ(profile->after.size(), 1u);
  EXPECT_DOUBLE_EQ(profile->after[0].exposed_us, 10.0);
  const std::string table = FormatStepProfile(*profile);
  EXPECT_THAT(table, HasSubstr("2 steps of 11 kernels (3 layers of 3)"));
  EXPECT_THAT(table, HasSubstr("| layer | gemv | 3.00 | 5.50 | 9.0 |"));
  EXPECT_THAT(table, HasSubstr("| layer | (all) | 8.00 | - | 24.0 |"));
}

TEST(ProfileStepsTest, FoldsAllButOneOddLayer) {
  // Asked for 4 layers, the 3 that repeat are folded; the rest stay.
  auto profile = ProfileSteps(TwoSteps(100000), {0, 100000, 200000}, /*layers=*/4);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->layer_kernels, 3);
  EXPECT_EQ(profile->before.size(), 1u);
  EXPECT_EQ(profile->after.size(), 1u);
  EXPECT_THAT(FormatStepProfile(*profile), HasSubstr("(3 layers of 3)"));
}

TEST(ProfileStepsTest, WithoutARepeatEveryKernelIsAhead) {
  auto profile = ProfileSteps(TwoSteps(100000), {0, 100000, 200000}, /*layers=*/5);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->layer_kernels, 0);
  EXPECT_EQ(profile->before.size(), 11u);
  EXPECT_TRUE(profile->layer.empty());
}

TEST(ProfileStepsTest, RejectsStepsThatDifferAndBadBoundaries) {
  std::vector<KernelRecord> records = TwoSteps(100000);
  records.back().name = "sample";
  EXPECT_EQ(ProfileSteps(records, {0, 100000, 200000}, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  records.pop_back();
  EXPECT_EQ(ProfileSteps(records, {0, 100000, 200000}, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ProfileSteps(records, {5}, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileSteps(records, {200000, 0}, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileSteps({}, {0, 10}, 3).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trident::kernels::cuda::testing
