// What a front end (the public Generation API) needs from whatever produces
// tokens: submit a validated request and receive its token events, abort
// it. The worker's Engine is one; the router's remote prefill -> decode path
// is another.

#ifndef TRIDENT_COMMON_ENGINE_TOKEN_SOURCE_H_
#define TRIDENT_COMMON_ENGINE_TOKEN_SOURCE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/engine/request.h"

namespace trident::engine {

// Receives a request's tokens in order; the last event has finish != kNone.
using TokenCallback = std::function<void(const TokenEvent&)>;

// Thread-safe.
class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Starts a request. Errors are returned at once and the callback is never
  // called; otherwise the callback receives every token and exactly one
  // finishing event, possibly on another thread, and must not block.
  virtual absl::Status Submit(EngineRequest request, TokenCallback callback) = 0;

  // Ends a request: its callback receives a final kAborted event unless it
  // already finished. Idempotent.
  virtual void Abort(const std::string& request_id) = 0;
};

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_TOKEN_SOURCE_H_
