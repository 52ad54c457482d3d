// main() for tests that run gRPC servers and callback-API clients in the
// test process. It anchors gRPC's shared callback completion queue for the
// process (common/grpc/callback_queue_anchor.h: tests make and drop channels,
// and gRPC 1.51's teardown of that queue races its own threads), runs the
// tests and leaves with std::_Exit, skipping static destructors, where the
// same teardown would run. Nothing a test asserts happens after
// RUN_ALL_TESTS returns.

#include <cstdio>
#include <cstdlib>

#include "common/grpc/callback_queue_anchor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  trident::AnchorCallbackCompletionQueue();
  const int result = RUN_ALL_TESTS();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(result);
}
