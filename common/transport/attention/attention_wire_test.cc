#include "common/transport/attention/attention_wire.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport::attention {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

RequestHeader Header(int32_t sequences, WireDType dtype = WireDType::kBF16) {
  return RequestHeader{.dtype = dtype,
                       .request_id = 9,
                       .owner_incarnation = 5,
                       .layer = 3,
                       .num_sequences = sequences,
                       .num_q_heads = 8,
                       .num_kv_heads = 2,
                       .head_dim = 16};
}

TEST(AttentionWireTest, RequestDataIsTheTableThenTheRows) {
  const RequestHeader h = Header(3);
  EXPECT_EQ(QkvRowElements(h), (8 + 4) * 16);
  EXPECT_EQ(RequestDataBytes(h), 3 * (16 + (8 + 4) * 16 * 2));
  std::vector<uint64_t> data((RequestDataBytes(h) + 7) / 8);
  auto* entries = reinterpret_cast<SequenceEntry*>(data.data());
  entries[2] = SequenceEntry{.handle = 77, .position = 12};
  absl::StatusOr<RequestView> view =
      DecodeRequest(EncodeRequestHeader(h),
                    absl::string_view(reinterpret_cast<char*>(data.data()), RequestDataBytes(h)));
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_EQ(view->header.layer, 3);
  ASSERT_EQ(view->sequences.size(), 3u);
  EXPECT_EQ(view->sequences[2].handle, 77u);
  EXPECT_EQ(view->sequences[2].position, 12);
  EXPECT_EQ(view->rows, reinterpret_cast<char*>(data.data()) + 3 * sizeof(SequenceEntry));
}

TEST(AttentionWireTest, RejectsInconsistentRequests) {
  std::vector<uint64_t> data(4096);
  const auto bytes = [&](size_t n) {
    return absl::string_view(reinterpret_cast<char*>(data.data()), n);
  };
  RequestHeader h = Header(2);
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(RequestDataBytes(h) - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("its header implies")));
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h).substr(1), bytes(RequestDataBytes(h))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header is 55 bytes")));
  h.num_q_heads = 7;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple")));
  h = Header(0);
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_sequences is 0")));
  h = Header(1);
  h.magic = 1;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(RequestDataBytes(h))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an attention request")));
  h = Header(1);
  h.dtype = static_cast<WireDType>(2);
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(64)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wire dtype 2")));
  h = Header(kMaxSequencesPerRequest + 1);
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_sequences")));
}

TEST(AttentionWireTest, OnlyAppendOnlyPromptWritesCarryAWriteKey) {
  std::vector<uint64_t> data(4096);
  const auto bytes = [&](const RequestHeader& h) {
    return absl::string_view(reinterpret_cast<char*>(data.data()), RequestDataBytes(h));
  };
  RequestHeader h = Header(2);
  h.flags = kAppendOnly | kPromptWrite;
  h.write_key = 0xfeedULL << 32;
  absl::StatusOr<RequestView> view = DecodeRequest(EncodeRequestHeader(h), bytes(h));
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_EQ(view->header.write_key, 0xfeedULL << 32);
  h.write_key = 0;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(h)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carry a write key")));
  h.flags = kPromptWrite;
  h.write_key = 3;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(h)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be append-only")));
  h.flags = kAppendOnly;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(h)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only a prompt write")));
  h.flags = 8;
  h.write_key = 0;
  EXPECT_THAT(DecodeRequest(EncodeRequestHeader(h), bytes(h)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown request flags 8")));
}

TEST(AttentionWireTest, RepliesCarryTheirErrorOrTheirRows) {
  ReplyHeader ok{.dtype = WireDType::kF32,
                 .request_id = 4,
                 .num_sequences = 2,
                 .num_q_heads = 8,
                 .head_dim = 16};
  absl::StatusOr<ReplyView> view = DecodeReply(EncodeReplyHeader(ok, ""), 2 * 8 * 16 * 4);
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_EQ(view->header.request_id, 4u);
  EXPECT_THAT(DecodeReply(EncodeReplyHeader(ok, ""), 5),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ReplyHeader error{.request_id = 4, .status_code = 5};
  view = DecodeReply(EncodeReplyHeader(error, std::string(1000, 'x')), 0);
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_EQ(view->error.size(), kMaxErrorBytes);
}

TEST(AttentionWireTest, Bf16RoundTripRoundsToNearestEven) {
  const std::vector<float> values = {1.0f, -2.5f, 3.14159f, 1e-3f};
  std::vector<char> wire(values.size() * 2);
  ToWire(WireDType::kBF16, values.data(), wire.data(), values.size());
  std::vector<float> back(values.size());
  FromWire(WireDType::kBF16, wire.data(), back.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(back[i], values[i], std::abs(values[i]) / 128) << i;
  }
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
}

TEST(AttentionWireTest, BlockRequestsCarryTheirTicketAndBlocks) {
  const RequestHeader put = BlockRequestHeader(true, 42, 3, 2, 7, 1);
  alignas(8) char data[64] = {};
  absl::StatusOr<RequestView> view =
      DecodeRequest(EncodeRequestHeader(put), absl::string_view(data, sizeof(data)));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.write_key, 42u);
  EXPECT_EQ(view->header.layer, 3);
  EXPECT_EQ(view->block_bytes, sizeof(data));
  EXPECT_FALSE(DecodeRequest(EncodeRequestHeader(put), absl::string_view()).ok());
  const RequestHeader get = BlockRequestHeader(false, 42, 0, 2, 7, 1);
  EXPECT_TRUE(DecodeRequest(EncodeRequestHeader(get), absl::string_view()).ok());
  EXPECT_FALSE(DecodeRequest(EncodeRequestHeader(get), absl::string_view(data, 8)).ok());
  RequestHeader no_ticket = get;
  no_ticket.write_key = 0;
  EXPECT_FALSE(DecodeRequest(EncodeRequestHeader(no_ticket), absl::string_view()).ok());
  RequestHeader no_blocks = get;
  no_blocks.num_sequences = 0;
  EXPECT_FALSE(DecodeRequest(EncodeRequestHeader(no_blocks), absl::string_view()).ok());
}

}  // namespace
}  // namespace trident::transport::attention
