// Argument checks of LaunchSample: host code only, every case returns
// before touching the device, so this runs without a GPU.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/sampling/sampling.h"

namespace trident::kernels::cuda {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Host memory standing in for device pointers: the checks only look at
// null-ness, alignment and sizes.
struct FakePointers {
  alignas(16) float logits[64];
  SamplingRow params[2];
  int32_t tokens[2];
  int32_t top_ids[2 * kMaxSampleTopLogprobs];
  float top_logprobs[2 * kMaxSampleTopLogprobs];
  alignas(16) float workspace[2 * 64 + 8];
};

SampleArgs ValidArgs(FakePointers& p) {
  return SampleArgs{
      .logits = p.logits,
      .logits_dtype = numeric::DType::kF32,
      .logits_stride = 32,
      .rows = 2,
      .vocab = 30,
      .params = p.params,
      .tokens = p.tokens,
      .max_top_logprobs = 2,
      .top_ids = p.top_ids,
      .top_logprobs = p.top_logprobs,
      .workspace = p.workspace,
      .workspace_bytes = SampleWorkspaceBytes(2, 30),
  };
}

absl::Status LaunchWith(SampleArgs args) { return LaunchSample(args, nullptr); }

TEST(SampleWorkspaceBytesTest, OneFloatPerLogitRoundedToSixteenBytesPerRow) {
  EXPECT_EQ(SampleWorkspaceBytes(2, 30), 2u * 32 * 4);
  EXPECT_EQ(SampleWorkspaceBytes(1, 1), 16u);
  EXPECT_EQ(SampleWorkspaceBytes(256, 151936), 256u * 151936 * 4);
  EXPECT_EQ(SampleWorkspaceBytes(0, 100), 0u);
  EXPECT_EQ(SampleWorkspaceBytes(3, 0), 0u);
}

TEST(LaunchSampleArgsTest, ZeroRowsIsANoOp) {
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.rows = 0;
  args.logits = nullptr;
  args.workspace = nullptr;
  args.workspace_bytes = 0;
  EXPECT_THAT(LaunchWith(args), IsOk());
}

TEST(LaunchSampleArgsTest, RejectsBadShapes) {
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.rows = -1;
  EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  args = ValidArgs(p);
  args.rows = int64_t{1} << 31;
  EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  args = ValidArgs(p);
  args.vocab = 0;
  EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab")));
  args.vocab = kMaxSampleVocab + 1;
  EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab")));
  args = ValidArgs(p);
  args.logits_stride = 29;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logits_stride")));
}

TEST(LaunchSampleArgsTest, RejectsDtypesOtherThanF32AndBf16) {
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.logits_dtype = numeric::DType::kF16;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logits_dtype")));
}

TEST(LaunchSampleArgsTest, RejectsTopLogprobsCapacityOutOfRange) {
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.max_top_logprobs = -1;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_top_logprobs")));
  args.max_top_logprobs = kMaxSampleTopLogprobs + 1;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_top_logprobs")));
}

TEST(LaunchSampleArgsTest, RejectsNullPointersNamingThem) {
  FakePointers p;
  const struct {
    const char* field;
    void (*clear)(SampleArgs&);
  } cases[] = {
      {"logits", [](SampleArgs& a) { a.logits = nullptr; }},
      {"params", [](SampleArgs& a) { a.params = nullptr; }},
      {"tokens", [](SampleArgs& a) { a.tokens = nullptr; }},
      {"top_ids", [](SampleArgs& a) { a.top_ids = nullptr; }},
      {"top_logprobs", [](SampleArgs& a) { a.top_logprobs = nullptr; }},
      {"workspace", [](SampleArgs& a) { a.workspace = nullptr; }},
  };
  for (const auto& c : cases) {
    SampleArgs args = ValidArgs(p);
    c.clear(args);
    EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
}

TEST(LaunchSampleArgsTest, AllowsNullTopOutputsWithoutTopLogprobs) {
  // Not launched (rows = 0 would skip every check): a null top output is
  // only an error when max_top_logprobs > 0, so the remaining error must be
  // the workspace one.
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.max_top_logprobs = 0;
  args.top_ids = nullptr;
  args.top_logprobs = nullptr;
  args.workspace_bytes = 0;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace_bytes")));
}

TEST(LaunchSampleArgsTest, RejectsSmallOrMisalignedWorkspace) {
  FakePointers p;
  SampleArgs args = ValidArgs(p);
  args.workspace_bytes = SampleWorkspaceBytes(2, 30) - 1;
  EXPECT_THAT(LaunchWith(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace_bytes")));
  args = ValidArgs(p);
  args.workspace = reinterpret_cast<char*>(p.workspace) + 4;
  EXPECT_THAT(LaunchWith(args), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("workspace is not 16-byte aligned")));
}

}  // namespace
}  // namespace trident::kernels::cuda
