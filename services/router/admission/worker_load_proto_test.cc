#include "services/router/admission/worker_load_proto.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/trident/v1/cluster.pb.h"

namespace trident::router::admission {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

trident::v1::WorkerLoad ValidLoad() {
  trident::v1::WorkerLoad load;
  load.set_worker_id("decode-0");
  load.set_incarnation(7);
  load.set_role(trident::v1::ROLE_DECODE);
  load.set_state(trident::v1::SERVING_STATE_SERVING);
  load.set_running_sequences(12);
  load.set_waiting_sequences(1);
  load.set_queued_prefill_tokens(0);
  load.set_batch_context_tokens(12000);
  load.set_kv_blocks_free(100);
  load.set_kv_blocks_used(900);
  load.set_kv_blocks_total(1000);
  load.mutable_decode_step_time()->set_nanos(25'000'000);
  return load;
}

TEST(WorkerLoadProtoTest, ConvertsEveryField) {
  absl::StatusOr<WorkerLoadReport> report = WorkerLoadReportFromProto(ValidLoad());
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->worker_id, "decode-0");
  EXPECT_EQ(report->incarnation, 7u);
  EXPECT_EQ(report->role, WorkerRole::kDecode);
  EXPECT_TRUE(report->accepting);
  EXPECT_EQ(report->running_sequences, 12);
  EXPECT_EQ(report->waiting_sequences, 1);
  EXPECT_EQ(report->batch_context_tokens, 12000);
  EXPECT_EQ(report->kv_blocks_free, 100);
  EXPECT_EQ(report->kv_blocks_total, 1000);
  EXPECT_EQ(report->decode_step_time, absl::Milliseconds(25));
  EXPECT_FALSE(report->colocated_only);
  trident::v1::WorkerLoad colocated = ValidLoad();
  colocated.set_colocated_only(true);
  EXPECT_TRUE(WorkerLoadReportFromProto(colocated)->colocated_only);
}

TEST(WorkerLoadProtoTest, DrainingWorkerIsNotAccepting) {
  trident::v1::WorkerLoad load = ValidLoad();
  load.set_state(trident::v1::SERVING_STATE_DRAINING);
  absl::StatusOr<WorkerLoadReport> report = WorkerLoadReportFromProto(load);
  ASSERT_THAT(report, IsOk());
  EXPECT_FALSE(report->accepting);
}

TEST(WorkerLoadProtoTest, RejectsBadFieldsNamingThem) {
  trident::v1::WorkerLoad load = ValidLoad();
  load.clear_worker_id();
  EXPECT_THAT(WorkerLoadReportFromProto(load),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WorkerLoad.worker_id")));
  load = ValidLoad();
  load.set_role(trident::v1::ROLE_UNSPECIFIED);
  EXPECT_THAT(WorkerLoadReportFromProto(load),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WorkerLoad.role")));
  load = ValidLoad();
  load.set_running_sequences(-1);
  EXPECT_THAT(WorkerLoadReportFromProto(load), StatusIs(absl::StatusCode::kInvalidArgument,
                                                        HasSubstr("WorkerLoad.running_sequences")));
  load = ValidLoad();
  load.set_kv_blocks_free(1001);
  EXPECT_THAT(WorkerLoadReportFromProto(load),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WorkerLoad.kv_blocks_free")));
  load = ValidLoad();
  load.set_prefill_tokens_per_second(-5);
  EXPECT_THAT(WorkerLoadReportFromProto(load),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("WorkerLoad.prefill_tokens_per_second")));
  load = ValidLoad();
  load.mutable_decode_step_time()->set_seconds(-1);
  load.mutable_decode_step_time()->set_nanos(0);
  EXPECT_THAT(WorkerLoadReportFromProto(load), StatusIs(absl::StatusCode::kInvalidArgument,
                                                        HasSubstr("WorkerLoad.decode_step_time")));
}

TEST(WorkerLoadProtoTest, KvBytesPerTokenFromLayout) {
  trident::v1::KvLayout layout;
  layout.set_num_layers(32);
  layout.set_num_kv_heads(8);
  layout.set_head_dim(128);
  layout.set_dtype(trident::v1::DTYPE_BFLOAT16);
  EXPECT_THAT(KvBytesPerTokenFromLayout(layout), ::trident::testing::IsOkAndHolds(131072));
  layout.set_dtype(trident::v1::DTYPE_FLOAT8_E4M3);  // Bytes, plus 8 of scales per head.
  EXPECT_THAT(KvBytesPerTokenFromLayout(layout),
              ::trident::testing::IsOkAndHolds(65536 + 8 * 32 * 8));
  layout.set_dtype(trident::v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(KvBytesPerTokenFromLayout(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KvLayout.dtype")));
  layout.set_dtype(trident::v1::DTYPE_FLOAT32);
  layout.set_head_dim(0);
  EXPECT_THAT(KvBytesPerTokenFromLayout(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KvLayout.head_dim")));
}

}  // namespace
}  // namespace trident::router::admission
