// Forwarding header: the runfiles helpers are common/testing/runfiles.h.
// Kept only for common/transport/ucx_peer_death_test.cc and
// tests/overload_test.cc; include the new header instead.

#ifndef TRIDENT_TESTS_TESTING_RUNFILES_H_
#define TRIDENT_TESTS_TESTING_RUNFILES_H_

#include "common/testing/runfiles.h"

#endif  // TRIDENT_TESTS_TESTING_RUNFILES_H_
