// Reusable buffers for messages sent or answered asynchronously. A request
// or a reply of the attention data plane is hundreds of KiB at tens of
// sequences; allocated afresh for each one, it is a fresh mapping whose
// pages the kernel faults in and zeroes every time (on the H200 host that
// was most of the ~15 us a sequence a layer the data plane cost). Buffers
// taken here go back to the pool when their last owner drops them (a send's
// completion may come on a UCX thread, after the pool's owner is gone).
//
//   MessageBuffers pool;
//   std::shared_ptr<uint64_t[]> buffer = pool.Take(words);  // contents undefined
//   endpoint.Send(..., buffer.get(), bytes, [buffer](absl::Status) {});

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_MESSAGE_BUFFERS_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_MESSAGE_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace trident::transport::attention {

// Thread-safe.
class MessageBuffers {
 public:
  // Keeps at most `max_free` buffers between uses (the largest ones).
  explicit MessageBuffers(size_t max_free = 8);
  ~MessageBuffers();
  MessageBuffers(const MessageBuffers&) = delete;
  MessageBuffers& operator=(const MessageBuffers&) = delete;

  // A buffer of at least `words` (>= 1) 64-bit words; its contents are
  // whatever the last user left.
  std::shared_ptr<uint64_t[]> Take(size_t words);

  // Buffers allocated so far (not reused), and buffers free now.
  int64_t allocated() const;
  size_t free_buffers() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_MESSAGE_BUFFERS_H_
