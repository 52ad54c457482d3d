#include "common/backend/cuda/sampling_batch.h"

#include <cstdint>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::trident::kernels::cuda::SamplingRow;
using ::trident::kernels::cuda::SamplingTokenCount;

sampling::PenaltyState Penalties(const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& output) {
  sampling::PenaltyState state(prompt);
  for (const int32_t token : output) state.AddOutputToken(token);
  return state;
}

std::vector<int32_t> Tokens(const std::vector<SamplingTokenCount>& counts) {
  std::vector<int32_t> tokens;
  for (const SamplingTokenCount& c : counts) tokens.push_back(c.token);
  return tokens;
}

std::vector<int32_t> Counts(const std::vector<SamplingTokenCount>& counts) {
  std::vector<int32_t> values;
  for (const SamplingTokenCount& c : counts) values.push_back(c.count);
  return values;
}

TEST(SamplingBatchBuilderTest, CopiesParamsAndPosition) {
  sampling::SamplingParams params;
  params.temperature = 0.7f;
  params.top_p = 0.9f;
  params.top_k = 40;
  params.min_p = 0.05f;
  params.repetition_penalty = 1.1f;
  params.presence_penalty = 0.25f;
  params.frequency_penalty = -0.5f;
  params.seed = 0x1234567890abcdefull;
  params.top_logprobs = 3;
  SamplingBatchBuilder builder;
  builder.Add(params, sampling::PenaltyState(), 17);
  ASSERT_EQ(builder.num_rows(), 1);
  const SamplingRow& row = builder.rows()[0];
  EXPECT_EQ(row.temperature, 0.7f);
  EXPECT_EQ(row.top_p, 0.9f);
  EXPECT_EQ(row.top_k, 40);
  EXPECT_EQ(row.min_p, 0.05f);
  EXPECT_EQ(row.repetition_penalty, 1.1f);
  EXPECT_EQ(row.presence_penalty, 0.25f);
  EXPECT_EQ(row.frequency_penalty, -0.5f);
  EXPECT_EQ(row.seed, 0x1234567890abcdefull);
  EXPECT_EQ(row.output_position, 17);
  EXPECT_EQ(row.top_logprobs, 3);
  EXPECT_TRUE(row.logprobs);  // top_logprobs > 0 implies logprobs.
  EXPECT_EQ(builder.max_top_logprobs(), 3);
  EXPECT_TRUE(builder.any_logprobs());
}

TEST(SamplingBatchBuilderTest, BuildsCsrRangesPerRow) {
  sampling::SamplingParams penalized;
  penalized.repetition_penalty = 1.3f;
  penalized.frequency_penalty = 0.5f;
  sampling::SamplingParams plain;
  SamplingBatchBuilder builder;
  // Out-of-range ids are kept for the kernel to ignore, as the CPU does.
  builder.Add(penalized, Penalties({5, 7, 5, -1}, {7, 9, 7, 100000}), 3);
  builder.Add(plain, Penalties({1, 2, 3}, {4}), 1);
  builder.Add(penalized, Penalties({8}, {8, 8}), 2);
  ASSERT_EQ(builder.num_rows(), 3);
  EXPECT_THAT(builder.seen_tokens(), ElementsAre(5, 7, -1, 9, 100000, 8));
  EXPECT_THAT(Tokens(builder.output_counts()), ElementsAre(7, 9, 100000, 8));
  EXPECT_THAT(Counts(builder.output_counts()), ElementsAre(2, 1, 1, 2));
  const std::vector<SamplingRow>& rows = builder.rows();
  EXPECT_EQ(rows[0].seen_begin, 0);
  EXPECT_EQ(rows[0].seen_end, 5);
  EXPECT_EQ(rows[0].counts_begin, 0);
  EXPECT_EQ(rows[0].counts_end, 3);
  // No penalties: no CSR entries.
  EXPECT_EQ(rows[1].seen_begin, 5);
  EXPECT_EQ(rows[1].seen_end, 5);
  EXPECT_EQ(rows[1].counts_begin, 3);
  EXPECT_EQ(rows[1].counts_end, 3);
  EXPECT_EQ(rows[2].seen_begin, 5);
  EXPECT_EQ(rows[2].seen_end, 6);
  EXPECT_EQ(rows[2].counts_begin, 3);
  EXPECT_EQ(rows[2].counts_end, 4);
  EXPECT_EQ(builder.max_top_logprobs(), 0);
  EXPECT_FALSE(builder.any_logprobs());
}

TEST(SamplingBatchBuilderTest, CopiesOnlyTheListsOfPenaltiesThatAreOn) {
  sampling::SamplingParams presence_only;
  presence_only.presence_penalty = 0.1f;
  sampling::SamplingParams repetition_only;
  repetition_only.repetition_penalty = 0.9f;
  SamplingBatchBuilder builder;
  builder.Add(presence_only, Penalties({1}, {2}), 0);
  EXPECT_THAT(builder.seen_tokens(), IsEmpty());
  EXPECT_THAT(Tokens(builder.output_counts()), ElementsAre(2));
  builder.Clear();
  builder.Add(repetition_only, Penalties({1}, {2}), 0);
  EXPECT_THAT(builder.seen_tokens(), ElementsAre(1, 2));
  EXPECT_THAT(builder.output_counts(), IsEmpty());
}

TEST(SamplingBatchBuilderTest, ClearForgetsRowsAndMaxima) {
  sampling::SamplingParams params;
  params.logprobs = true;
  params.top_logprobs = 5;
  params.repetition_penalty = 1.2f;
  SamplingBatchBuilder builder;
  builder.Add(params, Penalties({1, 2}, {}), 0);
  builder.Clear();
  EXPECT_EQ(builder.num_rows(), 0);
  EXPECT_THAT(builder.seen_tokens(), IsEmpty());
  EXPECT_THAT(builder.output_counts(), IsEmpty());
  EXPECT_EQ(builder.max_top_logprobs(), 0);
  EXPECT_FALSE(builder.any_logprobs());
  builder.Add(sampling::SamplingParams(), sampling::PenaltyState(), 4);
  ASSERT_EQ(builder.num_rows(), 1);
  EXPECT_EQ(builder.rows()[0].seen_begin, 0);
  EXPECT_EQ(builder.rows()[0].output_position, 4);
}

}  // namespace
}  // namespace trident::backend
