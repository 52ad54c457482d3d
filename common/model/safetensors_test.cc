#include "common/model/safetensors.h"

#include <sys/stat.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
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

// A file with an explicit header length `n` (defaults to the header's size).
std::string FileWithHeader(const std::string& header, const std::string& data,
                           absl::optional<uint64_t> n = absl::nullopt) {
  const uint64_t len = n.value_or(header.size());
  std::string out;
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((len >> (8 * b)) & 0xff));
  return out + header + data;
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(file, file.size(), "w.safetensors");
}

// Parses a one-entry header {"t": <entry>} with `data_bytes` zero bytes of data.
absl::StatusOr<SafetensorsHeader> ParseEntry(const std::string& entry, size_t data_bytes) {
  return Parse(FileWithHeader(absl::StrCat(R"({"t":)", entry, "}"), std::string(data_bytes, 0)));
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  EXPECT_THAT(WriteStringToFile(path, contents), IsOk());
  return path;
}

TEST(ParseSafetensorsHeaderTest, ParsesWriterOutput) {
  SafetensorsWriter writer;
  writer.AddFloats("b", numeric::DType::kBF16, {2, 3}, {1, 2, 3, 4, 5, 6});
  writer.AddFloats("a", numeric::DType::kF32, {}, {7});
  writer.AddFloats("empty", numeric::DType::kF16, {0, 5}, {});
  writer.AddMetadata("source", "test");
  absl::StatusOr<std::string> bytes = writer.Serialize();
  ASSERT_THAT(bytes, IsOk());

  absl::StatusOr<SafetensorsHeader> header = Parse(*bytes);
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->data_offset % 8, 0u);
  EXPECT_EQ(header->data_bytes, 4u + 12u);
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "a");
  EXPECT_EQ(header->tensors[0].dtype, numeric::DType::kF32);
  EXPECT_THAT(header->tensors[0].shape, ElementsAre());
  EXPECT_EQ(header->tensors[0].numel, 1);
  EXPECT_EQ(header->tensors[1].name, "b");
  EXPECT_EQ(header->tensors[1].dtype_name, "BF16");
  EXPECT_THAT(header->tensors[1].shape, ElementsAre(2, 3));
  EXPECT_EQ(header->tensors[1].num_bytes(), 12u);
  EXPECT_EQ(header->tensors[2].name, "empty");
  EXPECT_EQ(header->tensors[2].numel, 0);
  EXPECT_EQ(header->metadata.at("source"), "test");
  EXPECT_EQ(header->metadata.at("format"), "pt");
}

TEST(ParseSafetensorsHeaderTest, AcceptsEmptyHeaderAndUnpaddedLength) {
  EXPECT_THAT(Parse(FileWithHeader("{}", "")), IsOk());
  // N need not be a multiple of 8.
  absl::StatusOr<SafetensorsHeader> header = Parse(FileWithHeader(
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)));
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->data_offset, 8u + header->header_bytes);
}

TEST(ParseSafetensorsHeaderTest, RejectsFileShorterThanLengthPrefix) {
  EXPECT_THAT(Parse("1234567"),
              StatusIs(kInvalid, AllOf(HasSubstr("w.safetensors"), HasSubstr("7 bytes"))));
}

TEST(ParseSafetensorsHeaderTest, RejectsHugeHeaderLength) {
  EXPECT_THAT(Parse(FileWithHeader("{}", "", uint64_t{200} << 20)),
              StatusIs(kInvalid, HasSubstr("exceeds the limit")));
  EXPECT_THAT(Parse(FileWithHeader("{}", "", ~uint64_t{1})),
              StatusIs(kInvalid, HasSubstr("exceeds the limit")));
}

TEST(ParseSafetensorsHeaderTest, RejectsHeaderLengthPastEndOfFile) {
  EXPECT_THAT(Parse(FileWithHeader("{}", "", 3)),
              StatusIs(kInvalid, HasSubstr("runs past the end")));
}

TEST(ParseSafetensorsHeaderTest, AsksForMoreBytesWhenPrefixIsShort) {
  const std::string file = FileWithHeader("{}      ", "");
  EXPECT_THAT(ParseSafetensorsHeader(file.substr(0, 10), file.size(), "w"),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ParseSafetensorsHeader(file, file.size() - 1, "w"), StatusIs(kInvalid));
}

TEST(ParseSafetensorsHeaderTest, RejectsInvalidJsonAndInvalidUtf8) {
  EXPECT_THAT(Parse(FileWithHeader(R"({"t":)", "")),
              StatusIs(kInvalid, AllOf(HasSubstr("w.safetensors"), HasSubstr("not valid JSON"))));
  EXPECT_THAT(Parse(FileWithHeader("{\"\xff\":1}", "")),
              StatusIs(kInvalid, HasSubstr("not valid JSON")));
  EXPECT_THAT(Parse(FileWithHeader("{} {}", "")), StatusIs(kInvalid, HasSubstr("not valid JSON")));
}

TEST(ParseSafetensorsHeaderTest, RejectsNonObjectHeader) {
  EXPECT_THAT(Parse(FileWithHeader("[1,2]", "")), StatusIs(kInvalid, HasSubstr("not an object")));
  EXPECT_THAT(Parse(FileWithHeader("7", "")), StatusIs(kInvalid, HasSubstr("not an object")));
}

TEST(ParseSafetensorsHeaderTest, RejectsRepeatedTensorName) {
  EXPECT_THAT(Parse(FileWithHeader(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                   std::string(4, 0))),
              StatusIs(kInvalid, HasSubstr("\"t\" appears twice")));
}

TEST(ParseSafetensorsHeaderTest, RejectsMalformedEntries) {
  EXPECT_THAT(ParseEntry("[]", 0), StatusIs(kInvalid, HasSubstr("not an object")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1})", 4),
              StatusIs(kInvalid, AllOf(HasSubstr("tensor \"t\""), HasSubstr("unknown key"))));
  EXPECT_THAT(ParseEntry(R"({"shape":[1],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("missing \"dtype\"")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("missing \"shape\"")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1]})", 4),
              StatusIs(kInvalid, HasSubstr("missing \"data_offsets\"")));
  EXPECT_THAT(ParseEntry(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("not a string")));
}

TEST(ParseSafetensorsHeaderTest, RejectsUnknownDtype) {
  EXPECT_THAT(ParseEntry(R"({"dtype":"Q4_K","shape":[1],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, AllOf(HasSubstr("w.safetensors"), HasSubstr("tensor \"t\""),
                                       HasSubstr("unknown dtype \"Q4_K\""))));
  EXPECT_THAT(ParseEntry(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})", 2),
              StatusIs(kInvalid, HasSubstr("unknown dtype")));
}

TEST(ParseSafetensorsHeaderTest, RecordsKnownUnsupportedDtypes) {
  absl::StatusOr<SafetensorsHeader> header =
      Parse(FileWithHeader(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                           R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[24,27]},)"
                           R"("w8":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[16,24]}})",
                           std::string(27, 0)));
  ASSERT_THAT(header, IsOk());
  ASSERT_EQ(header->tensors.size(), 3u);
  for (const SafetensorsTensor& t : header->tensors) {
    EXPECT_FALSE(t.dtype.has_value()) << t.name;
  }
  EXPECT_EQ(header->tensors[0].dtype_name, "I64");
}

TEST(ParseSafetensorsHeaderTest, RejectsBadShapes) {
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("dimension -1 is not a non-negative integer")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1.0],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("not a non-negative integer")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("not a non-negative integer")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":{},"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, HasSubstr("not an array")));
  EXPECT_THAT(
      ParseEntry(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]})", 4),
      StatusIs(kInvalid, HasSubstr("not a non-negative integer")));
  // numel fits in int64 (2^62) but numel * 4 bytes does not fit in 64 bits.
  EXPECT_THAT(
      ParseEntry(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]})", 4),
      StatusIs(kInvalid, HasSubstr("overflows")));
  // numel itself overflows.
  EXPECT_THAT(ParseEntry(R"({"dtype":"U8","shape":[4294967296,4294967296],)"
                         R"("data_offsets":[0,4]})",
                         4),
              StatusIs(kInvalid, HasSubstr("too many elements")));
}

TEST(ParseSafetensorsHeaderTest, RejectsBadOffsets) {
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4),
              StatusIs(kInvalid, HasSubstr("not [begin, end]")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 4),
              StatusIs(kInvalid, HasSubstr("not [begin, end]")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", 4),
              StatusIs(kInvalid, HasSubstr("not [begin, end]")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.0]})", 4),
              StatusIs(kInvalid, HasSubstr("not [begin, end]")));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[0],"data_offsets":[4,0]})", 4),
              StatusIs(kInvalid, HasSubstr("begin after end")));
}

TEST(ParseSafetensorsHeaderTest, RejectsOffsetsThatDisagreeWithShape) {
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})", 4),
              StatusIs(kInvalid, AllOf(HasSubstr("tensor \"t\""), HasSubstr("span 4 bytes"),
                                       HasSubstr("needs 8"))));
}

TEST(ParseSafetensorsHeaderTest, RejectsTruncatedData) {
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 12),
              StatusIs(kInvalid, AllOf(HasSubstr("tensor \"t\""), HasSubstr("truncated"))));
}

TEST(ParseSafetensorsHeaderTest, RejectsMisalignedTensor) {
  EXPECT_THAT(Parse(FileWithHeader(R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                   std::string(6, 0))),
              StatusIs(kInvalid, AllOf(HasSubstr("tensor \"b\""), HasSubstr("misaligned"))));
}

TEST(ParseSafetensorsHeaderTest, RejectsOverlappingTensors) {
  EXPECT_THAT(
      Parse(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           std::string(12, 0))),
      StatusIs(kInvalid, AllOf(HasSubstr("tensor \"b\""), HasSubstr("overlaps tensor \"a\""))));
  // An empty tensor inside another tensor's range overlaps it too.
  EXPECT_THAT(Parse(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                                   std::string(8, 0))),
              StatusIs(kInvalid, HasSubstr("overlaps")));
}

TEST(ParseSafetensorsHeaderTest, RejectsHolesAndTrailingBytes) {
  EXPECT_THAT(
      Parse(FileWithHeader(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                           std::string(12, 0))),
      StatusIs(kInvalid, AllOf(HasSubstr("bytes [4, 8)"), HasSubstr("hole before tensor \"b\""))));
  EXPECT_THAT(ParseEntry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 8),
              StatusIs(kInvalid, HasSubstr("bytes [4, 8) at the end")));
}

TEST(ParseSafetensorsHeaderTest, ValidatesMetadata) {
  EXPECT_THAT(Parse(FileWithHeader(R"({"__metadata__":{"format":"pt","n":3}})", "")),
              StatusIs(kInvalid, HasSubstr("\"n\" is not a string")));
  EXPECT_THAT(Parse(FileWithHeader(R"({"__metadata__":[]})", "")),
              StatusIs(kInvalid, HasSubstr("\"__metadata__\" is not an object")));
}

TEST(SafetensorsFileTest, MapsWriterOutputAndReadsBytes) {
  SafetensorsWriter writer;
  writer.Add("w", numeric::DType::kF32, {3}, Bytes({1.5f, -2.0f, 3.25f}));
  writer.AddFloats("h", numeric::DType::kF16, {2}, {0.5f, -1.0f});
  const std::string path = absl::StrCat(::testing::TempDir(), "/mapped.safetensors");
  ASSERT_THAT(writer.Write(path), IsOk());

  absl::StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(path);
  ASSERT_THAT(opened, IsOk());
  SafetensorsFile file = *std::move(opened);  // Moving keeps the mapping valid.
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.Find("nope"), nullptr);
  absl::StatusOr<absl::Span<const uint8_t>> w = file.TensorBytes("w");
  ASSERT_THAT(w, IsOk());
  ASSERT_EQ(w->size(), 12u);
  float values[3];
  std::memcpy(values, w->data(), 12);
  EXPECT_THAT(values, ElementsAre(1.5f, -2.0f, 3.25f));
  absl::StatusOr<absl::Span<const uint8_t>> h = file.TensorBytes("h");
  ASSERT_THAT(h, IsOk());
  uint16_t halves[2];
  std::memcpy(halves, h->data(), 4);
  EXPECT_EQ(numeric::HalfToFloat(halves[0]), 0.5f);
  EXPECT_EQ(numeric::HalfToFloat(halves[1]), -1.0f);
  EXPECT_THAT(file.TensorBytes("nope"),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr(path), HasSubstr("nope"))));

  SafetensorsFile other = std::move(file);
  EXPECT_EQ(other.Find("w")->numel, 3);
}

TEST(SafetensorsFileTest, ReadingUnsupportedDtypeIsFailedPrecondition) {
  const std::string path =
      WriteTemp("ids.safetensors",
                FileWithHeader(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                               std::string(8, 0)));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT(file->TensorBytes("ids"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path), HasSubstr("\"ids\""), HasSubstr("I64"))));
}

TEST(SafetensorsFileTest, OpenErrorsNameThePath) {
  const std::string missing = absl::StrCat(::testing::TempDir(), "/missing.safetensors");
  EXPECT_THAT(SafetensorsFile::Open(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  const std::string dir = absl::StrCat(::testing::TempDir(), "/a_directory.safetensors");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  EXPECT_THAT(SafetensorsFile::Open(dir), StatusIs(kInvalid, HasSubstr("not a regular file")));
  const std::string tiny = WriteTemp("tiny.safetensors", "abc");
  EXPECT_THAT(SafetensorsFile::Open(tiny), StatusIs(kInvalid, HasSubstr(tiny)));
  const std::string lying =
      WriteTemp("lying.safetensors",
                FileWithHeader(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})",
                               std::string(8, 0)));
  EXPECT_THAT(SafetensorsFile::Open(lying),
              StatusIs(kInvalid, AllOf(HasSubstr(lying), HasSubstr("tensor \"w\""))));
}

}  // namespace
}  // namespace trident::model
