// Replays Hugging Face `tokenizers` reference fixtures written by
// tools/reference/tokenizer_fixtures.py: every `*.json` in the directory given
// by --fixtures_dir=DIR or the environment variable TRIDENT_TOKENIZER_FIXTURES.
// Each fixture embeds tokenizer.json and tokenizer_config.json, so it checks
// encode (with and without special tokens), decode and streaming decode
// against HF for exactly those files. Fails if no fixture is found.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::tokenizer {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;

std::string& FixturesDir() {
  static auto* const dir = new std::string();
  return *dir;
}

std::vector<std::string> FixtureFiles() {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(FixturesDir(), error)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The input as raw bytes: invalid UTF-8 goes to Encode unreplaced, so the
// U+FFFD replacement is part of what is compared.
std::string InputBytes(const nlohmann::json& input) {
  if (input.contains("text")) return input["text"].get<std::string>();
  absl::string_view hex = input["bytes_hex"].get_ref<const std::string&>();
  return absl::HexStringToBytes(hex);
}

TEST(TokenizerFixtureTest, MatchesHuggingFace) {
  ASSERT_FALSE(FixturesDir().empty())
      << "no fixtures directory: pass --fixtures_dir=DIR or set TRIDENT_TOKENIZER_FIXTURES "
         "(fixtures come from tools/reference/tokenizer_fixtures.py)";
  const std::vector<std::string> files = FixtureFiles();
  ASSERT_FALSE(files.empty()) << "no *.json fixtures in " << FixturesDir();
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    std::ifstream in(file, std::ios::binary);
    std::stringstream contents;
    contents << in.rdbuf();
    const nlohmann::json fixture = nlohmann::json::parse(contents.str(), nullptr, false);
    ASSERT_TRUE(fixture.is_object()) << "not a JSON object";
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
        Tokenizer::FromJson(fixture["tokenizer_json"].get<std::string>(),
                            fixture["tokenizer_config_json"].get<std::string>(), file);
    ASSERT_THAT(loaded, IsOk());
    const Tokenizer& t = **loaded;
    int checked = 0;
    for (const nlohmann::json& c : fixture["cases"]) {
      const std::string input = InputBytes(c["input"]);
      SCOPED_TRACE(absl::StrCat("input \"", absl::CEscape(input), "\""));
      const auto with_special = c["encode_with_special"].get<std::vector<int32_t>>();
      const auto without_special = c["encode_without_special"].get<std::vector<int32_t>>();
      EXPECT_EQ(t.Encode(input, /*add_special_tokens=*/true), with_special);
      EXPECT_EQ(t.Encode(input, /*add_special_tokens=*/false), without_special);
      const std::string decoded = c["decode"].get<std::string>();
      EXPECT_THAT(t.Decode(without_special, /*skip_special_tokens=*/false), IsOkAndHolds(decoded));
      IncrementalDecoder stream(t, /*skip_special_tokens=*/false);
      std::string streamed;
      for (int32_t id : without_special) {
        absl::StatusOr<std::string> delta = stream.Push(id);
        ASSERT_THAT(delta, IsOk());
        EXPECT_TRUE(IsValidUtf8(*delta)) << "delta \"" << absl::CEscape(*delta) << "\"";
        streamed += *delta;
      }
      streamed += stream.Finish();
      EXPECT_EQ(streamed, decoded);
      ++checked;
    }
    EXPECT_GT(checked, 0) << "fixture has no cases";
    std::printf("%s: %d cases\n", file.c_str(), checked);
  }
}

}  // namespace
}  // namespace trident::tokenizer

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* env = std::getenv("TRIDENT_TOKENIZER_FIXTURES")) {
    trident::tokenizer::FixturesDir() = env;
  }
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--fixtures_dir=")) {
      trident::tokenizer::FixturesDir() = argv[i] + std::string("--fixtures_dir=").size();
    }
  }
  return RUN_ALL_TESTS();
}
