#ifndef TRIDENT_COMMON_STATUS_STATUS_MACROS_H_
#define TRIDENT_COMMON_STATUS_STATUS_MACROS_H_

// Propagation macros with the meaning of Abseil's later
// `ABSL_RETURN_IF_ERROR` / `ABSL_ASSIGN_OR_RETURN`, which the Abseil that
// Trident builds against (20220623) does not have yet.
//
//   TRIDENT_RETURN_IF_ERROR(WriteHeader(file));
//   TRIDENT_ASSIGN_OR_RETURN(Model model, LoadModel(path));
//   TRIDENT_ASSIGN_OR_RETURN(auto [a, b], Split(text));  // not supported: use a struct.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing
// function if it is not OK.
#define TRIDENT_RETURN_IF_ERROR(expr)                                         \
  do {                                                                        \
    ::absl::Status trident_status_macro_status_ = (expr);                     \
    if (!trident_status_macro_status_.ok()) return trident_status_macro_status_; \
  } while (false)

#define TRIDENT_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define TRIDENT_STATUS_MACROS_CONCAT_(a, b) TRIDENT_STATUS_MACROS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>) once. On error returns its status
// from the enclosing function; otherwise moves the value into `lhs`, which may
// be a declaration (`auto x`, `const Foo& y` is not allowed: bind by value).
#define TRIDENT_ASSIGN_OR_RETURN(lhs, rexpr)                                               \
  TRIDENT_ASSIGN_OR_RETURN_IMPL_(                                                          \
      TRIDENT_STATUS_MACROS_CONCAT_(trident_statusor_macro_value_, __LINE__), lhs, rexpr)

#define TRIDENT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)

#endif  // TRIDENT_COMMON_STATUS_STATUS_MACROS_H_
