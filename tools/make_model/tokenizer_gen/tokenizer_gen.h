// Generates small but real Hugging Face tokenizers (tokenizer.json and
// tokenizer_config.json) for the random-weight models of tests and the local
// cluster. Merges are learned deterministically by classic BPE training on a
// built-in corpus (English prose, code, numbers, accented Latin, CJK, emoji):
// count adjacent symbol pairs over the pre-tokenized words, merge the most
// frequent pair (ties: the lexicographically smallest), repeat. The files use
// the exact schema the `tokenizers` library writes, so
// `tokenizers.Tokenizer.from_file` and transformers load them.
//
// Styles:
//   kLlama3  byte-level BPE, Llama 3 split regex, ignore_merges, special tokens
//            <|begin_of_text|> (prepended by TemplateProcessing),
//            <|end_of_text|>, <|eot_id|>, header/reserved tokens.
//   kQwen2   byte-level BPE, Qwen2 split regex, NFC normalizer, no BOS,
//            <|endoftext|>, <|im_start|>, <|im_end|>.
//   kLlama2  SentencePiece-style BPE with byte fallback: <unk>=0, <s>=1,
//            </s>=2, <0x00>..<0xFF>=3..258, then characters and merges;
//            normalizer Prepend("▁") + Replace(" ", "▁"); <s> prepended.
// If the corpus runs out of pairs before `vocab_size`, the vocabulary is
// padded with tokens no input can produce ("<|pad_N|>"), so the ids still
// span [0, vocab_size).

#ifndef TRIDENT_TOOLS_MAKE_MODEL_TOKENIZER_GEN_TOKENIZER_GEN_H_
#define TRIDENT_TOOLS_MAKE_MODEL_TOKENIZER_GEN_TOKENIZER_GEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trident::make_model {

enum class TokenizerStyle { kLlama3, kQwen2, kLlama2 };

// "llama3", "qwen2", "llama2".
absl::string_view TokenizerStyleName(TokenizerStyle style);
// kInvalidArgument for an unknown name.
absl::StatusOr<TokenizerStyle> ParseTokenizerStyle(absl::string_view name);

struct GeneratedTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t vocab_size = 0;        // Ids span [0, vocab_size), special tokens included.
  int32_t bos_id = -1;           // -1: the style has no BOS token.
  std::vector<int32_t> eos_ids;  // First: tokenizer_config.json's eos_token.
};

// The smallest vocab_size GenerateTokenizer accepts for `style`.
int32_t MinVocabSize(TokenizerStyle style);

// Deterministic: the same arguments give byte-identical files.
// kInvalidArgument if vocab_size is below MinVocabSize(style) or above 2^20.
absl::StatusOr<GeneratedTokenizer> GenerateTokenizer(TokenizerStyle style, int32_t vocab_size);

// Writes `dir`/tokenizer.json and `dir`/tokenizer_config.json (`dir` must exist).
absl::Status WriteTokenizerFiles(const GeneratedTokenizer& tokenizer, const std::string& dir);

// The built-in training corpus.
absl::string_view TrainingCorpus();

}  // namespace trident::make_model

#endif  // TRIDENT_TOOLS_MAKE_MODEL_TOKENIZER_GEN_TOKENIZER_GEN_H_
