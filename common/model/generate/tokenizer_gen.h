// Generates real Hugging Face tokenizer.json files with small vocabularies,
// learned by classic BPE training on a built-in corpus, for the generated
// test models: byte-level BPE (Llama 3, Qwen2 styles) and SentencePiece-style
// BPE with byte fallback (Llama 2 / Mistral / TinyLlama style).
// Deterministic: the same style and size always give the same bytes.

#ifndef TRIDENT_COMMON_MODEL_GENERATE_TOKENIZER_GEN_H_
#define TRIDENT_COMMON_MODEL_GENERATE_TOKENIZER_GEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trident::model::generate {

enum class TokenizerStyle { kLlama3, kQwen2, kLlama2 };

struct GeneratedTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  // Every id, special tokens included.
  int32_t vocab_size = 0;
  // -1 when the style adds no BOS.
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
  // Tokens whose bytes are not whole UTF-8 characters (lone lead or
  // continuation bytes, byte-fallback pieces of multi-byte characters).
  std::vector<int32_t> partial_utf8_ids;
};

// `vocab_size` counts every token; INVALID_ARGUMENT when it cannot hold the
// style's base alphabet and special tokens. The result may be smaller than
// asked when the corpus runs out of pairs to merge.
absl::StatusOr<GeneratedTokenizer> GenerateTokenizer(TokenizerStyle style, int32_t vocab_size);

// The training corpus (also handy as test text).
const std::string& TrainingCorpus();

}  // namespace trident::model::generate

#endif  // TRIDENT_COMMON_MODEL_GENERATE_TOKENIZER_GEN_H_
