#include "common/model/safetensors_writer.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

uint64_t HeaderLength(const std::string& bytes) {
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes[b]);
  return n;
}

TEST(SafetensorsWriterTest, WritesSortedPaddedHeaderAndAlignedData) {
  SafetensorsWriter writer;
  writer.AddFloats("z_bf16", numeric::DType::kBF16, {1}, {1.0f});
  writer.AddFloats("a_f32", numeric::DType::kF32, {2}, {1.0f, -2.0f});
  absl::StatusOr<std::string> bytes = writer.Serialize();
  ASSERT_THAT(bytes, IsOk());

  const uint64_t n = HeaderLength(*bytes);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes->size(), 8 + n + 8 + 2);
  const std::string header = bytes->substr(8, n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"format":"pt"},)"
            R"("a_f32":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
            R"("z_bf16":{"data_offsets":[8,10],"dtype":"BF16","shape":[1]}})");
  // f32 1.0, f32 -2.0, bf16 1.0, little-endian.
  EXPECT_EQ(bytes->substr(8 + n), std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x80\x3f", 10));
}

TEST(SafetensorsWriterTest, RejectsByteCountThatDoesNotMatchShape) {
  SafetensorsWriter writer;
  writer.Add("w", numeric::DType::kF32, {3}, std::string(8, '\0'));
  EXPECT_THAT(writer.Serialize(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"w\"")));
}

TEST(SafetensorsWriterTest, RejectsDuplicateAndNegativeDimension) {
  SafetensorsWriter dup;
  dup.AddFloats("w", numeric::DType::kF32, {1}, {1.0f});
  dup.AddFloats("w", numeric::DType::kF32, {1}, {1.0f});
  EXPECT_THAT(dup.Serialize(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(dup.WriteSharded(::testing::TempDir(), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));

  SafetensorsWriter negative;
  negative.Add("w", numeric::DType::kF32, {-1}, "");
  EXPECT_THAT(negative.Serialize(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(SafetensorsWriterTest, WriteFailsWithPathInMessage) {
  SafetensorsWriter writer;
  EXPECT_THAT(writer.Write("/nonexistent-dir/x.safetensors"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent-dir/x.safetensors")));
}

TEST(SafetensorsWriterTest, ShardsInInsertionOrderAndWritesIndex) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/sharded_writer");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  SafetensorsWriter writer;
  writer.AddFloats("t0", numeric::DType::kF32, {4}, {0, 1, 2, 3});                    // 16 bytes
  writer.AddFloats("t1", numeric::DType::kF32, {2}, {0, 1});                          // 8 bytes
  writer.AddFloats("t2", numeric::DType::kBF16, {16}, std::vector<float>(16, 1.0f));  // 32
  ASSERT_THAT(writer.WriteSharded(dir, /*max_shard_bytes=*/24), IsOk());

  const nlohmann::json index =
      nlohmann::json::parse(ReadFile(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 56);
  EXPECT_EQ(index["weight_map"]["t0"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["t1"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["t2"], "model-00002-of-00002.safetensors");
  const std::string shard1 = ReadFile(dir + "/model-00001-of-00002.safetensors");
  const std::string shard2 = ReadFile(dir + "/model-00002-of-00002.safetensors");
  ASSERT_GE(shard1.size(), 8u);
  ASSERT_GE(shard2.size(), 8u);
  EXPECT_EQ(shard1.size(), 8 + HeaderLength(shard1) + 24);
  EXPECT_EQ(shard2.size(), 8 + HeaderLength(shard2) + 32);
}

}  // namespace
}  // namespace trident::model
