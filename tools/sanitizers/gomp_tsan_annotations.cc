// ThreadSanitizer and Debian's libgomp: OpenMP's fork, join and barriers
// happen inside libgomp, built without TSan, so TSan sees threads of a
// parallel region touch what the spawning thread wrote before it (and the
// spawning thread reuse, after the region, stack slots the workers read)
// with nothing ordering them. Linked into each test's executable under
// --config=tsan (tools/build/defs.bzl), this file interposes the two entry
// points Trident's kernels call (GOMP_parallel, GOMP_barrier; oneDNN's
// regions come through GOMP_parallel too) and tells TSan what they order:
// the spawning thread releases before the region and acquires every
// thread's release after it; each thread acquires the spawn at its start
// and releases at its end; a barrier is a release before and an acquire
// after. Each calls libgomp's own entry point (dlsym RTLD_NEXT), which does
// the work unchanged.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "sanitizer/tsan_interface.h"

namespace {

void* Real(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "gomp_tsan_annotations: %s not found: %s\n", name, dlerror());
    std::abort();
  }
  return symbol;
}

// One region: the body and its data, and the addresses TSan synchronizes on.
struct Region {
  void (*fn)(void*);
  void* data;
  char forked;
  char joined;
};

void RunRegionBody(void* arg) {
  Region* region = static_cast<Region*>(arg);
  __tsan_acquire(&region->forked);
  region->fn(region->data);
  __tsan_release(&region->joined);
}

// Every team's barriers: coarser than libgomp's (one address for all teams),
// which can only hide a report, never add one.
char barrier_sync;

}  // namespace

extern "C" {

void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  using Fn = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const Fn real = reinterpret_cast<Fn>(Real("GOMP_parallel"));
  Region region{fn, data, 0, 0};
  __tsan_release(&region.forked);
  real(&RunRegionBody, &region, num_threads, flags);
  __tsan_acquire(&region.joined);
}

void GOMP_barrier() {
  using Fn = void (*)();
  static const Fn real = reinterpret_cast<Fn>(Real("GOMP_barrier"));
  __tsan_release(&barrier_sync);
  real();
  __tsan_acquire(&barrier_sync);
}

}  // extern "C"
