#include "common/transport/attention/ucx_attention_server.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::transport::attention {

absl::StatusOr<std::unique_ptr<UcxAttentionServer>> UcxAttentionServer::Create(
    UcxLanes* lanes, AttentionComputer* computer, UcxAttentionServerOptions options) {
  auto server = std::unique_ptr<UcxAttentionServer>(
      new UcxAttentionServer(lanes, computer, std::move(options)));
  UcxAttentionServer* raw = server.get();
  server->dispatcher_ = std::thread([raw] { raw->DispatchLoop(); });
  for (UcxWorker* worker : lanes->workers()) {
    TRIDENT_RETURN_IF_ERROR(worker->SetMessageHandler(
        kAttentionRequestMessageId,
        [raw](absl::string_view header, absl::string_view data) { raw->OnRequest(header, data); },
        [raw](absl::string_view header, std::unique_ptr<IncomingMessage> message) {
          raw->OnRendezvous(header, std::move(message));
        }));
  }
  return server;
}

UcxAttentionServer::~UcxAttentionServer() {
  for (UcxWorker* worker : lanes_->workers()) {
    worker
        ->SetMessageHandler(kAttentionRequestMessageId, [](absl::string_view, absl::string_view) {})
        .IgnoreError();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // A fetch ends OK, or UNAVAILABLE when its sender or the worker fails.
    mu_.Await(absl::Condition(
        +[](UcxAttentionServer* s)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->receiving_ == 0; },
        this));
  }
  dispatcher_.join();
}

absl::Status UcxAttentionServer::AddPeer(const trident::v1::TransportEndpoint& client) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Endpoint>> endpoints,
                           lanes_->EndpointsTo(client));
  absl::MutexLock lock(&mu_);
  for (auto it = routes_.begin(); it != routes_.end();) {
    if (it->second.owner_id == client.owner_id() && it->first != client.incarnation()) {
      routes_.erase(it++);
    } else {
      ++it;
    }
  }
  routes_[client.incarnation()] =
      Route{.owner_id = client.owner_id(), .endpoints = std::move(endpoints)};
  return absl::OkStatus();
}

void UcxAttentionServer::RemovePeer(uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  routes_.erase(incarnation);
}

void UcxAttentionServer::ProbePeers(absl::Time now, absl::Duration timeout) {
  std::vector<std::pair<std::shared_ptr<Endpoint>, std::shared_ptr<Probe>>> to_send;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [incarnation, route] : routes_) {
      if (route.endpoints.empty() || route.probe_timed_out) continue;
      if (route.probe != nullptr && !route.probe->answered.load()) {
        if (now - route.probe->sent >= timeout) {
          route.probe_timed_out = true;
          TRIDENT_LOG(WARNING) << "owner " << route.owner_id << " (incarnation " << incarnation
                               << ") has not answered a probe for "
                               << absl::FormatDuration(now - route.probe->sent);
        }
        continue;
      }
      route.probe = std::make_shared<Probe>();
      route.probe->sent = now;
      to_send.emplace_back(route.endpoints.front(), route.probe);
    }
  }
  for (auto& [endpoint, probe] : to_send) {
    endpoint->Handshake([probe](absl::Status status) {
      if (status.ok()) probe->answered.store(true);
    });
  }
}

std::vector<std::pair<std::string, uint64_t>> UcxAttentionServer::TakeFailedPeers() {
  std::vector<std::pair<std::string, uint64_t>> failed;
  absl::MutexLock lock(&mu_);
  for (auto& [incarnation, route] : routes_) {
    if (route.reported_failed) continue;
    if (route.probe_timed_out) {
      route.reported_failed = true;
      failed.emplace_back(route.owner_id, incarnation);
      continue;
    }
    for (const std::shared_ptr<Endpoint>& endpoint : route.endpoints) {
      if (!endpoint->failed()) continue;
      route.reported_failed = true;
      failed.emplace_back(route.owner_id, incarnation);
      break;
    }
  }
  return failed;
}

AttentionServerCounters UcxAttentionServer::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

std::unique_ptr<UcxAttentionServer::Job> UcxAttentionServer::TakeJob() {
  if (spare_.empty()) return std::make_unique<Job>();
  std::unique_ptr<Job> job = std::move(spare_.back());
  spare_.pop_back();
  return job;
}

void UcxAttentionServer::OnRendezvous(absl::string_view header,
                                      std::unique_ptr<IncomingMessage> message) {
  Job* job;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;  // Dropping `message` releases its sender.
    job = TakeJob().release();
    ++receiving_;
  }
  job->header.assign(header.data(), header.size());
  job->data.resize((message->length() + 7) / 8);
  job->data_bytes = message->length();
  IncomingMessage* raw = message.release();
  // `raw` and `job` live until the fetch completes (its callback owns them).
  raw->Receive(job->data.data(), [this, raw, job](absl::Status status) {
    delete raw;
    std::unique_ptr<Job> owned(job);
    absl::MutexLock lock(&mu_);
    --receiving_;
    if (!status.ok()) {
      TRIDENT_LOG(WARNING) << "an attention request was lost in transfer: " << status;
      ++counters_.dropped;
      return;
    }
    owned->arrived = absl::Now();
    owned->is_background = IsBackground(owned->header);
    counters_.bytes_in += static_cast<int64_t>(owned->data_bytes);
    ++counters_.rendezvous;
    if (!stopping_) queue_.push_back(std::move(owned));
  });
}

void UcxAttentionServer::OnRequest(absl::string_view header, absl::string_view data) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  std::unique_ptr<Job> job = TakeJob();
  job->header.assign(header.data(), header.size());
  job->data.resize((data.size() + 7) / 8);
  if (!data.empty()) std::memcpy(job->data.data(), data.data(), data.size());
  job->data_bytes = data.size();
  job->arrived = absl::Now();
  job->is_background = IsBackground(job->header);
  counters_.bytes_in += static_cast<int64_t>(data.size());
  queue_.push_back(std::move(job));
}

bool UcxAttentionServer::IsBackground(absl::string_view header) {
  RequestHeader h;
  if (header.size() != sizeof(h)) return false;
  std::memcpy(&h, header.data(), sizeof(h));
  return h.magic == kRequestMagic && (h.flags & kBlocks) != 0 && (h.flags & kAppendOnly) != 0;
}

std::unique_ptr<UcxAttentionServer::Job> UcxAttentionServer::NextJob() {
  auto pick = queue_.begin() + static_cast<std::ptrdiff_t>(
                                   NextJobIndex(queue_, absl::Now(), kBackgroundMaxDelay));
  std::unique_ptr<Job> job = std::move(*pick);
  queue_.erase(pick);
  return job;
}

void UcxAttentionServer::DispatchLoop() {
  while (true) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](UcxAttentionServer* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stopping_ || !s->queue_.empty(); },
          this));
      if (stopping_) return;
      job = NextJob();
    }
    Serve(*job);
    absl::MutexLock lock(&mu_);
    if (spare_.size() < 16) spare_.push_back(std::move(job));
  }
}

void UcxAttentionServer::Serve(Job& job) {
  absl::string_view data(reinterpret_cast<const char*>(job.data.data()), job.data_bytes);
  absl::StatusOr<RequestView> request = DecodeRequest(job.header, data);
  if (!request.ok()) {
    // Answer it if the header names its requester, so that it need not time
    // out; else it can only be dropped.
    RequestHeader h;
    const bool readable = job.header.size() == sizeof(RequestHeader) &&
                          (std::memcpy(&h, job.header.data(), sizeof(h)), h.magic == kRequestMagic);
    std::shared_ptr<Endpoint> endpoint = readable ? RouteTo(h.owner_incarnation, h.lane) : nullptr;
    TRIDENT_LOG(WARNING) << "bad attention request: " << request.status();
    {
      // Counted before the reply goes out, so that a requester that has its
      // answer also sees it counted.
      absl::MutexLock lock(&mu_);
      ++counters_.bad_messages;
      if (endpoint)
        ++counters_.errors;
      else
        ++counters_.dropped;
    }
    if (endpoint) {
      ReplyHeader reply{.dtype = WireDType::kF32,
                        .request_id = h.request_id,
                        .status_code = static_cast<int32_t>(absl::StatusCode::kInvalidArgument)};
      SendReply(*endpoint, EncodeReplyHeader(reply, request.status().message()), nullptr, 0);
    }
    return;
  }
  const RequestHeader& h = request->header;
  if ((h.flags & kBlocks) != 0) {
    ServeBlocks(*request, job.arrived);
    return;
  }
  const absl::Time started = absl::Now();
  ReplyHeader reply{.dtype = h.dtype,
                    .flags = h.flags,
                    .request_id = h.request_id,
                    .num_sequences = h.num_sequences,
                    .num_q_heads = h.num_q_heads,
                    .head_dim = h.head_dim};
  const size_t reply_bytes = ReplyDataBytes(reply);
  std::shared_ptr<uint64_t[]> rows = reply_buffers_.Take((reply_bytes + 7) / 8);
  absl::Status status = computer_->Compute(*request, reinterpret_cast<char*>(rows.get()));
  const absl::Time computed = absl::Now();
  if (options_.on_request) {
    options_.on_request(AttentionRequestRecord{.layer = h.layer,
                                               .num_sequences = h.num_sequences,
                                               .queued = started - job.arrived,
                                               .compute = computed - started,
                                               .append_only = (h.flags & kAppendOnly) != 0,
                                               .status = status});
  }
  Answer(h, reply, status, std::move(rows), reply_bytes, h.num_sequences);
}

void UcxAttentionServer::ServeBlocks(const RequestView& request, absl::Time arrived) {
  const RequestHeader& h = request.header;
  const absl::Time started = absl::Now();
  ReplyHeader reply{.dtype = WireDType::kF32,
                    .flags = h.flags,
                    .request_id = h.request_id,
                    .num_sequences = h.num_sequences};
  const bool put = (h.flags & kAppendOnly) != 0;
  absl::StatusOr<size_t> bytes = put ? size_t{0} : computer_->BlockGetBytes(request);
  std::shared_ptr<uint64_t[]> data;
  absl::Status status = bytes.status();
  if (status.ok()) {
    data = reply_buffers_.Take((*bytes + 7) / 8);
    status = computer_->ServeBlocks(request, reinterpret_cast<char*>(data.get()));
  }
  if (options_.on_request) {
    options_.on_request(AttentionRequestRecord{.layer = h.layer,
                                               .num_sequences = h.num_sequences,
                                               .queued = started - arrived,
                                               .compute = absl::Now() - started,
                                               .append_only = put,
                                               .blocks = true,
                                               .status = status});
  }
  Answer(h, reply, status, std::move(data), status.ok() ? *bytes : 0, 0);
}

void UcxAttentionServer::Answer(const RequestHeader& h, ReplyHeader reply,
                                const absl::Status& status, std::shared_ptr<uint64_t[]> data,
                                size_t data_bytes, int32_t sequences) {
  reply.status_code = static_cast<int32_t>(status.code());
  std::shared_ptr<Endpoint> endpoint = RouteTo(h.owner_incarnation, h.lane);
  {
    // Counted before the reply goes out (see above).
    absl::MutexLock lock(&mu_);
    if (!endpoint) {
      ++counters_.dropped;
    } else if (status.ok()) {
      ++counters_.requests;
      counters_.sequences += sequences;
      counters_.bytes_out += static_cast<int64_t>(data_bytes);
    } else {
      ++counters_.errors;
    }
  }
  if (!endpoint) return;
  if (status.ok()) {
    SendReply(*endpoint, EncodeReplyHeader(reply, ""), std::move(data), data_bytes);
  } else {
    SendReply(*endpoint, EncodeReplyHeader(reply, status.message()), nullptr, 0);
  }
}

std::shared_ptr<Endpoint> UcxAttentionServer::RouteTo(uint64_t incarnation, int32_t lane) {
  absl::MutexLock lock(&mu_);
  auto it = routes_.find(incarnation);
  if (it == routes_.end() || it->second.endpoints.empty()) return nullptr;
  const std::vector<std::shared_ptr<Endpoint>>& endpoints = it->second.endpoints;
  return endpoints[lane >= 0 && lane < static_cast<int32_t>(endpoints.size()) ? lane : 0];
}

void UcxAttentionServer::SendReply(Endpoint& endpoint, std::string header,
                                   std::shared_ptr<uint64_t[]> data, size_t data_bytes) {
  const void* bytes = data ? static_cast<const void*>(data.get()) : nullptr;
  endpoint.Send(kAttentionReplyMessageId, std::move(header), bytes, data_bytes,
                [data](absl::Status status) {
                  if (!status.ok()) {
                    TRIDENT_LOG(WARNING) << "attention reply not delivered: " << status;
                  }
                });
}

}  // namespace trident::transport::attention
