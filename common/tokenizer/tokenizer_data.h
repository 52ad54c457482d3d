#ifndef TRIDENT_COMMON_TOKENIZER_TOKENIZER_DATA_H_
#define TRIDENT_COMMON_TOKENIZER_TOKENIZER_DATA_H_

// Internal to common/tokenizer: a tokenizer.json's parsed form
// (TokenizerData), its parser (tokenizer_json.cc) and the encoding and
// decoding steps over it (tokenizer_pipeline.cc). tokenizer.cc holds the
// public classes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "common/tokenizer/split_pattern.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace trident::tokenizer::internal {

using Json = nlohmann::json;

// Ids at or above this are rejected: no real vocabulary comes close, and it
// bounds the id -> token table.
constexpr int64_t kMaxTokenId = 1 << 24;
// Nesting limit for Sequence normalizers, pre-tokenizers and decoders.
constexpr int kMaxDepth = 16;
// Words longer than this (bytes) are not cached; the cache is cleared when
// it holds more than kMaxCacheEntries words.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 100000;
// How many prompt ids the incremental decoder keeps for context.
constexpr size_t kPromptContextIds = 5;

constexpr absl::string_view kMetaspaceDefault = "\xE2\x96\x81";  // U+2581

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

enum class PrependScheme { kFirst, kAlways, kNever };

struct NormalizerStep {
  enum Op { kNfc, kPrepend, kReplace } op;
  std::string a;  // Prepend: the prefix. Replace: the pattern.
  std::string b;  // Replace: the content.
};

struct PreTokenizerStep {
  enum Op { kByteLevel, kSplit, kMetaspace } op;
  bool add_prefix_space = false;                          // ByteLevel.
  bool use_regex = true;                                  // ByteLevel.
  SplitPattern pattern = SplitPattern::kGpt2;             // Split.
  std::string replacement;                                // Metaspace.
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // Metaspace.
  bool split = true;                                      // Metaspace.
};

struct DecoderStep {
  enum Op { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } op;
  std::string a;        // Replace: pattern. Metaspace: replacement. Strip: content.
  std::string b;        // Replace: content.
  bool prepend = true;  // Metaspace: prepend_scheme != never.
  int64_t start = 0;    // Strip.
  int64_t stop = 0;     // Strip.
};

struct TokenizerData {
  // Model (BPE).
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // Indexed by id; see has_id.
  std::vector<bool> has_id;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // -> (rank, new id)
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  absl::optional<int32_t> unk_id;
  std::vector<int32_t> byte_token_ids = std::vector<int32_t>(256, -1);  // <0xNN>.

  // Added tokens.
  std::vector<AddedToken> added;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  absl::flat_hash_map<std::string, size_t> added_by_content;
  absl::flat_hash_set<std::string> special_contents;
  // Indices into `added` by first byte, longest content first, for raw
  // (normalized = false) and normalized matching.
  std::vector<std::vector<size_t>> raw_by_byte = std::vector<std::vector<size_t>>(256);
  std::vector<std::vector<size_t>> norm_by_byte = std::vector<std::vector<size_t>>(256);
  bool has_raw_added = false;
  bool has_norm_added = false;

  std::vector<NormalizerStep> normalizer;
  bool has_pre_tokenizer = false;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool has_post_processor = false;
  std::vector<int32_t> post_prefix;
  std::vector<int32_t> post_suffix;
  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  bool decoder_has_byte_fallback = false;

  Tokenizer::Kind kind = Tokenizer::Kind::kSentencePieceBpe;
  absl::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  bool config_add_bos = false;
  bool config_add_eos = false;
  int32_t vocab_size = 0;

  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);
};

// tokenizer_json.cc.

// The parsed tokenizer.json; kInvalidArgument naming the field (under
// `source`) for anything it cannot take.
absl::StatusOr<std::unique_ptr<TokenizerData>> ParseTokenizerJson(absl::string_view tokenizer_json,
                                                                  absl::string_view source);

absl::Status ParseConfig(absl::string_view config_json, const std::string& source, TokenizerData* d,
                         const Tokenizer& tokenizer);

// tokenizer_pipeline.cc.

// A run of input text, or an added token already turned into its id.
struct Segment {
  std::string text;
  int32_t added_id = -1;  // >= 0: an added token, already an id.
  bool at_start = false;  // Begins at offset 0 of the input.
};

// A pre-tokenized word.
struct Piece {
  std::string text;
  bool at_start;
};

// Splits `s` on the added tokens of `index` (leftmost-longest, as HF's
// Aho-Corasick matcher), honoring single_word / lstrip / rstrip.
void SplitOnAdded(const TokenizerData& d, const std::vector<std::vector<size_t>>& index,
                  const std::string& s, bool at_start, std::vector<Segment>* out);

std::string Normalize(const TokenizerData& d, std::string s);

std::vector<Piece> PreTokenize(const TokenizerData& d, std::string text, bool at_start);

void Tokenize(const TokenizerData& d, const std::string& word, std::vector<int32_t>* out);

bool IsByteToken(absl::string_view token, uint8_t* byte);

void ApplyDecoder(const DecoderStep& step, bool at_start, std::vector<std::string>* tokens);

}  // namespace trident::tokenizer::internal

#endif  // TRIDENT_COMMON_TOKENIZER_TOKENIZER_DATA_H_
