// WorkerControl.GetLoad: streams WorkerLoad samples to each caller (the
// routers and the controller), one at once and then one per the caller's
// interval, from a single ticker thread for every stream. A sample whose
// predecessor is still being written to a slow reader is skipped, not
// queued, so a stalled reader costs no memory and always gets fresh data.

#ifndef TRIDENT_SERVICES_WORKER_LOAD_STREAMS_H_
#define TRIDENT_SERVICES_WORKER_LOAD_STREAMS_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/kv_event_log.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/cluster.pb.h"
#include "trident/v1/worker.pb.h"

namespace trident::worker {

// The prefix cache's events, which each stream's samples carry
// (WorkerLoad.kv_events).
struct KvEventsSource {
  // Not owned; must outlive the LoadStreams. Null: no events.
  const kv::KvEventLog* log = nullptr;
  // The DRAM tier's mirror (WorkerLoad.dram_kv_events); null: none. Same
  // identity and block size.
  const kv::KvEventLog* dram_log = nullptr;
  std::string cache_identity;
  int32_t block_size_tokens = 0;
  // A stream gets a snapshot this often besides its first sample, so that a
  // reader that lost track (a bug, a dropped sample) converges.
  absl::Duration snapshot_interval = absl::Seconds(60);
};

// Thread-safe.
class LoadStreams {
 public:
  // `sample` builds one WorkerLoad; called from the ticker thread and from
  // Open, so it must be thread-safe and quick.
  using Sampler = std::function<trident::v1::WorkerLoad()>;
  explicit LoadStreams(Sampler sample, KvEventsSource kv_events = {});
  // Ends every open stream with UNAVAILABLE and waits for them to finish.
  ~LoadStreams();

  // The reactor of one GetLoad call. INVALID_ARGUMENT naming `interval`
  // outside [10 ms, 60 s]; UNAVAILABLE once shutting down.
  grpc::ServerWriteReactor<trident::v1::WorkerLoad>* Open(
      grpc::CallbackServerContext* context, const trident::v1::GetLoadRequest* request);

  int open_streams() const;

 private:
  class Stream;
  void Tick();
  void Remove(Stream* stream);

  const Sampler sample_;
  const KvEventsSource kv_events_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Open so the ticker recomputes its wait.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_LOAD_STREAMS_H_
