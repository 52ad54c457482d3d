#include "tools/make_model/tokenizer_gen/tokenizer_gen.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
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
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_pattern.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace trident::make_model {
namespace {

using Json = nlohmann::ordered_json;
using tokenizer::SplitPattern;

constexpr char kCorpus[] =
#include "tools/make_model/tokenizer_gen/corpus.inc"
    ;

constexpr int32_t kMaxVocabSize = 1 << 20;
constexpr absl::string_view kSpm = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

struct SpecialToken {
  std::string content;
  int32_t id;
};

// A vocabulary under construction: token strings by id.
class Vocab {
 public:
  // Adds `token` if new; returns its id.
  int32_t Add(const std::string& token) {
    auto [it, inserted] = ids_.emplace(token, static_cast<int32_t>(tokens_.size()));
    if (inserted) tokens_.push_back(token);
    return it->second;
  }
  bool Contains(const std::string& token) const { return ids_.contains(token); }
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<std::string> tokens_;
};

// Classic BPE training. `words` maps each pre-tokenized word, as a sequence
// of initial symbols (empty string: a symbol that never merges), to its count.
// Adds merged tokens to `vocab` until it has `target_size` entries or no pair
// is left; returns the merges in order.
std::vector<std::pair<std::string, std::string>> LearnMerges(
    const std::map<std::vector<std::string>, int64_t>& words, int32_t target_size, Vocab* vocab) {
  // Symbols as ints; -1 never merges.
  std::vector<std::string> names;
  absl::flat_hash_map<std::string, int32_t> index;
  const auto intern = [&](const std::string& s) -> int32_t {
    if (s.empty()) return -1;
    auto [it, inserted] = index.emplace(s, static_cast<int32_t>(names.size()));
    if (inserted) names.push_back(s);
    return it->second;
  };
  std::vector<std::pair<std::vector<int32_t>, int64_t>> seqs;
  for (const auto& [symbols, count] : words) {
    std::vector<int32_t> seq;
    for (const std::string& s : symbols) seq.push_back(intern(s));
    seqs.emplace_back(std::move(seq), count);
  }
  // Pair counts, kept up to date incrementally, and the words holding each
  // pair (possibly stale: a word is re-examined when its pair is merged).
  const auto pair_key = [](int32_t a, int32_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  };
  absl::flat_hash_map<uint64_t, int64_t> counts;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> where;
  const auto count_word = [&](int32_t w, int64_t sign) {
    const auto& [seq, count] = seqs[w];
    for (size_t i = 0; i + 1 < seq.size(); ++i) {
      if (seq[i] < 0 || seq[i + 1] < 0) continue;
      const uint64_t key = pair_key(seq[i], seq[i + 1]);
      int64_t& c = counts[key];
      c += sign * count;
      if (c == 0) counts.erase(key);
      if (sign > 0) where[key].push_back(w);
    }
  };
  for (int32_t w = 0; w < static_cast<int32_t>(seqs.size()); ++w) count_word(w, +1);

  absl::flat_hash_set<uint64_t> banned;
  std::vector<std::pair<std::string, std::string>> merges;
  while (vocab->size() < target_size) {
    // The most frequent pair, ties to the lexicographically smallest; a pair
    // whose concatenation is already a token (a byte token such as "<0x41>",
    // or a string an earlier merge made) is never merged.
    const auto key = [&](uint64_t p) {
      return std::make_pair(absl::string_view(names[p >> 32]),
                            absl::string_view(names[static_cast<uint32_t>(p)]));
    };
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [pair, count] : counts) {
      if (count < best_count || (count == best_count && key(pair) > key(best))) continue;
      if (banned.contains(pair)) continue;
      if (vocab->Contains(absl::StrCat(names[pair >> 32], names[static_cast<uint32_t>(pair)]))) {
        banned.insert(pair);
        continue;
      }
      best = pair;
      best_count = count;
    }
    if (best_count == 0) break;
    const int32_t a = static_cast<int32_t>(best >> 32);
    const int32_t b = static_cast<int32_t>(static_cast<uint32_t>(best));
    const std::string merged = names[a] + names[b];
    merges.emplace_back(names[a], names[b]);
    vocab->Add(merged);
    const int32_t m = intern(merged);
    std::vector<int32_t> touched = std::move(where[best]);
    where.erase(best);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int32_t w : touched) {
      std::vector<int32_t>& seq = seqs[w].first;
      bool has = false;
      for (size_t i = 0; i + 1 < seq.size() && !has; ++i) has = seq[i] == a && seq[i + 1] == b;
      if (!has) continue;
      count_word(w, -1);
      std::vector<int32_t> next;
      next.reserve(seq.size());
      for (size_t i = 0; i < seq.size(); ++i) {
        if (i + 1 < seq.size() && seq[i] == a && seq[i + 1] == b) {
          next.push_back(m);
          ++i;
        } else {
          next.push_back(seq[i]);
        }
      }
      seq = std::move(next);
      count_word(w, +1);
    }
  }
  return merges;
}

std::vector<std::string> Utf8Chars(absl::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = std::min<size_t>(
        tokenizer::Utf8SequenceLength(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Json AddedTokenJson(const SpecialToken& t) {
  Json j;
  j["id"] = t.id;
  j["content"] = t.content;
  j["single_word"] = false;
  j["lstrip"] = false;
  j["rstrip"] = false;
  j["normalized"] = false;
  j["special"] = true;
  return j;
}

Json ByteLevelJson(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  Json j;
  j["type"] = "ByteLevel";
  j["add_prefix_space"] = add_prefix_space;
  j["trim_offsets"] = trim_offsets;
  j["use_regex"] = use_regex;
  return j;
}

Json SplitJson(SplitPattern pattern) {
  Json j;
  j["type"] = "Split";
  j["pattern"]["Regex"] = std::string(tokenizer::SplitPatternRegex(pattern));
  j["behavior"] = "Isolated";
  j["invert"] = false;
  return j;
}

Json TemplateJson(const SpecialToken& bos) {
  const auto special = [&](int type_id) {
    Json j;
    j["SpecialToken"]["id"] = bos.content;
    j["SpecialToken"]["type_id"] = type_id;
    return j;
  };
  const auto sequence = [](const char* id, int type_id) {
    Json j;
    j["Sequence"]["id"] = id;
    j["Sequence"]["type_id"] = type_id;
    return j;
  };
  Json j;
  j["type"] = "TemplateProcessing";
  j["single"] = Json::array({special(0), sequence("A", 0)});
  j["pair"] = Json::array({special(0), sequence("A", 0), special(1), sequence("B", 1)});
  Json entry;
  entry["id"] = bos.content;
  entry["ids"] = Json::array({bos.id});
  entry["tokens"] = Json::array({bos.content});
  j["special_tokens"][bos.content] = entry;
  return j;
}

Json ModelJson(const Vocab& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
               bool sentencepiece, bool ignore_merges) {
  Json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = sentencepiece ? Json("<unk>") : Json(nullptr);
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = sentencepiece;
  model["byte_fallback"] = sentencepiece;
  model["ignore_merges"] = ignore_merges;
  Json v = Json::object();
  for (int32_t id = 0; id < vocab.size(); ++id) v[vocab.tokens()[id]] = id;
  model["vocab"] = std::move(v);
  Json m = Json::array();
  for (const auto& [a, b] : merges) m.push_back(absl::StrCat(a, " ", b));
  model["merges"] = std::move(m);
  return model;
}

// Fills `vocab` up to `size` with tokens that no input can produce: neither a
// merge nor (for byte-level) a whole pre-tokenized word yields them.
void Pad(int32_t size, Vocab* vocab) {
  for (int32_t n = 0; vocab->size() < size; ++n) vocab->Add(absl::StrCat("<|pad_", n, "|>"));
}

Json ConfigJson(const std::vector<SpecialToken>& specials, const std::string& bos,
                const std::string& eos, const std::string& unk, const std::string& pad,
                int64_t max_length) {
  Json j;
  j["add_bos_token"] = !bos.empty();
  j["add_eos_token"] = false;
  Json decoder = Json::object();
  for (const SpecialToken& t : specials) {
    Json e;
    e["content"] = t.content;
    e["lstrip"] = false;
    e["normalized"] = false;
    e["rstrip"] = false;
    e["single_word"] = false;
    e["special"] = true;
    decoder[std::to_string(t.id)] = e;
  }
  j["added_tokens_decoder"] = decoder;
  j["bos_token"] = bos.empty() ? Json(nullptr) : Json(bos);
  j["clean_up_tokenization_spaces"] = false;
  j["eos_token"] = eos;
  j["model_max_length"] = max_length;
  j["pad_token"] = pad.empty() ? Json(nullptr) : Json(pad);
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (!unk.empty()) j["unk_token"] = unk;
  return j;
}

Json TokenizerJson(const std::vector<SpecialToken>& specials, Json normalizer, Json pre_tokenizer,
                   Json post_processor, Json decoder, Json model) {
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  Json added = Json::array();
  for (const SpecialToken& t : specials) added.push_back(AddedTokenJson(t));
  j["added_tokens"] = std::move(added);
  j["normalizer"] = std::move(normalizer);
  j["pre_tokenizer"] = std::move(pre_tokenizer);
  j["post_processor"] = std::move(post_processor);
  j["decoder"] = std::move(decoder);
  j["model"] = std::move(model);
  return j;
}

std::string Dump(const Json& j) { return j.dump(2, ' ', /*ensure_ascii=*/false) + "\n"; }

const std::vector<std::string>& Llama3Specials() {
  static const auto* const specials = new std::vector<std::string>{"<|begin_of_text|>",
                                                                   "<|end_of_text|>",
                                                                   "<|reserved_special_token_0|>",
                                                                   "<|reserved_special_token_1|>",
                                                                   "<|finetune_right_pad_id|>",
                                                                   "<|reserved_special_token_2|>",
                                                                   "<|start_header_id|>",
                                                                   "<|end_header_id|>",
                                                                   "<|eom_id|>",
                                                                   "<|eot_id|>",
                                                                   "<|python_tag|>"};
  return *specials;
}

const std::vector<std::string>& Qwen2Specials() {
  static const auto* const specials =
      new std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return *specials;
}

absl::StatusOr<GeneratedTokenizer> GenerateByteLevel(TokenizerStyle style, int32_t vocab_size) {
  const bool llama3 = style == TokenizerStyle::kLlama3;
  const SplitPattern pattern = llama3 ? SplitPattern::kLlama3 : SplitPattern::kQwen2;
  const std::vector<std::string>& special_names = llama3 ? Llama3Specials() : Qwen2Specials();
  const int32_t model_size = vocab_size - static_cast<int32_t>(special_names.size());

  std::string corpus(kCorpus);
  if (!llama3) corpus = tokenizer::NfcNormalize(corpus);
  std::map<std::vector<std::string>, int64_t> words;
  for (absl::string_view piece : tokenizer::SplitIsolated(pattern, corpus)) {
    ++words[Utf8Chars(tokenizer::BytesToByteLevel(piece))];
  }
  Vocab vocab;
  for (uint8_t b : tokenizer::ByteLevelOrder()) {
    std::string s;
    tokenizer::AppendUtf8(tokenizer::ByteToUnicode(b), &s);
    vocab.Add(s);
  }
  auto merges = LearnMerges(words, model_size, &vocab);
  Pad(model_size, &vocab);

  std::vector<SpecialToken> specials;
  for (const std::string& name : special_names) {
    specials.push_back({name, static_cast<int32_t>(model_size + specials.size())});
  }
  const auto id_of = [&](absl::string_view name) {
    for (const SpecialToken& t : specials) {
      if (t.content == name) return t.id;
    }
    return -1;
  };

  Json pre = Json::object();
  pre["type"] = "Sequence";
  pre["pretokenizers"] =
      Json::array({SplitJson(pattern), ByteLevelJson(false, /*trim_offsets=*/llama3, false)});
  GeneratedTokenizer out;
  out.vocab_size = vocab_size;
  if (llama3) {
    Json post;
    post["type"] = "Sequence";
    post["processors"] = Json::array({ByteLevelJson(true, false, true), TemplateJson(specials[0])});
    out.tokenizer_json =
        Dump(TokenizerJson(specials, nullptr, pre, post, ByteLevelJson(true, true, true),
                           ModelJson(vocab, merges, /*sentencepiece=*/false,
                                     /*ignore_merges=*/true)));
    out.tokenizer_config_json =
        Dump(ConfigJson(specials, "<|begin_of_text|>", "<|eot_id|>", "", "", 131072));
    out.bos_id = specials[0].id;
    out.eos_ids = {id_of("<|eot_id|>"), id_of("<|end_of_text|>"), id_of("<|eom_id|>")};
  } else {
    Json nfc;
    nfc["type"] = "NFC";
    out.tokenizer_json = Dump(TokenizerJson(
        specials, nfc, pre, ByteLevelJson(false, false, false), ByteLevelJson(false, false, false),
        ModelJson(vocab, merges, /*sentencepiece=*/false, /*ignore_merges=*/false)));
    out.tokenizer_config_json =
        Dump(ConfigJson(specials, "", "<|im_end|>", "", "<|endoftext|>", 32768));
    out.eos_ids = {id_of("<|im_end|>"), id_of("<|endoftext|>")};
  }
  return out;
}

absl::StatusOr<GeneratedTokenizer> GenerateLlama2(int32_t vocab_size) {
  const std::vector<SpecialToken> specials = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  Vocab vocab;
  for (const SpecialToken& t : specials) vocab.Add(t.content);
  for (int b = 0; b < 256; ++b) vocab.Add(absl::StrFormat("<0x%02X>", b));

  // The normalizer's view of the corpus: spaces become ▁ and one ▁ leads.
  const std::string text = absl::StrCat(kSpm, absl::StrReplaceAll(kCorpus, {{" ", kSpm}}));
  const std::vector<std::string> chars = Utf8Chars(text);
  // Alphabet: printable characters seen at least twice, most frequent first;
  // the rest (and control characters such as \n) go through byte fallback.
  std::map<std::string, int64_t> char_counts;
  for (const std::string& c : chars) {
    if (static_cast<unsigned char>(c[0]) >= 0x20) ++char_counts[c];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& [c, count] : char_counts) {
    if (count >= 2) ranked.emplace_back(-count, c);
  }
  std::sort(ranked.begin(), ranked.end());
  const int32_t alphabet_budget = vocab_size - vocab.size();
  for (const auto& [neg_count, c] : ranked) {
    if (vocab.size() - 259 >= alphabet_budget / 2 && c != kSpm) continue;
    vocab.Add(c);
  }
  // Words start at each ▁; characters outside the alphabet never merge.
  std::map<std::vector<std::string>, int64_t> words;
  std::vector<std::string> word;
  const auto flush = [&] {
    if (!word.empty()) ++words[word];
    word.clear();
  };
  for (const std::string& c : chars) {
    if (c == kSpm) flush();
    word.push_back(vocab.Contains(c) ? c : std::string());
  }
  flush();
  auto merges = LearnMerges(words, vocab_size, &vocab);
  Pad(vocab_size, &vocab);

  Json prepend;
  prepend["type"] = "Prepend";
  prepend["prepend"] = std::string(kSpm);
  Json replace;
  replace["type"] = "Replace";
  replace["pattern"]["String"] = " ";
  replace["content"] = std::string(kSpm);
  Json normalizer;
  normalizer["type"] = "Sequence";
  normalizer["normalizers"] = Json::array({prepend, replace});

  Json dec_replace;
  dec_replace["type"] = "Replace";
  dec_replace["pattern"]["String"] = std::string(kSpm);
  dec_replace["content"] = " ";
  Json byte_fallback;
  byte_fallback["type"] = "ByteFallback";
  Json fuse;
  fuse["type"] = "Fuse";
  Json strip;
  strip["type"] = "Strip";
  strip["content"] = " ";
  strip["start"] = 1;
  strip["stop"] = 0;
  Json decoder;
  decoder["type"] = "Sequence";
  decoder["decoders"] = Json::array({dec_replace, byte_fallback, fuse, strip});

  GeneratedTokenizer out;
  out.vocab_size = vocab_size;
  out.tokenizer_json =
      Dump(TokenizerJson(specials, normalizer, nullptr, TemplateJson(specials[1]), decoder,
                         ModelJson(vocab, merges, /*sentencepiece=*/true,
                                   /*ignore_merges=*/false)));
  out.tokenizer_config_json = Dump(ConfigJson(specials, "<s>", "</s>", "<unk>", "", 2048));
  out.bos_id = 1;
  out.eos_ids = {2};
  return out;
}

}  // namespace

absl::string_view TokenizerStyleName(TokenizerStyle style) {
  switch (style) {
    case TokenizerStyle::kLlama3:
      return "llama3";
    case TokenizerStyle::kQwen2:
      return "qwen2";
    case TokenizerStyle::kLlama2:
      return "llama2";
  }
  return "unknown";
}

absl::StatusOr<TokenizerStyle> ParseTokenizerStyle(absl::string_view name) {
  for (TokenizerStyle s :
       {TokenizerStyle::kLlama3, TokenizerStyle::kQwen2, TokenizerStyle::kLlama2}) {
    if (name == TokenizerStyleName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tokenizer style \"", name, "\" (expected llama3, qwen2 or llama2)"));
}

int32_t MinVocabSize(TokenizerStyle style) {
  switch (style) {
    case TokenizerStyle::kLlama3:
      return 256 + static_cast<int32_t>(Llama3Specials().size()) + 16;
    case TokenizerStyle::kQwen2:
      return 256 + static_cast<int32_t>(Qwen2Specials().size()) + 16;
    case TokenizerStyle::kLlama2:
      return 259 + 64;
  }
  return 0;
}

absl::StatusOr<GeneratedTokenizer> GenerateTokenizer(TokenizerStyle style, int32_t vocab_size) {
  if (vocab_size < MinVocabSize(style) || vocab_size > kMaxVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " for tokenizer style ", TokenizerStyleName(style),
                     " must be in [", MinVocabSize(style), ", ", kMaxVocabSize, "]"));
  }
  if (style == TokenizerStyle::kLlama2) return GenerateLlama2(vocab_size);
  return GenerateByteLevel(style, vocab_size);
}

absl::Status WriteTokenizerFiles(const GeneratedTokenizer& tokenizer, const std::string& dir) {
  for (const auto& [name, contents] :
       {std::make_pair("tokenizer.json", &tokenizer.tokenizer_json),
        std::make_pair("tokenizer_config.json", &tokenizer.tokenizer_config_json)}) {
    const std::string path = absl::StrCat(dir, "/", name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << *contents;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::string_view TrainingCorpus() { return kCorpus; }

}  // namespace trident::make_model
