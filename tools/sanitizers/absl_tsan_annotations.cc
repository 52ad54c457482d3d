// ThreadSanitizer and Debian's Abseil: absl::Mutex, absl::CondVar and
// absl::Notification live in libabsl_synchronization.so, built without TSan,
// so TSan sees none of their synchronization and reports every access they
// guard as a race. Linked into each test's executable under --config=tsan
// (tools/build/defs.bzl), this file interposes their out-of-line entry points:
// each calls the library's own (dlsym RTLD_NEXT) inside TSan's mutex
// annotations (a lock, an unlock, a wait as an unlock and a lock), so that
// TSan knows the lock and ignores what runs inside the library's call (the
// Conditions it evaluates for other threads while it holds the mutex);
// Notify releases the notification (and its flag, which HasBeenNotified
// reads inline), and a wait that sees it notified acquires it.
// Nothing here changes what the library does. TSan only: the symbols are
// Abseil's, and Abseil built with TSan annotates itself.

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "sanitizer/tsan_interface.h"

namespace {

// The library's definition of the symbol `mangled`; aborts if it is absent
// (another Abseil than the one this file was written against).
void* Real(const char* mangled) {
  void* symbol = dlsym(RTLD_NEXT, mangled);
  if (symbol == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return symbol;
}

template <typename Fn>
Fn RealFn(const char* mangled) {
  return reinterpret_cast<Fn>(Real(mangled));
}

void Acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
void Release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }

// Notification holds its Mutex, then the atomic flag that HasBeenNotified
// reads inline (an instrumented acquire load, which TSan pairs with a
// release on the same address).
static_assert(sizeof(absl::Mutex) == sizeof(void*), "absl::Notification's layout changed");
const void* FlagOf(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

// The mangled names are Debian's inline namespace's (absl::debian3).
#define TRIDENT_REAL(type, mangled)              \
  static const auto real = RealFn<type>(mangled)

namespace absl {
ABSL_NAMESPACE_BEGIN

namespace {

constexpr unsigned kRead = __tsan_mutex_read_lock;

// The library's entry points call one another (AwaitWithTimeout calls
// AwaitWithDeadline through the same interposed symbol): only the outermost
// call is annotated.
thread_local int depth = 0;

class Outermost {
 public:
  Outermost() : outer_(depth++ == 0) {}
  ~Outermost() { --depth; }
  bool operator()() const { return outer_; }

 private:
  const bool outer_;
};

// A lock taken by `lock` (the library's call, which may evaluate conditions:
// TSan ignores what runs inside).
template <typename Call>
auto Locked(Mutex* mu, unsigned flags, Call lock) {
  const Outermost outer;
  if (!outer()) return lock();
  __tsan_mutex_pre_lock(mu, flags);
  auto result = lock();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// The mutex (held) released and taken again around `wait`.
template <typename Call>
auto Rewaited(Mutex* mu, Call wait) {
  const Outermost outer;
  if (!outer()) return wait();
  __tsan_mutex_pre_unlock(mu, 0);
  auto result = wait();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

bool TryLocked(Mutex* mu, unsigned flags, bool (*real)(Mutex*)) {
  const Outermost outer;
  if (!outer()) return real(mu);
  __tsan_mutex_pre_lock(mu, flags | __tsan_mutex_try_lock);
  const bool locked = real(mu);
  __tsan_mutex_post_lock(
      mu, flags | __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

void Unlocked(Mutex* mu, unsigned flags, void (*real)(Mutex*)) {
  const Outermost outer;
  if (!outer()) return real(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  real(mu);
  __tsan_mutex_post_unlock(mu, flags);
}

}  // namespace

void Mutex::Lock() {
  TRIDENT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  Locked(this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() {
  TRIDENT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  Locked(this, kRead, [&] { return (real(this), 0); });
}

bool Mutex::TryLock() {
  TRIDENT_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  return TryLocked(this, 0, real);
}

bool Mutex::ReaderTryLock() {
  TRIDENT_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  return TryLocked(this, kRead, real);
}

void Mutex::Unlock() {
  TRIDENT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Unlocked(this, 0, real);
}

void Mutex::ReaderUnlock() {
  TRIDENT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Unlocked(this, kRead, real);
}

void Mutex::LockWhen(const Condition& cond) {
  TRIDENT_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Locked(this, 0, [&] { return (real(this, cond), 0); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  TRIDENT_REAL(void (*)(Mutex*, const Condition&),
               "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locked(this, kRead, [&] { return (real(this, cond), 0); });
}

// Held on return either way.
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locked(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locked(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locked(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locked(this, kRead, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  TRIDENT_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Rewaited(this, [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Rewaited(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  TRIDENT_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Rewaited(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  TRIDENT_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Rewaited(mu, [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  TRIDENT_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
               "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Rewaited(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  TRIDENT_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
               "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Rewaited(mu, [&] { return real(this, mu, deadline); });
}

void Notification::Notify() {
  TRIDENT_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(FlagOf(this));
  real(this);
}

void Notification::WaitForNotification() const {
  TRIDENT_REAL(void (*)(const Notification*),
               "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  TRIDENT_REAL(bool (*)(const Notification*, absl::Duration),
               "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  TRIDENT_REAL(bool (*)(const Notification*, absl::Time),
               "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
