// The threaded shell around EngineCore: one loop thread owns the core and
// the backend; other threads submit and abort requests and receive their
// tokens through callbacks (called on the loop thread, so they must not
// block).

#ifndef TRIDENT_COMMON_ENGINE_ENGINE_H_
#define TRIDENT_COMMON_ENGINE_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine_core.h"
#include "common/kv/block_allocator.h"

namespace trident::engine {

// Receives a request's tokens in order; the last event has finish != kNone.
using TokenCallback = std::function<void(const TokenEvent&)>;

class Engine {
 public:
  Engine(std::unique_ptr<backend::ModelBackend> backend, EngineOptions options);
  // Stops the loop; requests still live receive a kAborted event.
  ~Engine();

  // Queues a request. Errors (INVALID_ARGUMENT from validation,
  // ALREADY_EXISTS, UNAVAILABLE after Shutdown) are returned at once and the
  // callback is never called; otherwise the callback receives every token
  // and exactly one finishing event.
  absl::Status Submit(EngineRequest request, TokenCallback callback);

  // Ends a request: its callback receives a final kAborted event (unless it
  // already finished). Safe from any thread, idempotent.
  void Abort(const std::string& request_id);

  // Aborts everything and stops the loop thread. Idempotent.
  void Shutdown();

  EngineStats stats() const;
  const backend::ModelBackend& backend() const { return *backend_; }

  // Called on the loop thread with fresh stats after every iteration (for
  // metrics); must be quick.
  void SetStatsObserver(std::function<void(const EngineStats&)> observer);

 private:
  void Loop();
  void Deliver(const std::vector<TokenEvent>& events);

  std::unique_ptr<backend::ModelBackend> backend_;
  std::unique_ptr<kv::BlockAllocator> allocator_;
  // Touched only by the loop thread after construction (Validate is const).
  std::unique_ptr<EngineCore> core_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<EngineRequest> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TokenCallback> callbacks_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::function<void(const EngineStats&)> observer_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_ENGINE_H_
