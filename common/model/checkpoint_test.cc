#include "common/model/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/safetensors_writer.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// A fresh directory named after the running test.
std::string TestDir() {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

void WriteFile(const std::string& path, const std::string& contents) {
  ASSERT_THAT(WriteStringToFile(path, contents), IsOk());
}

// Values exactly representable in bf16 and f16.
const std::vector<float> kValues = {1.0f, -2.5f, 0.125f, 3.0f, -0.75f, 16.0f};

SafetensorsWriter ThreeDtypes() {
  SafetensorsWriter writer;
  writer.AddFloats("f32", numeric::DType::kF32, {2, 3}, kValues);
  writer.AddFloats("bf16", numeric::DType::kBF16, {6}, kValues);
  writer.AddFloats("f16", numeric::DType::kF16, {3, 2}, kValues);
  return writer;
}

// A safetensors file holding an f32 [2] tensor for each of `names`.
void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter writer;
  for (const std::string& name : names) {
    writer.AddFloats(name, numeric::DType::kF32, {2}, {1.0f, 2.0f});
  }
  ASSERT_THAT(writer.Write(path), IsOk());
}

TEST(CheckpointTest, ReadsEveryDtypeAsFloatAndBf16) {
  const std::string dir = TestDir();
  ASSERT_THAT(ThreeDtypes().Write(dir + "/model.safetensors"), IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  const Checkpoint& ckpt = **checkpoint;

  EXPECT_THAT(ckpt.TensorNames(), ElementsAre("bf16", "f16", "f32"));
  EXPECT_EQ(ckpt.total_bytes(), 24u + 12u + 12u);
  EXPECT_THAT(ckpt.files(), ElementsAre(dir + "/model.safetensors"));
  for (const char* name : {"f32", "bf16", "f16"}) {
    std::vector<float> f(6);
    ASSERT_THAT(ckpt.ReadFloat(name, absl::MakeSpan(f)), IsOk()) << name;
    EXPECT_EQ(f, kValues) << name;
    std::vector<uint16_t> b(6);
    ASSERT_THAT(ckpt.ReadBf16(name, absl::MakeSpan(b)), IsOk()) << name;
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(numeric::Bf16ToFloat(b[i]), kValues[i]) << name << "[" << i << "]";
    }
  }
  absl::StatusOr<TensorInfo> info = ckpt.Info("f16");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->file, dir + "/model.safetensors");
  EXPECT_EQ(info->dtype, numeric::DType::kF16);
  EXPECT_EQ(info->dtype_name, "F16");
  EXPECT_THAT(info->shape, ElementsAre(3, 2));
  EXPECT_EQ(info->numel, 6);
  EXPECT_EQ(info->num_bytes, 12u);
  EXPECT_TRUE(ckpt.Has("f32"));
  EXPECT_FALSE(ckpt.Has("f64"));
}

TEST(CheckpointTest, RoundsF32ToBf16ToNearestEven) {
  const std::string dir = TestDir();
  SafetensorsWriter writer;
  writer.AddFloats("w", numeric::DType::kF32, {2}, {1.00390625f, 1.01171875f});
  ASSERT_THAT(writer.Write(dir + "/model.safetensors"), IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  std::vector<uint16_t> b(2);
  ASSERT_THAT((*ckpt)->ReadBf16("w", absl::MakeSpan(b)), IsOk());
  EXPECT_THAT(b, ElementsAre(0x3f80, 0x3f82));
}

TEST(CheckpointTest, ReadErrors) {
  const std::string dir = TestDir();
  // An I64 tensor the loader cannot compute with, next to a readable one.
  std::string header = R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string file;
  for (int b = 0; b < 8; ++b) file.push_back(static_cast<char>((header.size() >> (8 * b)) & 0xff));
  WriteFile(dir + "/model.safetensors", file + header + std::string(16, '\0'));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  std::vector<float> two(2), three(3);
  EXPECT_THAT((*ckpt)->ReadFloat("w", absl::MakeSpan(three)),
              StatusIs(kInvalid, AllOf(HasSubstr("\"w\""), HasSubstr("model.safetensors"),
                                       HasSubstr("has 2 elements; the output holds 3"))));
  EXPECT_THAT((*ckpt)->ReadFloat("ids", absl::MakeSpan(two)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("I64")));
  EXPECT_THAT((*ckpt)->ReadFloat("nope", absl::MakeSpan(two)),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("\"nope\""), HasSubstr(dir))));
  EXPECT_THAT((*ckpt)->Info("nope"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT((*ckpt)->ReadFloat("w", absl::MakeSpan(two)), IsOk());
  EXPECT_THAT(two, ElementsAre(0.0f, 0.0f));
}

TEST(CheckpointTest, ReadsRowAndColumnSlicesOfEveryDtype) {
  const std::string dir = TestDir();
  ASSERT_THAT(ThreeDtypes().Write(dir + "/model.safetensors"), IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  const Checkpoint& ckpt = **checkpoint;
  // f32 [2, 3] = {{1, -2.5, 0.125}, {3, -0.75, 16}}.
  std::vector<float> f(2);
  ASSERT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kColumns, 1, 2}, absl::MakeSpan(f)), IsOk());
  EXPECT_THAT(f, ElementsAre(-2.5f, -0.75f));
  std::vector<float> row(3);
  ASSERT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kRows, 1, 2}, absl::MakeSpan(row)), IsOk());
  EXPECT_THAT(row, ElementsAre(3.0f, -0.75f, 16.0f));
  // f16 [3, 2] = {{1, -2.5}, {0.125, 3}, {-0.75, 16}}, as bf16.
  std::vector<uint16_t> b(3);
  ASSERT_THAT(ckpt.ReadBf16Slice("f16", {SliceAxis::kColumns, 1, 2}, absl::MakeSpan(b)), IsOk());
  EXPECT_EQ(numeric::Bf16ToFloat(b[0]), -2.5f);
  EXPECT_EQ(numeric::Bf16ToFloat(b[1]), 3.0f);
  EXPECT_EQ(numeric::Bf16ToFloat(b[2]), 16.0f);
  // bf16 [6]: rows are elements.
  std::vector<float> middle(2);
  ASSERT_THAT(ckpt.ReadFloatSlice("bf16", {SliceAxis::kRows, 2, 4}, absl::MakeSpan(middle)),
              IsOk());
  EXPECT_THAT(middle, ElementsAre(0.125f, 3.0f));
}

TEST(CheckpointTest, SliceErrorsNameTheTensorAndTheRange) {
  const std::string dir = TestDir();
  ASSERT_THAT(ThreeDtypes().Write(dir + "/model.safetensors"), IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  const Checkpoint& ckpt = **checkpoint;
  std::vector<float> two(2), four(4);
  EXPECT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kColumns, 2, 4}, absl::MakeSpan(two)),
              StatusIs(kInvalid, AllOf(HasSubstr("\"f32\""), HasSubstr("columns [2, 4)"),
                                       HasSubstr("[0, 3)"))));
  EXPECT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kRows, 1, 1}, absl::MakeSpan(two)),
              StatusIs(kInvalid, HasSubstr("non-empty")));
  EXPECT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kRows, -1, 1}, absl::MakeSpan(two)),
              StatusIs(kInvalid));
  EXPECT_THAT(ckpt.ReadFloatSlice("bf16", {SliceAxis::kColumns, 0, 1}, absl::MakeSpan(two)),
              StatusIs(kInvalid, HasSubstr("1-D")));
  EXPECT_THAT(ckpt.ReadFloatSlice("f32", {SliceAxis::kRows, 0, 1}, absl::MakeSpan(four)),
              StatusIs(kInvalid, HasSubstr("the slice has 3 elements; the output holds 4")));
  EXPECT_THAT(ckpt.ReadFloatSlice("nope", {SliceAxis::kRows, 0, 1}, absl::MakeSpan(two)),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(CheckpointTest, ConvertsMisalignedData) {
  const std::string dir = TestDir();
  // Header length 61: data starts at byte 69, so f32 and bf16 data are misaligned in memory.
  std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  header.append(61 - header.size(), ' ');
  std::string file;
  for (int b = 0; b < 8; ++b) file.push_back(static_cast<char>((header.size() >> (8 * b)) & 0xff));
  const float values[3] = {1.5f, -3.0f, 7.25f};
  file += header + std::string(reinterpret_cast<const char*>(values), sizeof(values));
  WriteFile(dir + "/weights.safetensors", file);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  std::vector<float> f(3);
  ASSERT_THAT((*ckpt)->ReadFloat("w", absl::MakeSpan(f)), IsOk());
  EXPECT_THAT(f, ElementsAre(1.5f, -3.0f, 7.25f));
  std::vector<uint16_t> b(3);
  ASSERT_THAT((*ckpt)->ReadBf16("w", absl::MakeSpan(b)), IsOk());
  EXPECT_EQ(numeric::Bf16ToFloat(b[2]), 7.25f);
}

TEST(CheckpointTest, OpensShardedCheckpointWrittenByWriter) {
  const std::string dir = TestDir();
  ASSERT_THAT(ThreeDtypes().WriteSharded(dir, /*max_shard_bytes=*/24), IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->total_bytes(), 48u);
  std::vector<float> f(6);
  ASSERT_THAT((*ckpt)->ReadFloat("f16", absl::MakeSpan(f)), IsOk());
  EXPECT_EQ(f, kValues);
  absl::StatusOr<TensorInfo> info = (*ckpt)->Info("bf16");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->file, dir + "/model-00002-of-00002.safetensors");
}

TEST(CheckpointTest, PrefersModelSafetensorsOverIndex) {
  const std::string dir = TestDir();
  WriteShard(dir + "/model.safetensors", {"single"});
  WriteFile(dir + "/model.safetensors.index.json", "not json");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT((*ckpt)->TensorNames(), ElementsAre("single"));
}

TEST(CheckpointTest, OpensLoneOtherSafetensorsFile) {
  const std::string dir = TestDir();
  WriteShard(dir + "/consolidated.safetensors", {"x"});
  WriteFile(dir + "/config.json", "{}");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_TRUE((*ckpt)->Has("x"));
}

TEST(CheckpointTest, RefusesSeveralFilesWithoutIndex) {
  const std::string dir = TestDir();
  WriteShard(dir + "/a.safetensors", {"x"});
  WriteShard(dir + "/b.safetensors", {"y"});
  EXPECT_THAT(Checkpoint::Open(dir), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              AllOf(HasSubstr("a.safetensors"),
                                                    HasSubstr("model.safetensors.index.json"))));
}

TEST(CheckpointTest, MissingDirectoryOrWeightsIsNotFound) {
  const std::string dir = TestDir();
  EXPECT_THAT(Checkpoint::Open(dir + "/nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/nope")));
  WriteFile(dir + "/config.json", "{}");
  EXPECT_THAT(Checkpoint::Open(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
  EXPECT_THAT(Checkpoint::Open(dir + "/config.json"),
              StatusIs(kInvalid, HasSubstr("not a directory")));
}

TEST(CheckpointTest, MalformedShardFailsWithItsName) {
  const std::string dir = TestDir();
  WriteFile(dir + "/model.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10) + "junk");
  EXPECT_THAT(Checkpoint::Open(dir), StatusIs(kInvalid, AllOf(HasSubstr(dir + "/model.safetensors"),
                                                              HasSubstr("belong to no tensor"))));
}

// Index cases: shards s1 (a, b) and s2 (c) with an index written by hand.
class CheckpointIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    WriteShard(dir_ + "/s1.safetensors", {"a", "b"});
    WriteShard(dir_ + "/s2.safetensors", {"c"});
  }
  void WriteIndex(const std::string& weight_map) {
    WriteFile(dir_ + "/model.safetensors.index.json",
              absl::StrCat(R"({"metadata":{"total_size":24},"weight_map":)", weight_map, "}"));
  }
  std::string index() const { return dir_ + "/model.safetensors.index.json"; }

  std::string dir_;
};

TEST_F(CheckpointIndexTest, OpensValidIndex) {
  WriteIndex(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT((*ckpt)->TensorNames(), ElementsAre("a", "b", "c"));
  absl::StatusOr<TensorInfo> c = (*ckpt)->Info("c");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->file, dir_ + "/s2.safetensors");
}

TEST_F(CheckpointIndexTest, MissingShardIsNotFound) {
  WriteIndex(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(index()), HasSubstr("s3.safetensors"), HasSubstr("\"c\""))));
}

TEST_F(CheckpointIndexTest, TensorNotInItsShardIsInvalid) {
  WriteIndex(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s1.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(kInvalid, AllOf(HasSubstr(index()), HasSubstr("\"c\""),
                                       HasSubstr("does not contain it"))));
}

TEST_F(CheckpointIndexTest, TensorInTwoShardsIsInvalid) {
  WriteShard(dir_ + "/s3.safetensors", {"c"});
  WriteIndex(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
             R"("x":"s3.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(kInvalid, AllOf(HasSubstr("\"c\" is in both s2.safetensors and "
                                                 "s3.safetensors"))));
}

TEST_F(CheckpointIndexTest, TensorListedTwiceInWeightMapIsInvalid) {
  WriteIndex(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
             R"("a":"s2.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(kInvalid, AllOf(HasSubstr(index()), HasSubstr("\"a\" appears twice"))));
}

TEST_F(CheckpointIndexTest, ShardPathsMayNotLeaveTheDirectory) {
  for (const char* shard : {"../s1.safetensors", "/etc/passwd", "sub/s1.safetensors", "..", ""}) {
    WriteIndex(absl::StrCat(R"({"a":")", shard, R"("})"));
    EXPECT_THAT(Checkpoint::Open(dir_),
                StatusIs(kInvalid, AllOf(HasSubstr(index()), HasSubstr("not a file name inside"))))
        << shard;
  }
}

TEST_F(CheckpointIndexTest, MalformedIndexIsInvalid) {
  WriteFile(index(), "{\"weight_map\": ");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("not valid JSON")));
  WriteFile(index(), "[]");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("not a JSON object")));
  WriteFile(index(), R"({"metadata":{}})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("\"weight_map\" is missing")));
  WriteFile(index(), R"({"weight_map":{}})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("empty")));
  WriteFile(index(), R"({"weight_map":{"a":1}})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("not a string")));
  WriteFile(index(), R"({"metadata":{"total_size":-1},"weight_map":{"a":"s1.safetensors"}})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, HasSubstr("total_size")));
}

}  // namespace
}  // namespace trident::model
