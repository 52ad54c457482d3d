#ifndef TRIDENT_COMMON_PROCESS_SHUTDOWN_SIGNAL_H_
#define TRIDENT_COMMON_PROCESS_SHUTDOWN_SIGNAL_H_

// SIGTERM and SIGINT as an ordinary event: a service blocks both signals at
// the top of main (before it starts any thread, so every thread inherits the
// mask), then one thread waits for them with sigwait and drains the process.
// Nothing runs inside a signal handler.

namespace trident {

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it
// starts afterwards. Call first thing in main.
void BlockShutdownSignals();

// Waits until SIGTERM or SIGINT arrives and returns its number.
// REQUIRES: BlockShutdownSignals() ran in this thread (or an ancestor of it).
int WaitForShutdownSignal();

}  // namespace trident

#endif  // TRIDENT_COMMON_PROCESS_SHUTDOWN_SIGNAL_H_
