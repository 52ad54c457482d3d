#include "bench/loadgen/runner.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc/status.h"
#include "common/status/status_macros.h"
#include "common/time/clock.h"
#include "common/time/proto_time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::loadgen {
namespace {

FinishReason FromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_ABORT:
      return FinishReason::kAbort;
    case v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

// One Generate call. Owned by gRPC from Start() until OnDone(), where it
// deletes itself. Its record reaches the book only from the destructor of
// `finish_`, after every other member (the ClientContext above all) is gone:
// once the book is idle, no call holds gRPC objects any more, so the run's
// channels are released last, on RunLoad's thread, and never by a callback
// thread (where releasing the last one starts gRPC's shutdown concurrently
// with callbacks still unwinding).
class GenerateCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(std::shared_ptr<RecordBook> book, RequestRecord record, v1::GenerateRequest request,
               absl::Duration timeout)
      : finish_{.book = std::move(book)},
        recorder_(Clock::Real(), std::move(record)),
        request_(std::move(request)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  // `stub` is used only during this call.
  void Start(v1::Generation::Stub& stub) {
    stub.async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    recorder_.Sent();
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended; OnDone follows.
    if (response_.has_chunk()) {
      recorder_.Chunk(response_.chunk().token_ids_size());
    } else if (response_.has_complete()) {
      const v1::GenerateComplete& c = response_.complete();
      recorder_.Complete(FromProto(c.finish_reason()), c.usage().completion_tokens());
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    finish_.record = recorder_.Done(FromGrpcStatus(status));
    delete this;
  }

 private:
  struct FinishOnDestroy {
    ~FinishOnDestroy() { book->Finish(std::move(record)); }
    std::shared_ptr<RecordBook> book;
    RequestRecord record;
  };

  FinishOnDestroy finish_;  // First member: destroyed last.
  RequestRecorder recorder_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
};

// Checks the schedule against the served model before anything is sent.
absl::Status CheckScheduleFitsModel(const std::vector<PlannedRequest>& schedule,
                                    const v1::ModelInfoResponse& info) {
  std::set<std::string> classes;
  for (const v1::QosClass& c : info.qos_classes()) classes.insert(c.name());
  for (const PlannedRequest& r : schedule) {
    if (static_cast<int64_t>(r.prompt_tokens) + r.output_tokens > info.max_context_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", r.index, ": prompt_tokens ", r.prompt_tokens, " + output_tokens ",
          r.output_tokens, " exceed the model's max_context_tokens ", info.max_context_tokens(),
          "; lower --prompt_tokens or --output_tokens"));
    }
    if (!r.qos_class.empty() && !classes.empty() && classes.count(r.qos_class) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qos: the server does not list class \"", r.qos_class, "\" in ModelInfo"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest(const PlannedRequest& planned,
                                                         const PromptVocabulary& vocab,
                                                         const std::string& model) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           MakePromptTokenIds(planned.prompt_seed, planned.prompt_tokens, vocab));
  v1::GenerateRequest request;
  request.set_model(model);
  request.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  request.mutable_sampling()->set_max_tokens(planned.output_tokens);
  request.mutable_sampling()->set_seed(planned.prompt_seed);
  request.mutable_stop()->set_ignore_eos(true);
  request.set_qos_class(planned.qos_class);
  if (planned.slo.ttft.has_value())
    SetProtoDuration(*planned.slo.ttft, request.mutable_slo()->mutable_ttft());
  if (planned.slo.tpot.has_value())
    SetProtoDuration(*planned.slo.tpot, request.mutable_slo()->mutable_tpot());
  return request;
}

namespace {

// The served model's limits, waiting up to the connect timeout for the
// target to come up.
absl::StatusOr<v1::ModelInfoResponse> FetchModelInfo(const RunOptions& options,
                                                     v1::Generation::Stub& stub) {
  v1::ModelInfoResponse info;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.connect_timeout));
  context.set_wait_for_ready(true);
  v1::ModelInfoRequest request;
  request.set_model(options.model);
  const absl::Status status = FromGrpcStatus(stub.ModelInfo(&context, request, &info));
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("ModelInfo from ", options.target, ": ", status.message()));
  }
  return info;
}

}  // namespace

absl::StatusOr<RunResult> RunLoad(const RunOptions& options) {
  if (options.max_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_inflight: must be at least 1, got ", options.max_in_flight));
  }
  if (options.num_channels < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_channels: must be at least 1, got ", options.num_channels));
  }
  TRIDENT_ASSIGN_OR_RETURN(std::vector<PlannedRequest> schedule,
                           GenerateSchedule(options.workload));

  // Separate connections: a local subchannel pool per channel.
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs;
  for (int32_t i = 0; i < options.num_channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(v1::Generation::NewStub(
        grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args)));
  }

  TRIDENT_ASSIGN_OR_RETURN(const v1::ModelInfoResponse info, FetchModelInfo(options, *stubs[0]));
  TRIDENT_RETURN_IF_ERROR(CheckScheduleFitsModel(schedule, info));
  PromptVocabulary vocab{.vocab_size = info.vocab_size()};
  vocab.excluded_ids.assign(info.eos_token_ids().begin(), info.eos_token_ids().end());
  if (info.has_bos_token_id()) vocab.excluded_ids.push_back(info.bos_token_id());
  TRIDENT_RETURN_IF_ERROR(MakePromptTokenIds(0, 1, vocab).status());

  nlohmann::json config = WorkloadToJson(options.workload);
  config["target"] = options.target;
  config["max_inflight"] = options.max_in_flight;
  config["request_timeout_s"] = absl::ToDoubleSeconds(options.request_timeout);
  config["num_channels"] = options.num_channels;
  config["model"] = {{"name", info.model()},
                     {"vocab_size", info.vocab_size()},
                     {"max_context_tokens", info.max_context_tokens()}};

  auto book = std::make_shared<RecordBook>(options.max_in_flight);
  Clock* const clock = Clock::Real();
  std::vector<absl::Duration> offsets;
  offsets.reserve(schedule.size());
  for (const PlannedRequest& r : schedule) offsets.push_back(r.send_offset);
  const absl::Time start = clock->Now();
  OpenLoopPacer pacer(std::move(offsets), start);

  absl::Mutex progress_mu;
  bool progress_stop = false;
  std::thread progress_thread;
  if (options.print_progress) {
    progress_thread = std::thread([&] {
      absl::MutexLock lock(&progress_mu);
      while (!progress_mu.AwaitWithTimeout(absl::Condition(&progress_stop), absl::Seconds(1))) {
        std::fprintf(stderr, "%s\n",
                     FormatProgress(clock->Now() - start, book->progress()).c_str());
      }
    });
  }

  size_t next_stub = 0;
  absl::Status build_error;
  while (!pacer.done() && build_error.ok()) {
    const absl::Time now = clock->Now();
    if (now < pacer.next_send_time()) {
      // Pacing only: the next send time is known; nothing else is awaited.
      absl::SleepFor(pacer.next_send_time() - now);
      continue;
    }
    for (size_t i : pacer.TakeDue(now)) {
      RequestRecord record;
      record.planned = schedule[i];
      record.scheduled = start + schedule[i].send_offset;
      absl::StatusOr<v1::GenerateRequest> request =
          BuildGenerateRequest(schedule[i], vocab, options.model);
      if (!request.ok()) {
        build_error = request.status();
        break;
      }
      if (!book->TryAdmit(record)) continue;
      auto* call =
          new GenerateCall(book, std::move(record), *std::move(request), options.request_timeout);
      call->Start(*stubs[next_stub]);
      next_stub = (next_stub + 1) % stubs.size();
    }
  }
  // Every call ends by its deadline; the margin covers gRPC's own delivery.
  const bool idle = book->AwaitIdle(clock->Now() + options.request_timeout + absl::Seconds(30));
  if (progress_thread.joinable()) {
    {
      absl::MutexLock lock(&progress_mu);
      progress_stop = true;
    }
    progress_thread.join();
    std::fprintf(stderr, "%s\n", FormatProgress(clock->Now() - start, book->progress()).c_str());
  }
  TRIDENT_RETURN_IF_ERROR(build_error);
  if (!idle) {
    // Calls still hold the channels; leak them rather than pull them away.
    for (auto& stub : stubs) stub.release();
    return absl::DeadlineExceededError(
        absl::StrCat(book->progress().in_flight, " calls still in flight past their deadline"));
  }

  RunResult result;
  result.start = start;
  result.records = book->TakeRecords();
  result.report = Summarize(result.records, start, options.workload.warmup);
  result.json = ReportToJson(result.report, config);
  return result;
}

}  // namespace trident::loadgen
