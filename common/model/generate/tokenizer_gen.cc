#include "common/model/generate/tokenizer_gen.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace trident::model::generate {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kMetaspace[] = "\xe2\x96\x81";  // U+2581

std::string Utf8(uint32_t cp) {
  std::string out;
  tokenizer::AppendUtf8(static_cast<char32_t>(cp), &out);
  return out;
}

// GPT-2's byte -> printable character map.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<std::string> map(256);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xa1; b <= 0xac; ++b) direct[b] = true;
  for (int b = 0xae; b <= 0xff; ++b) direct[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    map[b] = Utf8(direct[b] ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
  }
  return map;
}

// Splits UTF-8 text into characters (invalid bytes become single units).
std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > s.size()) len = 1;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

enum class Cls { kLetter, kDigit, kSpace, kOther };
Cls Classify(unsigned char c) {
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::kLetter;
  if (c >= '0' && c <= '9') return Cls::kDigit;
  if (c == ' ' || c == '\n' || c == '\t' || c == '\r') return Cls::kSpace;
  return Cls::kOther;
}

// An approximation of the GPT-2 style split, good enough to learn merges
// (merges are valid whatever words they were learned from).
std::vector<std::string> ByteLevelWords(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() &&
        Classify(static_cast<unsigned char>(text[j + 1])) != Cls::kSpace) {
      ++j;
    }
    const Cls cls = Classify(static_cast<unsigned char>(text[j]));
    size_t k = j + 1;
    size_t limit = cls == Cls::kDigit ? j + 3 : text.size();
    while (k < text.size() && k < limit && Classify(static_cast<unsigned char>(text[k])) == cls)
      ++k;
    words.push_back(text.substr(i, k - i));
    i = k;
  }
  return words;
}

struct Trainer {
  // word (as symbols) -> count
  std::map<std::vector<std::string>, int64_t> words;
  std::set<std::string> vocab_set;
  std::vector<std::string> vocab;  // in id order (learned tokens only)
  std::vector<std::pair<std::string, std::string>> merges;

  void Learn(size_t max_tokens, const std::set<std::string>& mergeable_base) {
    while (vocab.size() < max_tokens) {
      std::map<std::pair<std::string, std::string>, int64_t> counts;
      for (const auto& [w, n] : words) {
        for (size_t i = 0; i + 1 < w.size(); ++i) {
          if (!mergeable_base.empty() && (!vocab_set.count(w[i]) || !vocab_set.count(w[i + 1]))) {
            continue;
          }
          counts[{w[i], w[i + 1]}] += n;
        }
      }
      std::pair<std::string, std::string> best;
      int64_t best_count = 1;
      for (const auto& [pair, n] : counts) {
        // Ties go to the lexicographically smallest pair (map order).
        if (n > best_count && !vocab_set.count(pair.first + pair.second)) {
          best = pair;
          best_count = n;
        }
      }
      if (best_count < 2) break;
      const std::string merged = best.first + best.second;
      merges.push_back(best);
      vocab.push_back(merged);
      vocab_set.insert(merged);
      std::map<std::vector<std::string>, int64_t> next;
      for (const auto& [w, n] : words) {
        std::vector<std::string> out;
        for (size_t i = 0; i < w.size(); ++i) {
          if (i + 1 < w.size() && w[i] == best.first && w[i + 1] == best.second) {
            out.push_back(merged);
            ++i;
          } else {
            out.push_back(w[i]);
          }
        }
        next[out] += n;
      }
      words = std::move(next);
    }
  }
};

Json AddedToken(int32_t id, const std::string& content, bool special) {
  Json t;
  t["id"] = id;
  t["content"] = content;
  t["single_word"] = false;
  t["lstrip"] = false;
  t["rstrip"] = false;
  t["normalized"] = false;
  t["special"] = special;
  return t;
}

Json BosTemplate(const std::string& bos, int32_t bos_id) {
  Json single = Json::array();
  single.push_back({{"SpecialToken", {{"id", bos}, {"type_id", 0}}}});
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  Json pair = single;
  pair.push_back({{"SpecialToken", {{"id", bos}, {"type_id", 1}}}});
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  Json p;
  p["type"] = "TemplateProcessing";
  p["single"] = single;
  p["pair"] = pair;
  p["special_tokens"] = {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}};
  return p;
}

Json ModelJson(const Json& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
               bool sentencepiece, bool ignore_merges) {
  Json m;
  m["type"] = "BPE";
  m["dropout"] = nullptr;
  m["unk_token"] = sentencepiece ? Json("<unk>") : Json(nullptr);
  m["continuing_subword_prefix"] = nullptr;
  m["end_of_word_suffix"] = nullptr;
  m["fuse_unk"] = sentencepiece;
  m["byte_fallback"] = sentencepiece;
  m["ignore_merges"] = ignore_merges;
  m["vocab"] = vocab;
  Json ms = Json::array();
  for (const auto& [a, b] : merges) ms.push_back(a + " " + b);
  m["merges"] = ms;
  return m;
}

Json TokenizerConfig(const std::string& bos, const std::string& eos, bool add_bos) {
  Json c;
  c["add_bos_token"] = add_bos;
  c["add_eos_token"] = false;
  c["bos_token"] = bos.empty() ? Json(nullptr) : Json(bos);
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = eos;
  c["model_max_length"] = 131072;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  return c;
}

absl::StatusOr<GeneratedTokenizer> ByteLevel(TokenizerStyle style, int32_t vocab_size) {
  const bool llama3 = style == TokenizerStyle::kLlama3;
  const std::vector<std::string> specials =
      llama3 ? std::vector<std::string>{"<|begin_of_text|>",
                                        "<|end_of_text|>",
                                        "<|reserved_special_token_0|>",
                                        "<|reserved_special_token_1|>",
                                        "<|start_header_id|>",
                                        "<|end_header_id|>",
                                        "<|eot_id|>"}
             : std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int32_t base = 256 + static_cast<int32_t>(specials.size());
  if (vocab_size < base + 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer vocab_size must be > ", base));
  }
  const std::vector<std::string> alphabet = ByteLevelAlphabet();
  Trainer trainer;
  for (const std::string& a : alphabet) trainer.vocab_set.insert(a);
  for (const std::string& word : ByteLevelWords(TrainingCorpus())) {
    std::vector<std::string> symbols;
    for (unsigned char c : word) symbols.push_back(alphabet[c]);
    trainer.words[symbols] += 1;
  }
  trainer.Learn(static_cast<size_t>(vocab_size - base), {});

  GeneratedTokenizer out;
  std::map<std::string, std::string> char_to_byte;
  for (int b = 0; b < 256; ++b) char_to_byte[alphabet[b]] = std::string(1, static_cast<char>(b));
  auto bytes_of = [&](const std::string& token) {
    std::string bytes;
    for (const std::string& ch : Chars(token)) bytes += char_to_byte[ch];
    return bytes;
  };
  Json vocab = Json::object();
  int32_t id = 0;
  for (const std::string& a : alphabet) {
    if (!tokenizer::IsValidUtf8(bytes_of(a))) out.partial_utf8_ids.push_back(id);
    vocab[a] = id++;
  }
  for (const std::string& t : trainer.vocab) {
    if (!tokenizer::IsValidUtf8(bytes_of(t))) out.partial_utf8_ids.push_back(id);
    vocab[t] = id++;
  }
  Json added = Json::array();
  std::map<std::string, int32_t> special_ids;
  for (const std::string& s : specials) {
    special_ids[s] = id;
    added.push_back(AddedToken(id++, s, true));
  }
  out.vocab_size = id;

  Json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = llama3 ? Json(nullptr) : Json({{"type", "NFC"}});
  Json split;
  split["type"] = "Split";
  split["pattern"] = {{"Regex", llama3 ? kLlama3Pattern : kQwen2Pattern}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  Json byte_level;
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = true;
  byte_level["use_regex"] = false;
  tok["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
  if (llama3) {
    out.bos_id = special_ids["<|begin_of_text|>"];
    out.eos_ids = {special_ids["<|end_of_text|>"], special_ids["<|eot_id|>"]};
    tok["post_processor"] = BosTemplate("<|begin_of_text|>", out.bos_id);
  } else {
    out.eos_ids = {special_ids["<|endoftext|>"]};
    Json pp;
    pp["type"] = "ByteLevel";
    pp["add_prefix_space"] = false;
    pp["trim_offsets"] = false;
    pp["use_regex"] = false;
    tok["post_processor"] = pp;
  }
  Json decoder;
  decoder["type"] = "ByteLevel";
  decoder["add_prefix_space"] = true;
  decoder["trim_offsets"] = true;
  decoder["use_regex"] = true;
  tok["decoder"] = decoder;
  tok["model"] = ModelJson(vocab, trainer.merges, false, llama3);
  out.tokenizer_json = tok.dump(2) + "\n";
  out.tokenizer_config_json =
      (llama3 ? TokenizerConfig("<|begin_of_text|>", "<|end_of_text|>", true)
              : TokenizerConfig("", "<|endoftext|>", false))
          .dump(2) +
      "\n";
  return out;
}

absl::StatusOr<GeneratedTokenizer> SentencePiece(int32_t vocab_size) {
  // Text as SentencePiece sees it: spaces become U+2581, one is prepended.
  std::string text;
  std::vector<std::string> words;
  {
    std::string current = kMetaspace;
    for (const std::string& ch : Chars(TrainingCorpus())) {
      if (ch == " " || ch == "\n") {
        if (current != kMetaspace) words.push_back(current);
        current = kMetaspace;
        if (ch == "\n") words.push_back("\n");
      } else {
        current += ch;
      }
    }
    if (current != kMetaspace) words.push_back(current);
  }
  // Base pieces: characters seen at least 3 times; rarer ones fall back to
  // <0xNN> byte tokens.
  std::map<std::string, int64_t> char_counts;
  for (const std::string& w : words) {
    for (const std::string& ch : Chars(w)) ++char_counts[ch];
  }
  std::vector<std::string> base_chars;
  for (const auto& [ch, n] : char_counts) {
    if (n >= 3) base_chars.push_back(ch);
  }
  const int32_t fixed = 3 + 256 + static_cast<int32_t>(base_chars.size());
  if (vocab_size < fixed + 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer vocab_size must be > ", fixed));
  }
  Trainer trainer;
  std::set<std::string> base_set(base_chars.begin(), base_chars.end());
  trainer.vocab_set = base_set;
  for (const std::string& w : words) trainer.words[Chars(w)] += 1;
  trainer.Learn(static_cast<size_t>(vocab_size - fixed), base_set);

  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  int32_t id = 3;
  GeneratedTokenizer out;
  for (int b = 0; b < 256; ++b) {
    if (b >= 0x80) out.partial_utf8_ids.push_back(id);
    vocab[absl::StrFormat("<0x%02X>", b)] = id++;
  }
  for (const std::string& c : base_chars) vocab[c] = id++;
  for (const std::string& t : trainer.vocab) vocab[t] = id++;

  out.vocab_size = id;
  out.bos_id = 1;
  out.eos_ids = {2};
  Json added = Json::array();
  added.push_back(AddedToken(0, "<unk>", true));
  added.push_back(AddedToken(1, "<s>", true));
  added.push_back(AddedToken(2, "</s>", true));

  Json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kMetaspace}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}}}}};
  tok["pre_tokenizer"] = nullptr;
  tok["post_processor"] = BosTemplate("<s>", 1);
  tok["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  tok["model"] = ModelJson(vocab, trainer.merges, true, false);
  out.tokenizer_json = tok.dump(2) + "\n";
  out.tokenizer_config_json = TokenizerConfig("<s>", "</s>", true).dump(2) + "\n";
  return out;
}

}  // namespace

absl::StatusOr<GeneratedTokenizer> GenerateTokenizer(TokenizerStyle style, int32_t vocab_size) {
  if (style == TokenizerStyle::kLlama2) return SentencePiece(vocab_size);
  return ByteLevel(style, vocab_size);
}

}  // namespace trident::model::generate
