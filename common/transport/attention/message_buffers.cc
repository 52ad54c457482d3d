#include "common/transport/attention/message_buffers.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trident::transport::attention {

struct MessageBuffers::State {
  struct Free {
    size_t words = 0;
    std::unique_ptr<uint64_t[]> data;
  };
  explicit State(size_t max_free) : max_free(max_free) {}

  // Back from its last owner: kept if there is room or it is larger than the
  // smallest kept one.
  void Return(uint64_t* data, size_t words) {
    std::unique_ptr<uint64_t[]> owned(data);
    absl::MutexLock lock(&mu);
    if (free.size() < max_free) {
      free.push_back(Free{words, std::move(owned)});
      return;
    }
    auto smallest = std::min_element(
        free.begin(), free.end(), [](const Free& a, const Free& b) { return a.words < b.words; });
    if (smallest != free.end() && smallest->words < words) {
      *smallest = Free{words, std::move(owned)};
    }
  }

  const size_t max_free;
  mutable absl::Mutex mu;
  std::vector<Free> free ABSL_GUARDED_BY(mu);
  int64_t allocated ABSL_GUARDED_BY(mu) = 0;
};

MessageBuffers::MessageBuffers(size_t max_free)
    : state_(std::make_shared<State>(std::max<size_t>(1, max_free))) {}

MessageBuffers::~MessageBuffers() = default;

std::shared_ptr<uint64_t[]> MessageBuffers::Take(size_t words) {
  words = std::max<size_t>(words, 1);
  std::unique_ptr<uint64_t[]> data;
  size_t capacity = words;
  {
    absl::MutexLock lock(&state_->mu);
    // The smallest free buffer that holds `words`.
    auto best = state_->free.end();
    for (auto it = state_->free.begin(); it != state_->free.end(); ++it) {
      if (it->words >= words && (best == state_->free.end() || it->words < best->words)) best = it;
    }
    if (best != state_->free.end()) {
      capacity = best->words;
      data = std::move(best->data);
      state_->free.erase(best);
    } else {
      ++state_->allocated;
    }
  }
  if (data == nullptr) data.reset(new uint64_t[capacity]);
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<uint64_t[]>(
      data.release(), [state, capacity](uint64_t* p) { state->Return(p, capacity); });
}

int64_t MessageBuffers::allocated() const {
  absl::MutexLock lock(&state_->mu);
  return state_->allocated;
}

size_t MessageBuffers::free_buffers() const {
  absl::MutexLock lock(&state_->mu);
  return state_->free.size();
}

}  // namespace trident::transport::attention
