#include "services/router/admission/worker_load_proto.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/time/proto_time.h"
#include "services/router/admission/cost_models.h"

namespace trident::router::admission {
namespace {

absl::Status FieldError(absl::string_view message, absl::string_view field,
                        absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(message, ".", field, ": ", what));
}

}  // namespace

absl::StatusOr<WorkerLoadReport> WorkerLoadReportFromProto(const trident::v1::WorkerLoad& load) {
  constexpr absl::string_view kMsg = "WorkerLoad";
  WorkerLoadReport report;
  if (load.worker_id().empty()) return FieldError(kMsg, "worker_id", "must not be empty");
  report.worker_id = load.worker_id();
  report.incarnation = load.incarnation();
  switch (load.role()) {
    case trident::v1::ROLE_PREFILL:
      report.role = WorkerRole::kPrefill;
      break;
    case trident::v1::ROLE_DECODE:
      report.role = WorkerRole::kDecode;
      break;
    case trident::v1::ROLE_BOTH:
      report.role = WorkerRole::kBoth;
      break;
    default:
      return FieldError(kMsg, "role", absl::StrCat("unspecified or unknown (", load.role(), ")"));
  }
  report.accepting = load.state() == trident::v1::SERVING_STATE_SERVING;
  struct Count {
    absl::string_view name;
    int64_t value;
  };
  for (const Count& count : {Count{"running_sequences", load.running_sequences()},
                             Count{"waiting_sequences", load.waiting_sequences()},
                             Count{"queued_prefill_tokens", load.queued_prefill_tokens()},
                             Count{"batch_context_tokens", load.batch_context_tokens()},
                             Count{"kv_blocks_free", load.kv_blocks_free()},
                             Count{"kv_blocks_total", load.kv_blocks_total()}}) {
    if (count.value < 0) {
      return FieldError(kMsg, count.name, absl::StrCat("must not be negative, got ", count.value));
    }
  }
  if (load.kv_blocks_free() > load.kv_blocks_total()) {
    return FieldError(
        kMsg, "kv_blocks_free",
        absl::StrCat(load.kv_blocks_free(), " exceeds kv_blocks_total ", load.kv_blocks_total()));
  }
  if (!std::isfinite(load.prefill_tokens_per_second()) || load.prefill_tokens_per_second() < 0) {
    return FieldError(kMsg, "prefill_tokens_per_second", "must be finite and not negative");
  }
  const absl::Duration step = DurationFromProto(load.decode_step_time());
  if (step < absl::ZeroDuration()) {
    return FieldError(kMsg, "decode_step_time", "must not be negative");
  }
  report.running_sequences = load.running_sequences();
  report.waiting_sequences = load.waiting_sequences();
  report.queued_prefill_tokens = load.queued_prefill_tokens();
  report.batch_context_tokens = load.batch_context_tokens();
  report.kv_blocks_free = load.kv_blocks_free();
  report.kv_blocks_total = load.kv_blocks_total();
  report.prefill_tokens_per_second = load.prefill_tokens_per_second();
  report.decode_step_time = step;
  report.colocated_only = load.colocated_only();
  return report;
}

absl::StatusOr<int64_t> KvBytesPerTokenFromLayout(const trident::v1::KvLayout& layout) {
  constexpr absl::string_view kMsg = "KvLayout";
  if (layout.num_layers() <= 0) return FieldError(kMsg, "num_layers", "must be positive");
  if (layout.num_kv_heads() <= 0) return FieldError(kMsg, "num_kv_heads", "must be positive");
  if (layout.head_dim() <= 0) return FieldError(kMsg, "head_dim", "must be positive");
  int32_t bytes = 0;
  switch (layout.dtype()) {
    case trident::v1::DTYPE_FLOAT32:
      bytes = 4;
      break;
    case trident::v1::DTYPE_FLOAT16:
    case trident::v1::DTYPE_BFLOAT16:
      bytes = 2;
      break;
    case trident::v1::DTYPE_FLOAT8_E4M3:
      // A byte per element, and an f32 scale per token, kv head and K or V.
      return KvBytesPerToken(layout.num_layers(), layout.num_kv_heads(), layout.head_dim(), 1) +
             int64_t{8} * layout.num_layers() * layout.num_kv_heads();
    default:
      return FieldError(kMsg, "dtype", "unspecified or unknown");
  }
  return KvBytesPerToken(layout.num_layers(), layout.num_kv_heads(), layout.head_dim(), bytes);
}

}  // namespace trident::router::admission
