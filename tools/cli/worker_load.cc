#include "tools/cli/worker_load.h"

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::cli {
namespace {

// "ROLE_PREFILL" -> "prefill": the enum value's name without its prefix.
std::string ShortName(const std::string& name, absl::string_view prefix) {
  absl::string_view rest = name;
  if (absl::StartsWith(rest, prefix)) rest.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(rest);
}

}  // namespace

WorkerLoadSummary SummarizeWorkerLoad(const trident::v1::WorkerLoad& load) {
  WorkerLoadSummary summary;
  summary.worker_id = load.worker_id();
  summary.role = ShortName(trident::v1::Role_Name(load.role()), "ROLE_");
  if (load.pending_role() != trident::v1::ROLE_UNSPECIFIED) {
    summary.pending_role = ShortName(trident::v1::Role_Name(load.pending_role()), "ROLE_");
  }
  summary.state = ShortName(trident::v1::ServingState_Name(load.state()), "SERVING_STATE_");
  summary.running_sequences = load.running_sequences();
  summary.waiting_sequences = load.waiting_sequences();
  summary.cpu_attention_sequences = load.cpu_attention_sequences();
  if (load.kv_blocks_total() > 0) {
    summary.kv_cache_usage_ratio =
        static_cast<double>(load.kv_blocks_used()) / static_cast<double>(load.kv_blocks_total());
  }
  return summary;
}

absl::StatusOr<WorkerLoadSummary> ReadWorkerLoad(const std::string& address,
                                                 absl::Duration timeout) {
  std::unique_ptr<trident::v1::WorkerControl::Stub> stub =
      trident::v1::WorkerControl::NewStub(CreateClusterChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::unique_ptr<grpc::ClientReader<trident::v1::WorkerLoad>> reader =
      stub->GetLoad(&context, trident::v1::GetLoadRequest());
  trident::v1::WorkerLoad load;
  if (reader->Read(&load)) {
    // One sample is all `trident status` shows; end the stream here.
    context.TryCancel();
    (void)reader->Finish();
    return SummarizeWorkerLoad(load);
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return absl::UnavailableError(absl::StrCat("the load stream of ", address, " ended empty"));
}

absl::StatusOr<trident::v1::KvStats> ReadWorkerKvStats(const std::string& address,
                                                       absl::Duration timeout) {
  std::unique_ptr<trident::v1::WorkerControl::Stub> stub =
      trident::v1::WorkerControl::NewStub(CreateClusterChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  trident::v1::KvStats stats;
  const grpc::Status status = stub->GetKvStats(&context, trident::v1::GetKvStatsRequest(), &stats);
  if (!status.ok()) return FromGrpcStatus(status);
  return stats;
}

}  // namespace trident::cli
