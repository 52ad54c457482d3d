#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/split_pattern.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_data.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

// tokenizer.json and tokenizer_config.json into TokenizerData, every
// rejection naming the field.

namespace trident::tokenizer::internal {
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

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerData>> ParseTokenizerJson(absl::string_view tokenizer_json,
                                                                  absl::string_view source) {
  const Parser p{std::string(source)};
  Json root = Json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) return p.Invalid("(root)", "not valid JSON");
  TRIDENT_RETURN_IF_ERROR(p.ExpectObject(root, "(root)"));
  auto data = std::make_unique<TokenizerData>();
  TokenizerData* d = data.get();
  TRIDENT_RETURN_IF_ERROR(ParseModel(p, root, d));
  TRIDENT_RETURN_IF_ERROR(ParseAddedTokens(p, root, d));
  if (const Json* n = Parser::Optional(root, "normalizer")) {
    TRIDENT_RETURN_IF_ERROR(ParseNormalizer(p, *n, "normalizer", 0, d));
  }
  if (const Json* n = Parser::Optional(root, "pre_tokenizer")) {
    d->has_pre_tokenizer = true;
    TRIDENT_RETURN_IF_ERROR(ParsePreTokenizer(p, *n, "pre_tokenizer", 0, d));
  }
  if (const Json* n = Parser::Optional(root, "post_processor")) {
    d->has_post_processor = true;
    TRIDENT_RETURN_IF_ERROR(ParsePostProcessor(p, *n, "post_processor", 0, d));
  }
  if (const Json* n = Parser::Optional(root, "decoder")) {
    d->has_decoder = true;
    TRIDENT_RETURN_IF_ERROR(ParseDecoder(p, *n, "decoder", 0, d));
    for (const DecoderStep& step : d->decoder) {
      if (step.op == DecoderStep::kByteLevel) d->kind = Tokenizer::Kind::kByteLevelBpe;
    }
  }
  int32_t max_id = static_cast<int32_t>(d->id_to_token.size()) - 1;
  for (const AddedToken& t : d->added) max_id = std::max(max_id, t.id);
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
  return data;
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

}  // namespace trident::tokenizer::internal
