#include "kernels/cpu/rope/rope.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/rope/rope_reference.h"
#include "nlohmann/json.hpp"

namespace trident::kernels::cpu {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 4321;

RopeConfig Llama3Config() {
  return RopeConfig{.head_dim = 128,
                    .theta = 500000.0,
                    .llama3_scaling = true,
                    .factor = 8.0f,
                    .low_freq_factor = 1.0f,
                    .high_freq_factor = 4.0f,
                    .original_max_position_embeddings = 8192};
}

RopeConfig DefaultConfig64() { return RopeConfig{.head_dim = 64, .theta = 10000.0}; }

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromHex(const std::string& hex) {
  const uint32_t u = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Output of testdata/make_hf_rope_golden.py: transformers' LlamaRotaryEmbedding
// and apply_rotary_pos_emb in float32 on a CPU, values as float bit patterns.
nlohmann::json LoadGolden() {
  std::ifstream in("kernels/cpu/rope/testdata/hf_rope_golden.json");
  EXPECT_TRUE(in) << "cannot open testdata/hf_rope_golden.json";
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::vector<float> Floats(const nlohmann::json& hex_list) {
  std::vector<float> out;
  for (const auto& h : hex_list) out.push_back(FromHex(h.get<std::string>()));
  return out;
}

// The inputs make_hf_rope_golden.py rotates, [token][head][dim].
std::vector<float> GoldenInput(int tokens, int heads, int d, bool is_q) {
  std::vector<float> out;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < d; ++i) {
        out.push_back(is_q ? static_cast<float>((h * 131 + i * 17 + t * 7) % 29 - 14) / 8.0f
                           : static_cast<float>((h * 61 + i * 13 + t * 5) % 23 - 11) / 4.0f);
      }
    }
  }
  return out;
}

const std::vector<int32_t> kGoldenPositions = {0, 1, 7, 100, 4095, 8191, 100000};

struct GoldenCase {
  const char* name;
  RopeConfig config;
  int num_q_heads;
  int num_kv_heads;
};

class RopeGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(RopeGoldenTest, InvFreqIsBitExactWithHuggingFace) {
  const GoldenCase c = GetParam();
  const nlohmann::json golden = LoadGolden();
  ASSERT_FALSE(golden.is_discarded());
  const std::vector<float> want = Floats(golden[c.name]["inv_freq"]);
  const std::vector<float> got = RopeInvFreq(c.config);
  const std::vector<float> reference = RopeInvFreqReference(c.config);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(Bits(got[i]), Bits(want[i])) << "inv_freq[" << i << "]";
    EXPECT_EQ(Bits(reference[i]), Bits(want[i])) << "reference inv_freq[" << i << "]";
  }
}

TEST_P(RopeGoldenTest, RotatedQAndKMatchHuggingFace) {
  const GoldenCase c = GetParam();
  const nlohmann::json golden = LoadGolden();
  ASSERT_FALSE(golden.is_discarded());
  const int d = c.config.head_dim;
  const int tokens = static_cast<int>(kGoldenPositions.size());
  std::vector<float> q = GoldenInput(tokens, c.num_q_heads, d, /*is_q=*/true);
  std::vector<float> k = GoldenInput(tokens, c.num_kv_heads, d, /*is_q=*/false);
  const std::vector<float> inv_freq = RopeInvFreq(c.config);
  ApplyRope(q.data(), c.num_q_heads * d, c.num_q_heads, k.data(), c.num_kv_heads * d,
            c.num_kv_heads, d, kGoldenPositions.data(), tokens, inv_freq.data());
  // torch's cos/sin (SLEEF, within 1 ulp) and glibc's may differ in the last
  // bit; products of inputs <= 2.75 in magnitude stay within 1e-6.
  const std::vector<float> want_q = Floats(golden[c.name]["q"]);
  const std::vector<float> want_k = Floats(golden[c.name]["k"]);
  ASSERT_EQ(q.size(), want_q.size());
  ASSERT_EQ(k.size(), want_k.size());
  int exact = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_NEAR(q[i], want_q[i], 1e-6f) << "q element " << i;
    exact += q[i] == want_q[i];
  }
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_NEAR(k[i], want_k[i], 1e-6f) << "k element " << i;
    exact += k[i] == want_k[i];
  }
  std::cout << c.name << ": " << exact << " of " << q.size() + k.size()
            << " rotated values bit-exact with transformers\n";
  EXPECT_GT(exact, static_cast<int>(q.size() + k.size()) * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(HuggingFaceConfigs, RopeGoldenTest,
                         ::testing::Values(GoldenCase{"default64", DefaultConfig64(), 4, 2},
                                           GoldenCase{"llama3_128", Llama3Config(), 4, 1}),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           return std::string(info.param.name) == "default64" ? "Default64"
                                                                              : "Llama3x128";
                         });

TEST(RopeInvFreqTest, Llama3ScalingDividesLowFrequenciesAndKeepsHighOnes) {
  const std::vector<float> plain = RopeInvFreq(RopeConfig{.head_dim = 128, .theta = 500000.0});
  const std::vector<float> scaled = RopeInvFreq(Llama3Config());
  ASSERT_EQ(plain.size(), scaled.size());
  int low = 0;
  int high = 0;
  int medium = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(scaled[i], plain[i] / 8.0f) << i;
      ++low;
    } else {
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8.0f) << i;
      ++medium;
    }
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);
}

TEST(ApplyRopeTest, MatchesReferenceBitForBitWithStridesAndGqa) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> position(0, 131071);
  for (const RopeConfig& config : {DefaultConfig64(), Llama3Config()}) {
    const int32_t d = config.head_dim;
    const int32_t num_q_heads = 8;
    const int32_t num_kv_heads = 2;
    const int64_t num_tokens = 37;
    // q and k live in one fused qkv row, as the projection writes them.
    const int64_t row = (num_q_heads + 2 * num_kv_heads) * d;
    std::vector<float> qkv(num_tokens * row);
    for (float& x : qkv) x = value(rng);
    std::vector<int32_t> positions(num_tokens);
    for (int32_t& p : positions) p = position(rng);
    positions[0] = 0;
    const std::vector<float> inv_freq = RopeInvFreq(config);

    std::vector<float> got = qkv;
    ApplyRope(got.data(), row, num_q_heads, got.data() + num_q_heads * d, row, num_kv_heads, d,
              positions.data(), num_tokens, inv_freq.data());
    std::vector<float> want = qkv;
    ApplyRopeReference(want.data(), row, num_q_heads, want.data() + num_q_heads * d, row,
                       num_kv_heads, d, positions.data(), num_tokens, inv_freq.data());
    EXPECT_EQ(got, want) << "head_dim " << d;
    // Position 0 is the identity; v (the last 2 heads of each row) is untouched.
    for (int64_t i = 0; i < (num_q_heads + num_kv_heads) * d; ++i) EXPECT_EQ(got[i], qkv[i]);
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t i = (num_q_heads + num_kv_heads) * d; i < row; ++i) {
        ASSERT_EQ(got[t * row + i], qkv[t * row + i]);
      }
    }
  }
}

TEST(ApplyRopeTest, RotatesPairsByTheAngle) {
  // head_dim 2: one pair, inv_freq 1, position 3: rotation by 3 radians.
  const float inv_freq[] = {1.0f};
  const int32_t positions[] = {3};
  float q[] = {1.0f, 0.0f};
  ApplyRope(q, 2, 1, nullptr, 0, 0, 2, positions, 1, inv_freq);
  EXPECT_FLOAT_EQ(q[0], std::cos(3.0f));
  EXPECT_FLOAT_EQ(q[1], std::sin(3.0f));
}

TEST(ValidateRopeConfigTest, AcceptsModelConfigs) {
  EXPECT_THAT(ValidateRopeConfig(DefaultConfig64()), IsOk());
  EXPECT_THAT(ValidateRopeConfig(Llama3Config()), IsOk());
}

TEST(ValidateRopeConfigTest, NamesTheBadField) {
  RopeConfig odd = DefaultConfig64();
  odd.head_dim = 63;
  EXPECT_THAT(ValidateRopeConfig(odd),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  RopeConfig zero_theta = DefaultConfig64();
  zero_theta.theta = 0.0;
  EXPECT_THAT(ValidateRopeConfig(zero_theta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_theta")));
  RopeConfig equal_factors = Llama3Config();
  equal_factors.high_freq_factor = equal_factors.low_freq_factor;
  EXPECT_THAT(ValidateRopeConfig(equal_factors),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("high_freq_factor")));
  RopeConfig no_factor = Llama3Config();
  no_factor.factor = 0.0f;
  EXPECT_THAT(ValidateRopeConfig(no_factor),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling.factor")));
  RopeConfig no_context = Llama3Config();
  no_context.original_max_position_embeddings = 0;
  EXPECT_THAT(
      ValidateRopeConfig(no_context),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("original_max_position_embeddings")));
}

}  // namespace
}  // namespace trident::kernels::cpu
