#include "common/grpc/wire_check.h"

#include <string>

#include "common/grpc/test_service.pb.h"
#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::WireInner;
using testing::WireOuter;

WireOuter Valid() {
  WireOuter m;
  m.set_text("héllo");
  m.add_items()->set_name("a");
  WireInner* b = m.add_items();
  b->set_name("b");
  b->add_ids(1);
  b->add_ids(300);
  b->mutable_child()->set_name("c");
  (*m.mutable_counts())["k"] = 7;
  m.set_f32(5);
  m.set_d(2.5);
  m.set_raw(std::string("\xff\x00", 2));
  m.mutable_one()->set_name("one");
  return m;
}

// The field a failed check names.
std::string FieldOf(const absl::Status& status) {
  return GetBadRequestField(status).value_or("<none>");
}

// A length-delimited field: tag, length, bytes.
std::string Delimited(int number, const std::string& bytes) {
  std::string out;
  out.push_back(static_cast<char>((number << 3) | 2));
  out.push_back(static_cast<char>(bytes.size()));
  return out + bytes;
}

TEST(WireCheckTest, AWellFormedMessageParsesAsProtobufDoes) {
  const std::string bytes = Valid().SerializeAsString();
  WireOuter parsed;
  ASSERT_THAT(ParseRequest(bytes, &parsed), IsOk());
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  WireOuter from_buffer;
  ASSERT_THAT(ParseRequest(buffer, &from_buffer), IsOk());
  EXPECT_EQ(from_buffer.SerializeAsString(), bytes);
}

TEST(WireCheckTest, InvalidUtf8IsNamedByItsFieldPath) {
  WireOuter m = Valid();
  m.mutable_items(1)->mutable_child()->set_name("ok");
  std::string bytes = m.SerializeAsString();
  // Replace "ok" with an invalid lead byte sequence in place.
  const size_t at = bytes.find("ok");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '\xc0';
  bytes[at + 1] = '\xaf';  // An overlong '/'.
  WireOuter parsed;
  absl::Status s = ParseRequest(bytes, &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(s), "items[1].child.name");
  EXPECT_THAT(s.message(), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(s.message(), HasSubstr("trident.testing.WireOuter"));

  for (const std::string& bad : {std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
                                 std::string("ab\xe2\x82"), std::string("\x80")}) {
    absl::Status t = ParseRequest(Delimited(1, bad), &parsed);
    EXPECT_EQ(FieldOf(t), "text") << ::testing::PrintToString(bad);
  }
  // Bytes fields take any bytes; a map's string key is checked.
  EXPECT_THAT(ParseRequest(Delimited(6, "\xff\xfe"), &parsed), IsOk());
  const std::string entry = Delimited(1, "\xff") + std::string("\x10\x01", 2);
  EXPECT_EQ(FieldOf(ParseRequest(Delimited(3, entry), &parsed)), "counts[0].key");
}

TEST(WireCheckTest, ATruncatedMessageNamesTheFieldItEndsIn) {
  const std::string bytes = Valid().SerializeAsString();
  WireOuter parsed;
  int rejected = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::Status s = ParseRequest(bytes.substr(0, n), &parsed);
    if (s.ok()) continue;  // Cut between fields: a shorter valid message.
    ++rejected;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(FieldOf(s), "<none>") << n;
  }
  EXPECT_GT(rejected, 10);
  // Cut inside the last field (`one`'s name): named there.
  absl::Status s = ParseRequest(bytes.substr(0, bytes.size() - 1), &parsed);
  EXPECT_THAT(FieldOf(s), HasSubstr("one"));
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST(WireCheckTest, MalformedWireIsRefusedWithItsProblem) {
  WireOuter parsed;
  // `text` (a string) sent as a varint.
  absl::Status s = ParseRequest(std::string("\x08\x01", 2), &parsed);
  EXPECT_EQ(FieldOf(s), "text");
  EXPECT_THAT(s.message(), HasSubstr("sent as varint"));
  // A group.
  EXPECT_THAT(ParseRequest(std::string("\x0b\x0c", 2), &parsed).message(), HasSubstr("group"));
  // Field number 0.
  EXPECT_THAT(ParseRequest(std::string("\x02\x00", 2), &parsed).message(), HasSubstr("zero tag"));
  // A varint of 11 bytes.
  EXPECT_THAT(ParseRequest(std::string("\x20") + std::string(11, '\xff'), &parsed).message(),
              HasSubstr("varint"));
  // A tag or a length in more bytes than protobuf's parser reads (6, padded
  // with continuation bytes): refused, as protobuf refuses them.
  const std::string long_tag = std::string("\x8a\x80\x80\x80\x80\x00\x01x", 8);
  EXPECT_THAT(ParseRequest(long_tag, &parsed).message(), HasSubstr("malformed or zero tag"));
  EXPECT_FALSE(WireOuter().ParseFromString(long_tag));
  const std::string long_length = std::string("\x0a\x81\x80\x80\x80\x80\x00x", 8);
  EXPECT_EQ(FieldOf(ParseRequest(long_length, &parsed)), "text");
  EXPECT_FALSE(WireOuter().ParseFromString(long_length));
  // A length whose 5th byte carries bits beyond 32.
  const std::string wide_length = std::string("\x0a\x81\x80\x80\x80\x10x", 7);
  EXPECT_THAT(ParseRequest(wide_length, &parsed).message(), HasSubstr("malformed length"));
  EXPECT_FALSE(WireOuter().ParseFromString(wide_length));
  // A packed run ending inside a varint.
  const std::string inner = std::string("\x12\x02\x01\x80", 4);
  absl::Status p = ParseRequest(Delimited(7, inner), &parsed);
  EXPECT_EQ(FieldOf(p), "one.ids[1]");
  // Unknown fields of every wire type are skipped (newer clients).
  std::string unknown = std::string("\xa0\x06\x05", 3) + std::string("\xa9\x06", 2) +
                        std::string(8, '\x01') + std::string("\xa5\x06", 2) +
                        std::string(4, '\x02') + std::string("\xaa\x06\x01x", 4);
  EXPECT_THAT(ParseRequest(unknown, &parsed), IsOk());
}

TEST(WireCheckTest, NestingDeeperThanProtobufAllowsIsRefused) {
  auto nested = [](int depth) {
    WireOuter m;
    WireInner* at = m.mutable_one();
    for (int i = 0; i < depth; ++i) at = at->mutable_child();
    at->set_name("deep");
    return m.SerializeAsString();
  };
  WireOuter parsed;
  EXPECT_THAT(ParseRequest(nested(50), &parsed), IsOk());
  // Whatever depth the check lets through, protobuf parses.
  for (int depth = kMaxMessageNesting - 5; depth <= kMaxMessageNesting + 2; ++depth) {
    if (ParseRequest(nested(depth), &parsed).ok()) {
      EXPECT_TRUE(WireOuter().ParseFromString(nested(depth))) << depth;
    }
  }
  absl::Status s = ParseRequest(nested(kMaxMessageNesting + 5), &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("deeper than"));
}

}  // namespace
}  // namespace trident
