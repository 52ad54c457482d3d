#include "common/process/shutdown_signal.h"

#include <pthread.h>
#include <signal.h>

#include <cerrno>

#include "common/logging/log.h"

namespace trident {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  const int error = pthread_sigmask(SIG_BLOCK, &set, nullptr);
  TRIDENT_CHECK(error == 0) << "pthread_sigmask: " << error;
}

int WaitForShutdownSignal() {
  const sigset_t set = ShutdownSignals();
  int signal_number = 0;
  while (true) {
    const int error = sigwait(&set, &signal_number);
    if (error == 0) return signal_number;
    TRIDENT_CHECK(error == EINTR) << "sigwait: " << error;
  }
}

}  // namespace trident
