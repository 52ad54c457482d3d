// Writes a generated tokenizer (tokenizer.json + tokenizer_config.json) into
// an existing directory, e.g. to produce HF reference fixtures for the exact
// files the tests use:
//
//   bazel run //tools/make_model/tokenizer_gen:write_tokenizer --
//       --style=llama3 --vocab_size=1024 --out_dir=/tmp/llama3_tok

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "tools/make_model/tokenizer_gen/tokenizer_gen.h"

ABSL_FLAG(std::string, style, "llama3", "Tokenizer style: llama3, qwen2 or llama2.");
ABSL_FLAG(int32_t, vocab_size, 1024, "Total vocabulary size, special tokens included.");
ABSL_FLAG(std::string, out_dir, "", "Existing directory to write the two files into.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  if (out_dir.empty()) {
    std::fprintf(stderr, "write_tokenizer: --out_dir is required\n");
    return 2;
  }
  absl::StatusOr<trident::make_model::TokenizerStyle> style =
      trident::make_model::ParseTokenizerStyle(absl::GetFlag(FLAGS_style));
  if (!style.ok()) {
    std::fprintf(stderr, "write_tokenizer: %s\n", style.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<trident::make_model::GeneratedTokenizer> tokenizer =
      trident::make_model::GenerateTokenizer(*style, absl::GetFlag(FLAGS_vocab_size));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "write_tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const absl::Status written = trident::make_model::WriteTokenizerFiles(*tokenizer, out_dir);
  if (!written.ok()) {
    std::fprintf(stderr, "write_tokenizer: %s\n", written.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s/tokenizer.json and tokenizer_config.json (vocab_size %d)\n",
              out_dir.c_str(), tokenizer->vocab_size);
  return 0;
}
