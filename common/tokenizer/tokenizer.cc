#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <queue>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_pattern.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace trident::tokenizer {
namespace internal {

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

namespace {

std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 64)) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  if (s.size() > 64) out += "...";
  return out + "\"";
}

// JSON access that names the source and path of every problem.
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  absl::Status Invalid(absl::string_view path, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", message));
  }
  absl::Status Unsupported(absl::string_view path, absl::string_view message) const {
    return absl::FailedPreconditionError(absl::StrCat(source_, ": ", path, ": ", message));
  }

  absl::Status ExpectObject(const Json& v, absl::string_view path) const {
    if (!v.is_object())
      return Invalid(path, absl::StrCat("expected an object, got ", v.type_name()));
    return absl::OkStatus();
  }

  // The member `key` of object `obj` (at `path`), or nullptr if it is absent
  // or null.
  static const Json* Optional(const Json& obj, absl::string_view key) {
    auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<const Json*> Required(const Json& obj, absl::string_view path,
                                       absl::string_view key) const {
    auto it = obj.find(std::string(key));
    if (it == obj.end()) return Invalid(path, absl::StrCat("missing field \"", key, "\""));
    return &*it;
  }

  absl::StatusOr<std::string> String(const Json& v, absl::string_view path) const {
    if (!v.is_string())
      return Invalid(path, absl::StrCat("expected a string, got ", v.type_name()));
    return v.get<std::string>();
  }

  absl::StatusOr<bool> Bool(const Json& v, absl::string_view path) const {
    if (!v.is_boolean())
      return Invalid(path, absl::StrCat("expected a boolean, got ", v.type_name()));
    return v.get<bool>();
  }

  absl::StatusOr<int64_t> Int(const Json& v, absl::string_view path) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return Invalid(path, absl::StrCat("expected an integer, got ", v.type_name()));
  }

  absl::StatusOr<int32_t> TokenId(const Json& v, absl::string_view path) const {
    TRIDENT_ASSIGN_OR_RETURN(int64_t id, Int(v, path));
    if (id < 0 || id >= kMaxTokenId) {
      return Invalid(path, absl::StrCat("token id ", id, " out of range [0, ", kMaxTokenId, ")"));
    }
    return static_cast<int32_t>(id);
  }

  absl::StatusOr<std::string> RequiredString(const Json& obj, absl::string_view path,
                                             absl::string_view key) const {
    TRIDENT_ASSIGN_OR_RETURN(const Json* v, Required(obj, path, key));
    return String(*v, absl::StrCat(path, ".", key));
  }

  // An optional boolean member (absent or null: `default_value`).
  absl::StatusOr<bool> OptionalBool(const Json& obj, absl::string_view path, absl::string_view key,
                                    bool default_value) const {
    const Json* v = Optional(obj, key);
    if (v == nullptr) return default_value;
    return Bool(*v, absl::StrCat(path, ".", key));
  }

  absl::StatusOr<std::string> Type(const Json& obj, absl::string_view path) const {
    TRIDENT_RETURN_IF_ERROR(ExpectObject(obj, path));
    return RequiredString(obj, path, "type");
  }

  // A {"String": s} pattern; {"Regex": r} is unsupported.
  absl::StatusOr<std::string> StringPattern(const Json& obj, absl::string_view path) const {
    TRIDENT_ASSIGN_OR_RETURN(const Json* pattern, Required(obj, path, "pattern"));
    const std::string pattern_path = absl::StrCat(path, ".pattern");
    TRIDENT_RETURN_IF_ERROR(ExpectObject(*pattern, pattern_path));
    if (const Json* s = Optional(*pattern, "String")) return String(*s, pattern_path + ".String");
    if (Optional(*pattern, "Regex") != nullptr) {
      return Unsupported(pattern_path, "Regex patterns are not supported here");
    }
    return Invalid(pattern_path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

absl::Status ParseModel(const Parser& p, const Json& root, TokenizerData* d) {
  TRIDENT_ASSIGN_OR_RETURN(const Json* model, p.Required(root, "(root)", "model"));
  const std::string path = "model";
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*model, path));
  std::string type = "BPE";
  if (const Json* t = Parser::Optional(*model, "type")) {
    TRIDENT_ASSIGN_OR_RETURN(type, p.String(*t, path + ".type"));
  } else if (Parser::Optional(*model, "merges") == nullptr) {
    return p.Invalid(path, "missing field \"type\"");
  }
  if (type != "BPE") {
    return p.Unsupported(path + ".type", absl::StrCat("unsupported model type ", Quote(type),
                                                      " (only BPE is supported)"));
  }
  if (const Json* dropout = Parser::Optional(*model, "dropout")) {
    if (!dropout->is_number()) return p.Invalid(path + ".dropout", "expected a number or null");
    if (dropout->get<double>() != 0.0) {
      return p.Unsupported(path + ".dropout", "BPE dropout is not supported");
    }
  }
  for (absl::string_view affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = Parser::Optional(*model, affix)) {
      TRIDENT_ASSIGN_OR_RETURN(std::string s, p.String(*v, absl::StrCat(path, ".", affix)));
      if (!s.empty()) return p.Unsupported(absl::StrCat(path, ".", affix), "not supported");
    }
  }
  TRIDENT_ASSIGN_OR_RETURN(d->fuse_unk, p.OptionalBool(*model, path, "fuse_unk", false));
  TRIDENT_ASSIGN_OR_RETURN(d->byte_fallback, p.OptionalBool(*model, path, "byte_fallback", false));
  TRIDENT_ASSIGN_OR_RETURN(d->ignore_merges, p.OptionalBool(*model, path, "ignore_merges", false));

  TRIDENT_ASSIGN_OR_RETURN(const Json* vocab, p.Required(*model, path, "vocab"));
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*vocab, path + ".vocab"));
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string entry_path = absl::StrCat(path, ".vocab[", Quote(it.key()), "]");
    TRIDENT_ASSIGN_OR_RETURN(int32_t id, p.TokenId(it.value(), entry_path));
    d->vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  d->id_to_token.assign(max_id + 1, std::string());
  d->has_id.assign(max_id + 1, false);
  for (const auto& [token, id] : d->vocab) {
    if (d->has_id[id]) {
      const std::string& first = std::min(token, d->id_to_token[id]);
      const std::string& second = std::max(token, d->id_to_token[id]);
      return p.Invalid(path + ".vocab", absl::StrCat("tokens ", Quote(first), " and ",
                                                     Quote(second), " share id ", id));
    }
    d->has_id[id] = true;
    d->id_to_token[id] = token;
  }

  if (const Json* unk = Parser::Optional(*model, "unk_token")) {
    TRIDENT_ASSIGN_OR_RETURN(std::string unk_token, p.String(*unk, path + ".unk_token"));
    auto it = d->vocab.find(unk_token);
    if (it != d->vocab.end()) d->unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = d->vocab.find(absl::StrFormat("<0x%02X>", b));
    if (it != d->vocab.end()) d->byte_token_ids[b] = it->second;
  }

  TRIDENT_ASSIGN_OR_RETURN(const Json* merges, p.Required(*model, path, "merges"));
  if (!merges->is_array()) return p.Invalid(path + ".merges", "expected an array");
  d->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    const std::string merge_path = absl::StrCat(path, ".merges[", i, "]");
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return p.Invalid(merge_path, absl::StrCat("merge ", Quote(s), " is not \"a b\""));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return p.Invalid(merge_path, "expected \"a b\" or [\"a\", \"b\"]");
    }
    int32_t ids[3];
    const std::string parts[3] = {a, b, a + b};
    for (int k = 0; k < 3; ++k) {
      auto it = d->vocab.find(parts[k]);
      if (it == d->vocab.end()) {
        return p.Invalid(merge_path,
                         absl::StrCat("token ", Quote(parts[k]), " is not in the vocab"));
      }
      ids[k] = it->second;
    }
    const uint64_t key = (static_cast<uint64_t>(ids[0]) << 32) | static_cast<uint32_t>(ids[1]);
    d->merges[key] = {static_cast<int32_t>(i), ids[2]};  // A repeated pair keeps its last rank.
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Parser& p, const Json& root, TokenizerData* d) {
  const Json* added = Parser::Optional(root, "added_tokens");
  if (added == nullptr) return absl::OkStatus();
  if (!added->is_array()) return p.Invalid("added_tokens", "expected an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const Json& t = (*added)[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    TRIDENT_RETURN_IF_ERROR(p.ExpectObject(t, path));
    AddedToken token;
    TRIDENT_ASSIGN_OR_RETURN(const Json* id, p.Required(t, path, "id"));
    TRIDENT_ASSIGN_OR_RETURN(token.id, p.TokenId(*id, path + ".id"));
    TRIDENT_ASSIGN_OR_RETURN(token.content, p.RequiredString(t, path, "content"));
    TRIDENT_ASSIGN_OR_RETURN(token.special, p.OptionalBool(t, path, "special", false));
    TRIDENT_ASSIGN_OR_RETURN(token.lstrip, p.OptionalBool(t, path, "lstrip", false));
    TRIDENT_ASSIGN_OR_RETURN(token.rstrip, p.OptionalBool(t, path, "rstrip", false));
    TRIDENT_ASSIGN_OR_RETURN(token.single_word, p.OptionalBool(t, path, "single_word", false));
    TRIDENT_ASSIGN_OR_RETURN(token.normalized,
                             p.OptionalBool(t, path, "normalized", !token.special));
    if (d->added_by_id.contains(token.id)) {
      return p.Invalid(path + ".id", absl::StrCat("duplicate added token id ", token.id));
    }
    if (d->added_by_content.contains(token.content)) {
      return p.Invalid(path + ".content",
                       absl::StrCat("duplicate added token content ", Quote(token.content)));
    }
    d->added_by_id[token.id] = d->added.size();
    d->added_by_content[token.content] = d->added.size();
    if (token.special) d->special_contents.insert(token.content);
    d->added.push_back(std::move(token));
  }
  for (size_t i = 0; i < d->added.size(); ++i) {
    const AddedToken& t = d->added[i];
    if (t.content.empty()) continue;
    auto& index = t.normalized ? d->norm_by_byte : d->raw_by_byte;
    (t.normalized ? d->has_norm_added : d->has_raw_added) = true;
    index[static_cast<unsigned char>(t.content[0])].push_back(i);
  }
  for (auto* index : {&d->raw_by_byte, &d->norm_by_byte}) {
    for (auto& list : *index) {
      std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
        return d->added[a].content.size() > d->added[b].content.size();
      });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const Parser& p, const Json& obj,
                                                 const std::string& path) {
  if (const Json* scheme = Parser::Optional(obj, "prepend_scheme")) {
    TRIDENT_ASSIGN_OR_RETURN(std::string s, p.String(*scheme, path + ".prepend_scheme"));
    if (s == "first") return PrependScheme::kFirst;
    if (s == "always") return PrependScheme::kAlways;
    if (s == "never") return PrependScheme::kNever;
    return p.Invalid(path + ".prepend_scheme", absl::StrCat("unknown scheme ", Quote(s)));
  }
  // Files written before prepend_scheme existed carry add_prefix_space.
  TRIDENT_ASSIGN_OR_RETURN(bool add_prefix_space,
                           p.OptionalBool(obj, path, "add_prefix_space", true));
  return add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
}

absl::StatusOr<std::string> ParseReplacement(const Parser& p, const Json& obj,
                                             const std::string& path) {
  const Json* r = Parser::Optional(obj, "replacement");
  if (r == nullptr) return std::string(kMetaspaceDefault);
  TRIDENT_ASSIGN_OR_RETURN(std::string s, p.String(*r, path + ".replacement"));
  if (Utf8ToCodepoints(s).size() != 1) {
    return p.Invalid(path + ".replacement", "expected exactly one character");
  }
  return s;
}

// Parses each element of a Sequence node's `key` array with `parse`, one
// level deeper.
template <typename ParseFn>
absl::Status ParseSequence(const Parser& p, const Json& n, const std::string& path,
                           absl::string_view key, int depth, TokenizerData* d, ParseFn parse) {
  TRIDENT_ASSIGN_OR_RETURN(const Json* list, p.Required(n, path, key));
  const std::string list_path = absl::StrCat(path, ".", key);
  if (!list->is_array()) return p.Invalid(list_path, "expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    TRIDENT_RETURN_IF_ERROR(
        parse(p, (*list)[i], absl::StrCat(list_path, "[", i, "]"), depth + 1, d));
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const Parser& p, const Json& n, const std::string& path, int depth,
                             TokenizerData* d) {
  if (depth > kMaxDepth) return p.Invalid(path, "nested too deeply");
  TRIDENT_ASSIGN_OR_RETURN(std::string type, p.Type(n, path));
  if (type == "Sequence") {
    TRIDENT_RETURN_IF_ERROR(ParseSequence(p, n, path, "normalizers", depth, d, ParseNormalizer));
  } else if (type == "NFC") {
    d->normalizer.push_back({NormalizerStep::kNfc, "", ""});
  } else if (type == "Prepend") {
    TRIDENT_ASSIGN_OR_RETURN(std::string prefix, p.RequiredString(n, path, "prepend"));
    d->normalizer.push_back({NormalizerStep::kPrepend, prefix, ""});
  } else if (type == "Replace") {
    TRIDENT_ASSIGN_OR_RETURN(std::string pattern, p.StringPattern(n, path));
    TRIDENT_ASSIGN_OR_RETURN(std::string content, p.RequiredString(n, path, "content"));
    d->normalizer.push_back({NormalizerStep::kReplace, pattern, content});
  } else {
    return p.Unsupported(path + ".type", absl::StrCat("unsupported normalizer type ", Quote(type)));
  }
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Parser& p, const Json& n, const std::string& path, int depth,
                               TokenizerData* d) {
  if (depth > kMaxDepth) return p.Invalid(path, "nested too deeply");
  TRIDENT_ASSIGN_OR_RETURN(std::string type, p.Type(n, path));
  PreTokenizerStep step;
  if (type == "Sequence") {
    TRIDENT_RETURN_IF_ERROR(
        ParseSequence(p, n, path, "pretokenizers", depth, d, ParsePreTokenizer));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.op = PreTokenizerStep::kByteLevel;
    TRIDENT_ASSIGN_OR_RETURN(step.add_prefix_space,
                             p.OptionalBool(n, path, "add_prefix_space", true));
    TRIDENT_ASSIGN_OR_RETURN(step.use_regex, p.OptionalBool(n, path, "use_regex", true));
    d->kind = Tokenizer::Kind::kByteLevelBpe;
  } else if (type == "Split") {
    step.op = PreTokenizerStep::kSplit;
    TRIDENT_ASSIGN_OR_RETURN(const Json* pattern, p.Required(n, path, "pattern"));
    TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*pattern, path + ".pattern"));
    const Json* regex = Parser::Optional(*pattern, "Regex");
    if (regex == nullptr) {
      return p.Unsupported(path + ".pattern", "only Regex split patterns are supported");
    }
    TRIDENT_ASSIGN_OR_RETURN(std::string source, p.String(*regex, path + ".pattern.Regex"));
    absl::optional<SplitPattern> known = SplitPatternFromRegex(source);
    if (!known.has_value()) {
      return p.Unsupported(path + ".pattern.Regex",
                           absl::StrCat("unsupported pre-tokenizer pattern ", Quote(source)));
    }
    step.pattern = *known;
    TRIDENT_ASSIGN_OR_RETURN(std::string behavior, p.RequiredString(n, path, "behavior"));
    if (behavior != "Isolated") {
      return p.Unsupported(path + ".behavior",
                           absl::StrCat("unsupported split behavior ", Quote(behavior)));
    }
    TRIDENT_ASSIGN_OR_RETURN(bool invert, p.OptionalBool(n, path, "invert", false));
    if (invert) return p.Unsupported(path + ".invert", "inverted splits are not supported");
  } else if (type == "Metaspace") {
    step.op = PreTokenizerStep::kMetaspace;
    TRIDENT_ASSIGN_OR_RETURN(step.replacement, ParseReplacement(p, n, path));
    TRIDENT_ASSIGN_OR_RETURN(step.prepend_scheme, ParsePrependScheme(p, n, path));
    TRIDENT_ASSIGN_OR_RETURN(step.split, p.OptionalBool(n, path, "split", true));
  } else {
    return p.Unsupported(path + ".type",
                         absl::StrCat("unsupported pre-tokenizer type ", Quote(type)));
  }
  d->pre_tokenizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Parser& p, const Json& n, const std::string& path, int depth,
                                TokenizerData* d) {
  if (depth > kMaxDepth) return p.Invalid(path, "nested too deeply");
  TRIDENT_ASSIGN_OR_RETURN(std::string type, p.Type(n, path));
  if (type == "Sequence") {
    TRIDENT_RETURN_IF_ERROR(ParseSequence(p, n, path, "processors", depth, d, ParsePostProcessor));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // Only adjusts offsets.
  if (type != "TemplateProcessing") {
    return p.Unsupported(path + ".type",
                         absl::StrCat("unsupported post-processor type ", Quote(type)));
  }
  TRIDENT_ASSIGN_OR_RETURN(const Json* specials, p.Required(n, path, "special_tokens"));
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*specials, path + ".special_tokens"));
  TRIDENT_ASSIGN_OR_RETURN(const Json* single, p.Required(n, path, "single"));
  if (!single->is_array()) return p.Invalid(path + ".single", "expected an array");
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string piece_path = absl::StrCat(path, ".single[", i, "]");
    TRIDENT_RETURN_IF_ERROR(p.ExpectObject(piece, piece_path));
    if (const Json* seq = Parser::Optional(piece, "Sequence")) {
      TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*seq, piece_path + ".Sequence"));
      TRIDENT_ASSIGN_OR_RETURN(std::string id,
                               p.RequiredString(*seq, piece_path + ".Sequence", "id"));
      if (id != "A" || seen_sequence) {
        return p.Invalid(piece_path, "the single template must name sequence A exactly once");
      }
      seen_sequence = true;
    } else if (const Json* special = Parser::Optional(piece, "SpecialToken")) {
      TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*special, piece_path + ".SpecialToken"));
      TRIDENT_ASSIGN_OR_RETURN(std::string name,
                               p.RequiredString(*special, piece_path + ".SpecialToken", "id"));
      const Json* entry = Parser::Optional(*specials, name);
      const std::string entry_path = absl::StrCat(path, ".special_tokens[", Quote(name), "]");
      if (entry == nullptr) return p.Invalid(entry_path, "missing special token");
      TRIDENT_RETURN_IF_ERROR(p.ExpectObject(*entry, entry_path));
      TRIDENT_ASSIGN_OR_RETURN(const Json* ids, p.Required(*entry, entry_path, "ids"));
      if (!ids->is_array()) return p.Invalid(entry_path + ".ids", "expected an array");
      for (size_t k = 0; k < ids->size(); ++k) {
        TRIDENT_ASSIGN_OR_RETURN(int32_t id,
                                 p.TokenId((*ids)[k], absl::StrCat(entry_path, ".ids[", k, "]")));
        (seen_sequence ? suffix : prefix).push_back(id);
      }
    } else {
      return p.Invalid(piece_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) return p.Invalid(path + ".single", "sequence A is missing");
  // A later processor wraps the output of an earlier one.
  prefix.insert(prefix.end(), d->post_prefix.begin(), d->post_prefix.end());
  d->post_prefix = std::move(prefix);
  d->post_suffix.insert(d->post_suffix.end(), suffix.begin(), suffix.end());
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Parser& p, const Json& n, const std::string& path, int depth,
                          TokenizerData* d) {
  if (depth > kMaxDepth) return p.Invalid(path, "nested too deeply");
  TRIDENT_ASSIGN_OR_RETURN(std::string type, p.Type(n, path));
  DecoderStep step;
  if (type == "Sequence") {
    TRIDENT_RETURN_IF_ERROR(ParseSequence(p, n, path, "decoders", depth, d, ParseDecoder));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.op = DecoderStep::kByteLevel;
  } else if (type == "Metaspace") {
    step.op = DecoderStep::kMetaspace;
    TRIDENT_ASSIGN_OR_RETURN(step.a, ParseReplacement(p, n, path));
    TRIDENT_ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(p, n, path));
    step.prepend = scheme != PrependScheme::kNever;
  } else if (type == "Replace") {
    step.op = DecoderStep::kReplace;
    TRIDENT_ASSIGN_OR_RETURN(step.a, p.StringPattern(n, path));
    TRIDENT_ASSIGN_OR_RETURN(step.b, p.RequiredString(n, path, "content"));
  } else if (type == "ByteFallback") {
    step.op = DecoderStep::kByteFallback;
    d->decoder_has_byte_fallback = true;
  } else if (type == "Fuse") {
    step.op = DecoderStep::kFuse;
  } else if (type == "Strip") {
    step.op = DecoderStep::kStrip;
    TRIDENT_ASSIGN_OR_RETURN(step.a, p.RequiredString(n, path, "content"));
    if (Utf8ToCodepoints(step.a).size() != 1) {
      return p.Invalid(path + ".content", "expected exactly one character");
    }
    TRIDENT_ASSIGN_OR_RETURN(const Json* start, p.Required(n, path, "start"));
    TRIDENT_ASSIGN_OR_RETURN(step.start, p.Int(*start, path + ".start"));
    TRIDENT_ASSIGN_OR_RETURN(const Json* stop, p.Required(n, path, "stop"));
    TRIDENT_ASSIGN_OR_RETURN(step.stop, p.Int(*stop, path + ".stop"));
    if (step.start < 0 || step.stop < 0) return p.Invalid(path, "start and stop must be >= 0");
  } else {
    return p.Unsupported(path + ".type", absl::StrCat("unsupported decoder type ", Quote(type)));
  }
  d->decoder.push_back(std::move(step));
  return absl::OkStatus();
}

// bos_token / eos_token: a string or an AddedToken object {"content": ...}.
absl::StatusOr<absl::optional<std::string>> ConfigToken(const Parser& p, const Json& config,
                                                        absl::string_view key) {
  const Json* v = Parser::Optional(config, key);
  if (v == nullptr) return absl::optional<std::string>();
  if (v->is_string()) return absl::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    TRIDENT_ASSIGN_OR_RETURN(std::string content, p.RequiredString(*v, key, "content"));
    return absl::optional<std::string>(content);
  }
  return p.Invalid(key, "expected a string or an object with \"content\"");
}

absl::Status ParseConfig(absl::string_view config_json, const std::string& source, TokenizerData* d,
                         const Tokenizer& tokenizer) {
  const Parser p(source);
  Json config = Json::parse(config_json.begin(), config_json.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (config.is_discarded()) return p.Invalid("(root)", "not valid JSON");
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(config, "(root)"));
  TRIDENT_ASSIGN_OR_RETURN(absl::optional<std::string> bos, ConfigToken(p, config, "bos_token"));
  TRIDENT_ASSIGN_OR_RETURN(absl::optional<std::string> eos, ConfigToken(p, config, "eos_token"));
  if (bos.has_value()) d->bos_id = tokenizer.TokenToId(*bos);
  if (eos.has_value()) {
    if (absl::optional<int32_t> id = tokenizer.TokenToId(*eos)) d->eos_ids.push_back(*id);
  }
  TRIDENT_ASSIGN_OR_RETURN(d->config_add_bos,
                           p.OptionalBool(config, "(root)", "add_bos_token", false));
  TRIDENT_ASSIGN_OR_RETURN(d->config_add_eos,
                           p.OptionalBool(config, "(root)", "add_eos_token", false));
  return absl::OkStatus();
}

struct Segment {
  std::string text;
  int32_t added_id = -1;  // >= 0: an added token, already an id.
  bool at_start = false;  // Begins at offset 0 of the input.
};

bool IsWordChar(char32_t c) { return c == '_' || IsLetter(c) || IsNumber(c); }

// Last code point of `s` (well-formed, non-empty).
char32_t LastCodepoint(absl::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return Utf8ToCodepoints(s.substr(i))[0];
}

char32_t FirstCodepoint(absl::string_view s) {
  const size_t n = std::min<size_t>(Utf8SequenceLength(static_cast<unsigned char>(s[0])), s.size());
  return Utf8ToCodepoints(s.substr(0, n))[0];
}

// Splits `s` on the added tokens of `index` (leftmost-longest, as HF's
// Aho-Corasick matcher), honoring single_word / lstrip / rstrip.
void SplitOnAdded(const TokenizerData& d, const std::vector<std::vector<size_t>>& index,
                  const std::string& s, bool at_start, std::vector<Segment>* out) {
  size_t emitted = 0;  // Start of text not yet emitted.
  size_t pos = 0;      // Where the next match search starts.
  const auto emit_text = [&](size_t begin, size_t end) {
    if (end > begin) out->push_back({s.substr(begin, end - begin), -1, at_start && begin == 0});
  };
  while (pos < s.size()) {
    const AddedToken* match = nullptr;
    size_t start = pos;
    for (; start < s.size(); ++start) {
      for (size_t k : index[static_cast<unsigned char>(s[start])]) {
        const std::string& c = d.added[k].content;
        if (s.compare(start, c.size(), c) == 0) {
          match = &d.added[k];
          break;
        }
      }
      if (match != nullptr) break;
    }
    if (match == nullptr) break;
    size_t stop = start + match->content.size();
    pos = stop;
    if (match->single_word) {
      const bool word_before =
          start > 0 && IsWordChar(LastCodepoint(absl::string_view(s).substr(0, start)));
      const bool word_after =
          stop < s.size() && IsWordChar(FirstCodepoint(absl::string_view(s).substr(stop)));
      if (word_before || word_after) continue;
    }
    if (start < emitted) continue;  // Overlaps an rstrip extension.
    if (match->lstrip) {
      size_t new_start = start;
      while (new_start > emitted) {
        size_t prev = new_start - 1;
        while (prev > 0 && (static_cast<unsigned char>(s[prev]) & 0xC0) == 0x80) --prev;
        if (!IsWhiteSpace(Utf8ToCodepoints(absl::string_view(s).substr(prev, new_start - prev))[0]))
          break;
        new_start = prev;
      }
      start = new_start;
    }
    if (match->rstrip) {
      while (stop < s.size()) {
        const size_t n = std::min<size_t>(Utf8SequenceLength(static_cast<unsigned char>(s[stop])),
                                          s.size() - stop);
        if (!IsWhiteSpace(Utf8ToCodepoints(absl::string_view(s).substr(stop, n))[0])) break;
        stop += n;
      }
      pos = stop;
    }
    emit_text(emitted, start);
    out->push_back({"", match->id, false});
    emitted = stop;
  }
  emit_text(emitted, s.size());
}

std::string Normalize(const TokenizerData& d, std::string s) {
  for (const NormalizerStep& step : d.normalizer) {
    switch (step.op) {
      case NormalizerStep::kNfc:
        s = NfcNormalize(s);
        break;
      case NormalizerStep::kPrepend:
        if (!s.empty()) s = step.a + s;
        break;
      case NormalizerStep::kReplace:
        if (!step.a.empty()) s = absl::StrReplaceAll(s, {{step.a, step.b}});
        break;
    }
  }
  return s;
}

struct Piece {
  std::string text;
  bool at_start;
};

std::vector<Piece> PreTokenize(const TokenizerData& d, std::string text, bool at_start) {
  std::vector<Piece> pieces;
  pieces.push_back({std::move(text), at_start});
  for (const PreTokenizerStep& step : d.pre_tokenizer) {
    std::vector<Piece> next;
    for (Piece& piece : pieces) {
      switch (step.op) {
        case PreTokenizerStep::kByteLevel: {
          std::string s = std::move(piece.text);
          if (step.add_prefix_space && !absl::StartsWith(s, " ")) s.insert(0, " ");
          if (step.use_regex) {
            bool first = true;
            for (absl::string_view sub : SplitIsolated(SplitPattern::kGpt2, s)) {
              next.push_back({BytesToByteLevel(sub), first && piece.at_start});
              first = false;
            }
          } else {
            next.push_back({BytesToByteLevel(s), piece.at_start});
          }
          break;
        }
        case PreTokenizerStep::kSplit: {
          bool first = true;
          for (absl::string_view sub : SplitIsolated(step.pattern, piece.text)) {
            next.push_back({std::string(sub), first && piece.at_start});
            first = false;
          }
          break;
        }
        case PreTokenizerStep::kMetaspace: {
          std::string s = absl::StrReplaceAll(piece.text, {{" ", step.replacement}});
          const bool prepend = !absl::StartsWith(s, step.replacement) &&
                               (step.prepend_scheme == PrependScheme::kAlways ||
                                (step.prepend_scheme == PrependScheme::kFirst && piece.at_start));
          if (prepend) s.insert(0, step.replacement);
          if (!step.split) {
            next.push_back({std::move(s), piece.at_start});
            break;
          }
          // MergedWithNext: each replacement character starts a new piece.
          size_t begin = 0;
          bool first = true;
          for (size_t i = step.replacement.size(); i <= s.size(); ++i) {
            if (i == s.size() || s.compare(i, step.replacement.size(), step.replacement) == 0) {
              if (i > begin) {
                next.push_back({s.substr(begin, i - begin), first && piece.at_start});
                first = false;
              }
              begin = i;
              if (i == s.size()) break;
              i += step.replacement.size() - 1;
            }
          }
          break;
        }
      }
    }
    pieces.clear();
    for (Piece& p : next) {
      if (!p.text.empty()) pieces.push_back(std::move(p));
    }
  }
  return pieces;
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;  // Bytes; 0 once merged into its left neighbour.
};

struct MergeCandidate {
  int32_t pos;
  int32_t rank;
  int32_t new_id;
  // std::priority_queue pops the largest: the lowest rank, then the leftmost.
  bool operator<(const MergeCandidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

// HF's BPE::merge_word + Word::merge_all (without dropout).
std::vector<int32_t> BpeWord(const TokenizerData& d, absl::string_view word) {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, int32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, len});
  };
  absl::optional<std::pair<int32_t, int32_t>> unk;  // (id, len)
  size_t i = 0;
  while (i < word.size()) {
    const size_t n =
        std::min<size_t>(Utf8SequenceLength(static_cast<unsigned char>(word[i])), word.size() - i);
    const absl::string_view ch = word.substr(i, n);
    i += n;
    auto it = d.vocab.find(ch);
    if (it != d.vocab.end()) {
      if (unk.has_value()) {
        add(unk->first, unk->second);
        unk.reset();
      }
      add(it->second, static_cast<int32_t>(n));
      continue;
    }
    if (d.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && d.byte_token_ids[b] >= 0;
      if (all) {
        // HF adds the byte tokens without flushing a pending unk first.
        for (unsigned char b : ch) add(d.byte_token_ids[b], 1);
        continue;
      }
    }
    if (!d.unk_id.has_value()) continue;  // HF fails here; we drop the character.
    if (unk.has_value() && d.fuse_unk) {
      unk->second += static_cast<int32_t>(n);
    } else {
      if (unk.has_value()) add(unk->first, unk->second);
      unk = std::make_pair(*d.unk_id, static_cast<int32_t>(n));
    }
  }
  if (unk.has_value()) add(unk->first, unk->second);

  const auto find_merge = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = d.merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == d.merges.end() ? nullptr : &it->second;
  };
  std::priority_queue<MergeCandidate> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      queue.push({static_cast<int32_t>(k), m->first, m->second});
    }
  }
  while (!queue.empty()) {
    const MergeCandidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    const int32_t next_pos = left.next;
    const Symbol right = symbols[next_pos];
    const auto* m = find_merge(left.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* pm = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({left.prev, pm->first, pm->second});
      }
    }
    if (left.next >= 0) {
      if (const auto* nm = find_merge(left.id, symbols[left.next].id)) {
        queue.push({top.pos, nm->first, nm->second});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids.push_back(s.id);
  }
  return ids;
}

void Tokenize(const TokenizerData& d, const std::string& word, std::vector<int32_t>* out) {
  if (word.empty()) return;
  if (d.ignore_merges) {
    auto it = d.vocab.find(word);
    if (it != d.vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&d.cache_mu);
    auto it = d.cache.find(word);
    if (it != d.cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = BpeWord(d, word);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    absl::MutexLock lock(&d.cache_mu);
    if (d.cache.size() >= kMaxCacheEntries) d.cache.clear();
    d.cache.emplace(word, std::move(ids));
  }
}

bool IsByteToken(absl::string_view token, uint8_t* byte) {
  // HF: len 6, "<0x" .. ">", u8::from_str_radix(&token[3..5], 16).
  if (token.size() != 6 || !absl::StartsWith(token, "<0x") || token[5] != '>') return false;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (token[3] == '+') {  // Rust's from_str_radix accepts a leading '+'.
    const int lo = hex(token[4]);
    if (lo < 0) return false;
    *byte = static_cast<uint8_t>(lo);
    return true;
  }
  const int hi = hex(token[3]);
  const int lo = hex(token[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

void ApplyDecoder(const DecoderStep& step, bool at_start, std::vector<std::string>* tokens) {
  switch (step.op) {
    case DecoderStep::kByteLevel: {
      std::string bytes;
      for (const std::string& t : *tokens) {
        std::string mapped;
        bool ok = true;
        for (char32_t c : Utf8ToCodepoints(t)) {
          const int b = UnicodeToByte(c);
          if (b < 0) {
            ok = false;
            break;
          }
          mapped.push_back(static_cast<char>(b));
        }
        bytes += ok ? mapped : t;
      }
      tokens->assign(1, ReplaceInvalidUtf8(bytes));
      break;
    }
    case DecoderStep::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        const bool strip = i == 0 && at_start && step.prepend;
        (*tokens)[i] = absl::StrReplaceAll((*tokens)[i], {{step.a, strip ? "" : " "}});
      }
      break;
    case DecoderStep::kReplace:
      if (step.a.empty()) break;
      for (std::string& t : *tokens) t = absl::StrReplaceAll(t, {{step.a, step.b}});
      break;
    case DecoderStep::kByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      const auto flush = [&] {
        if (pending.empty()) return;
        if (IsValidUtf8(pending)) {
          out.push_back(pending);
        } else {
          for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (std::string& t : *tokens) {
        uint8_t b;
        if (IsByteToken(t, &b)) {
          pending.push_back(static_cast<char>(b));
          continue;
        }
        flush();
        out.push_back(std::move(t));
      }
      flush();
      *tokens = std::move(out);
      break;
    }
    case DecoderStep::kFuse:
      tokens->assign(1, absl::StrJoin(*tokens, ""));
      break;
    case DecoderStep::kStrip:
      for (size_t i = 0; i < tokens->size(); ++i) {
        std::string& t = (*tokens)[i];
        const int64_t start = (i == 0 && !at_start) ? 0 : step.start;
        size_t begin = 0;
        for (int64_t k = 0; k < start && absl::string_view(t).substr(begin).rfind(step.a, 0) == 0;
             ++k) {
          begin += step.a.size();
        }
        size_t end = t.size();
        for (int64_t k = 0; k < step.stop && end >= begin + step.a.size() &&
                            t.compare(end - step.a.size(), step.a.size(), step.a) == 0;
             ++k) {
          end -= step.a.size();
        }
        t = t.substr(begin, end - begin);
      }
      break;
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return contents.str();
}

}  // namespace
}  // namespace internal

using internal::Json;
using internal::TokenizerData;

Tokenizer::Tokenizer(std::unique_ptr<TokenizerData> data) : data_(std::move(data)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  const std::string json_path = dir + "/tokenizer.json";
  TRIDENT_ASSIGN_OR_RETURN(std::string json, internal::ReadFile(json_path));
  std::string config;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    TRIDENT_ASSIGN_OR_RETURN(config, internal::ReadFile(config_path));
  }
  return FromJson(json, config, json_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json,
    absl::string_view source_name) {
  const internal::Parser p{std::string(source_name)};
  Json root = Json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) return p.Invalid("(root)", "not valid JSON");
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(root, "(root)"));
  auto data = std::make_unique<TokenizerData>();
  TokenizerData* d = data.get();
  TRIDENT_RETURN_IF_ERROR(internal::ParseModel(p, root, d));
  TRIDENT_RETURN_IF_ERROR(internal::ParseAddedTokens(p, root, d));
  if (const Json* n = internal::Parser::Optional(root, "normalizer")) {
    TRIDENT_RETURN_IF_ERROR(internal::ParseNormalizer(p, *n, "normalizer", 0, d));
  }
  if (const Json* n = internal::Parser::Optional(root, "pre_tokenizer")) {
    d->has_pre_tokenizer = true;
    TRIDENT_RETURN_IF_ERROR(internal::ParsePreTokenizer(p, *n, "pre_tokenizer", 0, d));
  }
  if (const Json* n = internal::Parser::Optional(root, "post_processor")) {
    d->has_post_processor = true;
    TRIDENT_RETURN_IF_ERROR(internal::ParsePostProcessor(p, *n, "post_processor", 0, d));
  }
  if (const Json* n = internal::Parser::Optional(root, "decoder")) {
    d->has_decoder = true;
    TRIDENT_RETURN_IF_ERROR(internal::ParseDecoder(p, *n, "decoder", 0, d));
    for (const internal::DecoderStep& step : d->decoder) {
      if (step.op == internal::DecoderStep::kByteLevel) d->kind = Kind::kByteLevelBpe;
    }
  }
  int32_t max_id = static_cast<int32_t>(d->id_to_token.size()) - 1;
  for (const internal::AddedToken& t : d->added) max_id = std::max(max_id, t.id);
  d->vocab_size = max_id + 1;
  for (absl::Span<const int32_t> ids :
       {absl::MakeConstSpan(d->post_prefix), absl::MakeConstSpan(d->post_suffix)}) {
    for (int32_t id : ids) {
      if (id >= d->vocab_size) {
        return p.Invalid("post_processor",
                         absl::StrCat("special token id ", id, " is not in the vocabulary"));
      }
    }
  }

  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer(std::move(data)));
  if (!tokenizer_config_json.empty()) {
    TRIDENT_RETURN_IF_ERROR(
        internal::ParseConfig(tokenizer_config_json,
                              absl::StrCat(source_name, ": tokenizer_config.json"), d, *tokenizer));
  }
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool add_special_tokens) const {
  const TokenizerData& d = *data_;
  std::vector<int32_t> ids;
  std::vector<internal::Segment> raw;
  const std::string input = ReplaceInvalidUtf8(text);
  if (d.has_raw_added) {
    internal::SplitOnAdded(d, d.raw_by_byte, input, /*at_start=*/true, &raw);
  } else if (!input.empty()) {
    raw.push_back({input, -1, true});
  }
  for (internal::Segment& seg : raw) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    std::string normalized = internal::Normalize(d, std::move(seg.text));
    std::vector<internal::Segment> segs;
    if (d.has_norm_added) {
      internal::SplitOnAdded(d, d.norm_by_byte, normalized, seg.at_start, &segs);
    } else if (!normalized.empty()) {
      segs.push_back({std::move(normalized), -1, seg.at_start});
    }
    for (internal::Segment& s : segs) {
      if (s.added_id >= 0) {
        ids.push_back(s.added_id);
        continue;
      }
      for (const internal::Piece& piece : internal::PreTokenize(d, std::move(s.text), s.at_start)) {
        internal::Tokenize(d, piece.text, &ids);
      }
    }
  }
  if (add_special_tokens) {
    std::vector<int32_t> prefix, suffix;
    if (d.has_post_processor) {
      prefix = d.post_prefix;
      suffix = d.post_suffix;
    } else {
      if (d.config_add_bos && d.bos_id.has_value()) prefix.push_back(*d.bos_id);
      if (d.config_add_eos && !d.eos_ids.empty()) suffix.push_back(d.eos_ids[0]);
    }
    ids.insert(ids.begin(), prefix.begin(), prefix.end());
    ids.insert(ids.end(), suffix.begin(), suffix.end());
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  return DecodeWindow(ids, skip_special_tokens, /*at_start=*/true);
}

absl::StatusOr<std::string> Tokenizer::DecodeWindow(absl::Span<const int32_t> ids,
                                                    bool skip_special_tokens, bool at_start) const {
  const TokenizerData& d = *data_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    auto it = d.added_by_id.find(id);
    if (it != d.added_by_id.end()) {
      token = &d.added[it->second].content;
    } else if (id >= 0 && static_cast<size_t>(id) < d.has_id.size() && d.has_id[id]) {
      token = &d.id_to_token[id];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", d.vocab_size, ")"));
    }
    if (skip_special_tokens && d.special_contents.contains(*token)) continue;
    tokens.push_back(*token);
  }
  if (!d.has_decoder) return absl::StrJoin(tokens, " ");
  for (const internal::DecoderStep& step : d.decoder) {
    internal::ApplyDecoder(step, at_start, &tokens);
  }
  return absl::StrJoin(tokens, "");
}

bool Tokenizer::HoldsText(int32_t id, bool skip_special_tokens) const {
  const TokenizerData& d = *data_;
  const std::string* token = nullptr;
  auto it = d.added_by_id.find(id);
  if (it != d.added_by_id.end()) {
    token = &d.added[it->second].content;
  } else if (id >= 0 && static_cast<size_t>(id) < d.has_id.size() && d.has_id[id]) {
    token = &d.id_to_token[id];
  } else {
    return false;
  }
  if (skip_special_tokens && d.special_contents.contains(*token)) return true;
  uint8_t byte;
  return d.decoder_has_byte_fallback && internal::IsByteToken(*token, &byte);
}

int32_t Tokenizer::vocab_size() const { return data_->vocab_size; }
absl::optional<int32_t> Tokenizer::bos_token_id() const { return data_->bos_id; }
std::vector<int32_t> Tokenizer::eos_token_ids() const { return data_->eos_ids; }
Tokenizer::Kind Tokenizer::kind() const { return data_->kind; }

absl::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  auto added = data_->added_by_content.find(token);
  if (added != data_->added_by_content.end()) return data_->added[added->second].id;
  auto it = data_->vocab.find(token);
  if (it != data_->vocab.end()) return it->second;
  return absl::nullopt;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  auto it = data_->added_by_id.find(id);
  if (it != data_->added_by_id.end()) return data_->added[it->second].content;
  if (id >= 0 && static_cast<size_t>(id) < data_->has_id.size() && data_->has_id[id]) {
    return data_->id_to_token[id];
  }
  return std::string();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = data_->added_by_id.find(id);
  return it != data_->added_by_id.end() && data_->added[it->second].special;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                                       absl::Span<const int32_t> prompt_ids)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  std::vector<int32_t> valid;
  for (int32_t id : prompt_ids) {
    if (tokenizer.DecodeWindow(absl::MakeConstSpan(&id, 1), false, false).ok()) valid.push_back(id);
  }
  size_t start =
      valid.size() > internal::kPromptContextIds ? valid.size() - internal::kPromptContextIds : 0;
  // Never start the window inside a run of byte-fallback tokens.
  while (start > 0 && tokenizer.HoldsText(valid[start - 1], skip_special_tokens)) --start;
  window_at_start_ = start == 0;
  ids_.assign(valid.begin() + start, valid.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

absl::StatusOr<std::string> IncrementalDecoder::Push(int32_t id) {
  if (!tokenizer_.DecodeWindow(absl::MakeConstSpan(&id, 1), false, false).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is not in the vocabulary (size ", tokenizer_.vocab_size(), ")"));
  }
  ids_.push_back(id);
  if (tokenizer_.HoldsText(id, skip_special_tokens_)) return std::string();
  return Advance(/*force=*/false);
}

std::string IncrementalDecoder::Finish() { return Advance(/*force=*/true); }

std::string IncrementalDecoder::Advance(bool force) {
  const absl::Span<const int32_t> ids(ids_);
  const bool at_start = window_at_start_ && prefix_offset_ == 0;
  // Every id in ids_ was validated, so decoding cannot fail.
  const std::string prefix_text =
      tokenizer_
          .DecodeWindow(ids.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                        skip_special_tokens_, at_start)
          .value_or("");
  const std::string new_text =
      tokenizer_.DecodeWindow(ids.subspan(prefix_offset_), skip_special_tokens_, at_start)
          .value_or("");
  if (!force && absl::EndsWith(new_text, "\xEF\xBF\xBD")) return std::string();
  // The window's text normally extends the prefix's; if not (a prompt ending
  // in an incomplete character), emit what follows their common prefix.
  size_t common = 0;
  while (common < prefix_text.size() && common < new_text.size() &&
         prefix_text[common] == new_text[common]) {
    ++common;
  }
  while (common > 0 && common < new_text.size() &&
         (static_cast<unsigned char>(new_text[common]) & 0xC0) == 0x80) {
    --common;
  }
  std::string delta = new_text.substr(common);
  if (delta.empty() && !force) return delta;
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  // Drop ids before the window: they no longer affect the text.
  if (prefix_offset_ > 0) {
    ids_.erase(ids_.begin(), ids_.begin() + prefix_offset_);
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
    window_at_start_ = false;
  }
  return delta;
}

}  // namespace trident::tokenizer
