// What a failed live test leaves to read: the cluster's logs.
#ifndef TRIDENT_TESTS_TESTING_CLUSTER_LOGS_H_
#define TRIDENT_TESTS_TESTING_CLUSTER_LOGS_H_

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace trident::testing {

// Copies every log of a `trident up` cluster (STATE_DIR/logs/*.log) into
// the test's undeclared outputs (bazel-testlogs/<test>/test.outputs), where
// they outlive the test's temporary directory, and prints the last
// `tail_lines` lines of each, so that a failure seen once (in CI, say) can
// be read without reproducing it. Call it before the cluster's directory
// goes, when the test has failed.
inline void KeepClusterLogs(const std::string& state_dir, int tail_lines = 30) {
  namespace fs = std::filesystem;
  const fs::path logs = fs::path(state_dir) / "logs";
  std::error_code error;
  if (!fs::is_directory(logs, error)) return;
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  for (const fs::directory_entry& entry : fs::directory_iterator(logs, error)) {
    if (entry.path().extension() != ".log") continue;
    if (outputs != nullptr) {
      fs::copy_file(entry.path(), fs::path(outputs) / entry.path().filename(),
                    fs::copy_options::overwrite_existing, error);
    }
    std::ifstream in(entry.path());
    std::deque<std::string> tail;
    for (std::string line; std::getline(in, line);) {
      tail.push_back(line);
      if (static_cast<int>(tail.size()) > tail_lines) tail.pop_front();
    }
    std::printf("---- last %zu lines of %s\n", tail.size(), entry.path().filename().c_str());
    for (const std::string& line : tail) std::printf("%s\n", line.c_str());
  }
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_CLUSTER_LOGS_H_
