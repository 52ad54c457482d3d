#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/tokenizer_data.h"
#include "common/tokenizer/unicode.h"

namespace trident::tokenizer {
namespace internal {
namespace {

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
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<TokenizerData> data,
                           internal::ParseTokenizerJson(tokenizer_json, source_name));
  TokenizerData* d = data.get();
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
