#ifndef TRIDENT_COMMON_TESTING_RUNFILES_H_
#define TRIDENT_COMMON_TESTING_RUNFILES_H_

// Paths of a test's data dependencies and scratch space under Bazel.

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace trident::testing {

// The path of `workspace_relative` (e.g. "tools/cli/trident") among the
// test's runfiles.
inline std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir == nullptr ? "." : srcdir, "/trident/", workspace_relative);
}

// A fresh directory name under the test's private temporary directory.
inline std::string TestTmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp == nullptr ? "/tmp" : tmp, "/", name);
}

}  // namespace trident::testing

#endif  // TRIDENT_COMMON_TESTING_RUNFILES_H_
