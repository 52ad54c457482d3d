// Keeps gRPC's shared callback completion queue alive for the whole process.
//
// gRPC 1.51, where its I/O manager does not poll in the background, runs the
// callback API (callback clients and servers) on one shared completion queue
// with its own polling threads. It tears that queue down whenever the last
// channel that used it goes, and builds it again for the next one; that
// teardown can race its own polling threads (a double free in
// grpc_cq_internal_unref, seen about once in fifty runs of a test that makes
// and drops channels). A process that calls this once, early, holds the
// queue for its lifetime, so it is never torn down while the process runs.

#ifndef TRIDENT_COMMON_GRPC_CALLBACK_QUEUE_ANCHOR_H_
#define TRIDENT_COMMON_GRPC_CALLBACK_QUEUE_ANCHOR_H_

namespace trident {

// Thread-safe; later calls do nothing. Blocks until a callback call on a
// process-lifetime channel has ended (at once: it goes nowhere).
void AnchorCallbackCompletionQueue();

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_CALLBACK_QUEUE_ANCHOR_H_
