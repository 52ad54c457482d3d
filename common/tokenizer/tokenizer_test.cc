#include "common/tokenizer/tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;
using Json = nlohmann::json;

constexpr char kSpm[] = "\xE2\x96\x81";  // ▁
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Id of byte `b` in a vocabulary that lists the 256 byte tokens first in
// GPT-2 order: '!'..'~' are 0..93, Ġ (space) is 220.
int32_t ByteId(uint8_t b) {
  const auto& order = ByteLevelOrder();
  for (int i = 0; i < 256; ++i) {
    if (order[i] == b) return i;
  }
  return -1;
}

std::string ByteChar(uint8_t b) {
  std::string s;
  AppendUtf8(ByteToUnicode(b), &s);
  return s;
}

Json Added(int id, const std::string& content, bool special = true) {
  return Json{{"id", id},          {"content", content}, {"single_word", false},
              {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
              {"special", special}};
}

// A Llama 3 style byte-level tokenizer with a handful of merges:
//   256 ll, 257 ell, 258 hell, 259 hello, 260 Ġw, 261 or, 262 Ġwor, 263 Ġworld (no merge)
// and special tokens <|begin_of_text|> = 300, <|eot_id|> = 301.
Json ByteLevelJson(bool ignore_merges) {
  Json vocab = Json::object();
  for (int i = 0; i < 256; ++i) vocab[ByteChar(ByteLevelOrder()[i])] = i;
  const std::string g = ByteChar(' ');
  vocab["ll"] = 256;
  vocab["ell"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab[g + "w"] = 260;
  vocab["or"] = 261;
  vocab[g + "wor"] = 262;
  vocab[g + "world"] = 263;
  Json merges = Json::array({"l l", "e ll", "h ell", "hell o", g + " w", "o r", g + "w or"});
  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", false}};
  Json bos_piece = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  Json seq_piece = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  return Json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", Json::array({Added(300, "<|begin_of_text|>"), Added(301, "<|eot_id|>")})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({Json{{"type", "Split"},
                                            {"pattern", {{"Regex", kLlama3Regex}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                       byte_level})}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors",
         Json::array({byte_level, Json{{"type", "TemplateProcessing"},
                                       {"single", Json::array({bos_piece, seq_piece})},
                                       {"pair", Json::array({bos_piece, seq_piece})},
                                       {"special_tokens",
                                        {{"<|begin_of_text|>",
                                          {{"id", "<|begin_of_text|>"},
                                           {"ids", {300}},
                                           {"tokens", {"<|begin_of_text|>"}}}}}}}})}}},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}}};
}

// A Llama 2 style tokenizer: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258,
//   259 ▁, 260 h, 261 e, 262 l, 263 o, 264 w, 265 r, 266 d,
//   267 ▁h, 268 ll, 269 ▁he, 270 ▁hell, 271 ▁hello, 272 ▁w, 273 or.
// `form` "normalizer": Prepend + Replace normalizer (Llama 2 / TinyLlama);
// "metaspace": Metaspace pre-tokenizer and decoder.
Json SentencePieceJson(const std::string& form, const std::string& prepend_scheme = "first",
                       bool split = false, bool byte_fallback = true) {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = 3 + b;
  const std::string s = kSpm;
  const std::vector<std::string> pieces = {s,        "h",        "e",         "l",     "o",
                                           "w",      "r",        "d",         s + "h", "ll",
                                           s + "he", s + "hell", s + "hello", s + "w", "or"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + static_cast<int>(i);
  Json merges =
      Json::array({Json::array({s, "h"}), Json::array({"l", "l"}), Json::array({s + "h", "e"}),
                   Json::array({s + "he", "ll"}), Json::array({s + "hell", "o"}),
                   Json::array({s, "w"}), Json::array({"o", "r"})});
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", Json::array({Added(0, "<unk>"), Added(1, "<s>"), Added(2, "</s>")})},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                      Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
              {"pair", Json::array()},
              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", true},
              {"byte_fallback", byte_fallback},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merges}}}};
  if (form == "normalizer") {
    j["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         Json::array({Json{{"type", "Prepend"}, {"prepend", s}},
                      Json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", s}}})}};
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", s}}}, {"content", " "}},
                      Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}},
                      Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  } else {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", s},
                          {"prepend_scheme", prepend_scheme},
                          {"split", split}};
    j["decoder"] = {{"type", "Metaspace"},
                    {"replacement", s},
                    {"prepend_scheme", prepend_scheme},
                    {"split", split}};
  }
  return j;
}

std::unique_ptr<Tokenizer> Load(const Json& j, const std::string& config = "") {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j.dump(), config, "test.json");
  EXPECT_THAT(t, IsOk());
  return t.ok() ? *std::move(t) : nullptr;
}

// ---------------------------------------------------------------- byte-level

TEST(ByteLevelBpeTest, MergesByRank) {
  auto t = Load(ByteLevelJson(/*ignore_merges=*/false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), Tokenizer::Kind::kByteLevelBpe);
  EXPECT_EQ(ByteId(' '), 220);
  EXPECT_THAT(t->Encode("hello world", false), ElementsAre(259, 262, ByteId('l'), ByteId('d')));
  EXPECT_THAT(t->Encode("hello world", true), ElementsAre(300, 259, 262, ByteId('l'), ByteId('d')));
  EXPECT_THAT(t->Encode("", true), ElementsAre(300));
  EXPECT_THAT(t->Encode("", false), ElementsAre());
}

TEST(ByteLevelBpeTest, IgnoreMergesEmitsWholeVocabWords) {
  auto t = Load(ByteLevelJson(/*ignore_merges=*/true));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello world", false), ElementsAre(259, 263));
  // " worl" is not in the vocab: merged as usual.
  EXPECT_THAT(t->Encode("hello worl", false), ElementsAre(259, 262, ByteId('l')));
}

TEST(ByteLevelBpeTest, SpecialTokensSplitFirstAndDecode) {
  auto t = Load(ByteLevelJson(true));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello<|eot_id|> world", false), ElementsAre(259, 301, 263));
  EXPECT_THAT(t->Encode("<|eot_id|><|eot_id", false),
              ElementsAre(301, ByteId('<'), ByteId('|'), ByteId('e'), ByteId('o'), ByteId('t'),
                          ByteId('_'), ByteId('i'), ByteId('d')));
  EXPECT_THAT(t->Decode({300, 259, 263, 301}, /*skip_special_tokens=*/false),
              IsOkAndHolds("<|begin_of_text|>hello world<|eot_id|>"));
  EXPECT_THAT(t->Decode({300, 259, 263, 301}, /*skip_special_tokens=*/true),
              IsOkAndHolds("hello world"));
  EXPECT_TRUE(t->IsSpecial(301));
  EXPECT_FALSE(t->IsSpecial(259));
  EXPECT_EQ(t->TokenToId("<|eot_id|>"), 301);
  EXPECT_EQ(t->TokenToId("hello"), 259);
  EXPECT_EQ(t->TokenToId("nope"), absl::nullopt);
  EXPECT_EQ(t->IdToToken(262), ByteChar(' ') + "wor");
  EXPECT_EQ(t->IdToToken(299), "");
  EXPECT_EQ(t->vocab_size(), 302);
}

TEST(ByteLevelBpeTest, InvalidUtf8BecomesReplacementCharacterBytes) {
  auto t = Load(ByteLevelJson(true));
  ASSERT_NE(t, nullptr);
  // "\xFF" -> U+FFFD = EF BF BD.
  const std::vector<int32_t> fffd = {ByteId(0xEF), ByteId(0xBF), ByteId(0xBD)};
  EXPECT_EQ(t->Encode("\xFF", false), fffd);
  EXPECT_EQ(t->Encode("\xEF\xBF\xBD", false), fffd);
  // A lone lead byte decodes to U+FFFD, as HF's from_utf8_lossy does.
  EXPECT_THAT(t->Decode({ByteId(0xE4)}, false), IsOkAndHolds("\xEF\xBF\xBD"));
  EXPECT_THAT(t->Decode({ByteId(0xE4), ByteId(0xB8), ByteId(0xAD)}, false),
              IsOkAndHolds("\xE4\xB8\xAD"));
}

TEST(ByteLevelBpeTest, DecodeRejectsUnknownIds) {
  auto t = Load(ByteLevelJson(true));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Decode({259, 5000}, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("5000")));
  EXPECT_THAT(t->Decode({-1}, false), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t->Decode({299}, false), StatusIs(absl::StatusCode::kInvalidArgument));  // A hole.
}

TEST(ByteLevelBpeTest, ConfigGivesBosAndEos) {
  auto t = Load(ByteLevelJson(true),
                R"({"bos_token": "<|begin_of_text|>",
                    "eos_token": {"content": "<|eot_id|>", "special": true},
                    "add_bos_token": true})");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos_token_id(), 300);
  EXPECT_THAT(t->eos_token_ids(), ElementsAre(301));
  auto no_config = Load(ByteLevelJson(true));
  ASSERT_NE(no_config, nullptr);
  EXPECT_EQ(no_config->bos_token_id(), absl::nullopt);
  EXPECT_TRUE(no_config->eos_token_ids().empty());
}

TEST(ByteLevelBpeTest, ConfigAddBosAppliesOnlyWithoutPostProcessor) {
  Json j = ByteLevelJson(true);
  j["post_processor"] = nullptr;
  auto t = Load(j, R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                      "add_bos_token": true, "add_eos_token": true})");
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello", true), ElementsAre(300, 259, 301));
  EXPECT_THAT(t->Encode("hello", false), ElementsAre(259));
}

TEST(ByteLevelBpeTest, Gpt2StylePreTokenizerWithPrefixSpace) {
  Json j = ByteLevelJson(false);
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  auto t = Load(j);
  ASSERT_NE(t, nullptr);
  // " world" after the prefix space; "world" alone gets one too.
  EXPECT_THAT(t->Encode("world", false), ElementsAre(262, ByteId('l'), ByteId('d')));
  EXPECT_THAT(t->Encode("hello", false), ElementsAre(ByteId(' '), 259));
}

// ------------------------------------------------------------- SentencePiece

TEST(SentencePieceBpeTest, NormalizerFormEncodesAndDecodes) {
  auto t = Load(SentencePieceJson("normalizer"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), Tokenizer::Kind::kSentencePieceBpe);
  EXPECT_THAT(t->Encode("hello world", false), ElementsAre(271, 272, 273, 262, 266));
  EXPECT_THAT(t->Encode("hello world", true), ElementsAre(1, 271, 272, 273, 262, 266));
  EXPECT_THAT(t->Decode({1, 271, 272, 273, 262, 266}, true), IsOkAndHolds("hello world"));
  EXPECT_THAT(t->Decode({1, 271, 272, 273, 262, 266}, false), IsOkAndHolds("<s> hello world"));
  // Strip removes exactly one leading space.
  EXPECT_THAT(t->Decode({259, 259, 271}, false), IsOkAndHolds("  hello"));
}

TEST(SentencePieceBpeTest, ByteFallback) {
  auto t = Load(SentencePieceJson("normalizer"));
  ASSERT_NE(t, nullptr);
  // é = C3 A9 -> <0xC3> = 198, <0xA9> = 172.
  EXPECT_THAT(t->Encode("h\xC3\xA9", false), ElementsAre(267, 198, 172));
  EXPECT_THAT(t->Decode({267, 198, 172}, false), IsOkAndHolds("h\xC3\xA9"));
  // Invalid byte runs decode to one U+FFFD per byte (HF ByteFallback).
  EXPECT_THAT(t->Decode({198}, false), IsOkAndHolds("\xEF\xBF\xBD"));
  EXPECT_THAT(t->Decode({198, 198, 260}, false), IsOkAndHolds("\xEF\xBF\xBD\xEF\xBF\xBDh"));
  EXPECT_THAT(t->Decode({3 + 0x41}, false), IsOkAndHolds("A"));
  // \n is not in the vocab: <0x0A>.
  EXPECT_THAT(t->Encode("h\nh", false), ElementsAre(267, 3 + 0x0A, 260));
}

TEST(SentencePieceBpeTest, UnknownWithoutByteFallbackFusesUnk) {
  auto t = Load(SentencePieceJson("normalizer", "first", false, /*byte_fallback=*/false));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("h\xC3\xA9\xC3\xA9h", false), ElementsAre(267, 0, 260));
  EXPECT_THAT(t->Decode({267, 0, 260}, false), IsOkAndHolds("h<unk>h"));
}

TEST(SentencePieceBpeTest, PrependAppliesToEachSegmentBetweenSpecialTokens) {
  auto t = Load(SentencePieceJson("normalizer"));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello</s>world", false), ElementsAre(271, 2, 272, 273, 262, 266));
  EXPECT_THAT(t->Encode("<s>hello", false), ElementsAre(1, 271));
  // "hello " -> "▁hello▁".
  EXPECT_THAT(t->Encode("hello </s>", false), ElementsAre(271, 259, 2));
}

TEST(SentencePieceBpeTest, MetaspaceForms) {
  auto first = Load(SentencePieceJson("metaspace", "first", false));
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(first->Encode("hello world", false), ElementsAre(271, 272, 273, 262, 266));
  // "first": only the segment at offset 0 gets the ▁.
  EXPECT_THAT(first->Encode("<s>hello", false), ElementsAre(1, 260, 261, 268, 263));
  EXPECT_THAT(first->Decode({271, 272, 273, 262, 266}, false), IsOkAndHolds("hello world"));

  auto always = Load(SentencePieceJson("metaspace", "always", true));
  ASSERT_NE(always, nullptr);
  EXPECT_THAT(always->Encode("<s>hello", false), ElementsAre(1, 271));
  EXPECT_THAT(always->Encode("hello world", false), ElementsAre(271, 272, 273, 262, 266));

  auto never = Load(SentencePieceJson("metaspace", "never", false));
  ASSERT_NE(never, nullptr);
  EXPECT_THAT(never->Encode("hello world", false),
              ElementsAre(260, 261, 268, 263, 272, 273, 262, 266));
  EXPECT_THAT(never->Decode({271}, false), IsOkAndHolds(" hello"));
}

TEST(AddedTokenTest, LstripRstripSingleWord) {
  Json j = SentencePieceJson("normalizer");
  Json mask = Added(274, "<mask>");
  mask["lstrip"] = true;
  mask["rstrip"] = true;
  Json word = Added(275, "hi", /*special=*/false);
  word["single_word"] = true;
  word["normalized"] = false;
  j["added_tokens"].push_back(mask);
  j["added_tokens"].push_back(word);
  auto t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello  <mask>  hello", false), ElementsAre(271, 274, 271));
  EXPECT_THAT(t->Encode("hi hello", false), ElementsAre(275, 259, 271));
  // Inside a word, "hi" is not a single word: normal BPE.
  EXPECT_THAT(t->Encode("ohi", false), ElementsAre(259, 263, 260, 3 + 0x69));
}

// ----------------------------------------------------------------- streaming

// Pushes `ids` one at a time; checks every delta is valid UTF-8 and returns
// their concatenation (Finish() included).
std::string Stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip,
                   std::vector<std::string>* deltas = nullptr) {
  IncrementalDecoder decoder(t, skip);
  std::string all;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> delta = decoder.Push(id);
    EXPECT_THAT(delta, IsOk());
    if (!delta.ok()) continue;
    EXPECT_TRUE(IsValidUtf8(*delta)) << absl::CEscape(*delta);
    if (deltas != nullptr) deltas->push_back(*delta);
    all += *delta;
  }
  const std::string rest = decoder.Finish();
  EXPECT_TRUE(IsValidUtf8(rest));
  if (deltas != nullptr) deltas->push_back(rest);
  return all + rest;
}

TEST(IncrementalDecoderTest, SentencePieceLeadingSpaceAndBytes) {
  auto t = Load(SentencePieceJson("normalizer"));
  ASSERT_NE(t, nullptr);
  std::vector<std::string> deltas;
  // <s> ▁hello ▁w or l d <0xC3> <0xA9> h
  EXPECT_EQ(Stream(*t, {1, 271, 272, 273, 262, 266, 198, 172, 260}, true, &deltas),
            "hello world\xC3\xA9h");
  EXPECT_THAT(deltas, ElementsAre("", "hello", " w", "or", "l", "d", "", "", "\xC3\xA9h", ""));
}

TEST(IncrementalDecoderTest, ByteLevelHoldsIncompleteCharacters) {
  auto t = Load(ByteLevelJson(true));
  ASSERT_NE(t, nullptr);
  std::vector<std::string> deltas;
  // 中 = E4 B8 AD, one byte token at a time, then "hello".
  EXPECT_EQ(Stream(*t, {ByteId(0xE4), ByteId(0xB8), ByteId(0xAD), 259}, false, &deltas),
            "\xE4\xB8\xADhello");
  EXPECT_THAT(deltas, ElementsAre("", "", "\xE4\xB8\xAD", "hello", ""));
  // An incomplete character at the end comes out of Finish() as U+FFFD.
  deltas.clear();
  EXPECT_EQ(Stream(*t, {259, ByteId(0xE4)}, false, &deltas), "hello\xEF\xBF\xBD");
  EXPECT_THAT(deltas, ElementsAre("hello", "", "\xEF\xBF\xBD"));
}

TEST(IncrementalDecoderTest, RejectsUnknownIds) {
  auto t = Load(ByteLevelJson(true));
  ASSERT_NE(t, nullptr);
  IncrementalDecoder decoder(*t, false);
  EXPECT_THAT(decoder.Push(100000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("100000")));
  EXPECT_THAT(decoder.Push(259), IsOkAndHolds("hello"));
}

TEST(IncrementalDecoderTest, ContinuesAPrompt) {
  auto t = Load(SentencePieceJson("normalizer"));
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> prompt = {1, 271, 272, 273, 262, 266, 271, 271};
  IncrementalDecoder decoder(*t, true, prompt);
  // The continuation keeps its leading space: the prompt precedes it.
  EXPECT_THAT(decoder.Push(271), IsOkAndHolds(" hello"));
  EXPECT_THAT(decoder.Push(260), IsOkAndHolds("h"));
  EXPECT_EQ(decoder.Finish(), "");
}

// Random id sequences (fixed seed), special tokens and byte tokens included:
// the deltas must concatenate to exactly Decode() of all ids.
TEST(IncrementalDecoderTest, RandomIdsConcatenateToDecode) {
  const uint32_t seed = 20240601;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (const Json& j : {ByteLevelJson(true), SentencePieceJson("normalizer"),
                        SentencePieceJson("metaspace", "first", true)}) {
    auto t = Load(j);
    ASSERT_NE(t, nullptr);
    std::vector<int32_t> valid;
    for (int32_t id = 0; id < t->vocab_size(); ++id) {
      if (t->Decode({id}, false).ok()) valid.push_back(id);
    }
    for (int round = 0; round < 300; ++round) {
      std::vector<int32_t> ids(rng() % 12);
      for (int32_t& id : ids) {
        // Bias toward byte tokens, where streaming is hardest.
        id = rng() % 2 == 0 ? valid[rng() % valid.size()]
                            : (t->kind() == Tokenizer::Kind::kByteLevelBpe
                                   ? ByteId(static_cast<uint8_t>(0x80 + rng() % 0x80))
                                   : 3 + static_cast<int32_t>(0x80 + rng() % 0x80));
      }
      for (bool skip : {false, true}) {
        absl::StatusOr<std::string> full = t->Decode(ids, skip);
        ASSERT_THAT(full, IsOk());
        EXPECT_EQ(Stream(*t, ids, skip), *full) << "round " << round << " skip " << skip;
      }
    }
  }
}

// ------------------------------------------------------------- bad tokenizers

TEST(FromJsonTest, MalformedInputNamesSourceAndPath) {
  EXPECT_THAT(Tokenizer::FromJson("{", "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x.json")));
  EXPECT_THAT(Tokenizer::FromJson("[]", "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected an object")));
  EXPECT_THAT(Tokenizer::FromJson("{}", "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"model\"")));

  Json j = ByteLevelJson(false);
  j["model"]["merges"].push_back("l zz");
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x.json: model.merges[7]: token \"zz\" is not in the vocab")));

  j = ByteLevelJson(false);
  j["model"]["merges"].push_back("nospace");
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.merges[7]")));

  j = ByteLevelJson(false);
  j["model"]["vocab"]["dup"] = 5;
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("share id 5")));

  j = ByteLevelJson(false);
  j["model"]["vocab"]["neg"] = -3;
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.vocab[\"neg\"]")));

  j = ByteLevelJson(false);
  j["model"]["vocab"]["str"] = "7";
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected an integer")));

  j = ByteLevelJson(false);
  j["added_tokens"].push_back(Added(300, "<|other|>"));
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("added_tokens[2].id: duplicate added token id 300")));

  j = ByteLevelJson(false);
  j["added_tokens"][0].erase("content");
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("added_tokens[0]: missing field \"content\"")));

  j = ByteLevelJson(false);
  j["post_processor"]["processors"][1]["special_tokens"].erase("<|begin_of_text|>");
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing special token")));

  EXPECT_THAT(
      Tokenizer::FromJson(ByteLevelJson(false).dump(), "{\"bos_token\": 3}", "x.json"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer_config.json: bos_token")));
  EXPECT_THAT(Tokenizer::FromJson(ByteLevelJson(false).dump(), "nope", "x.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer_config.json")));
}

TEST(FromJsonTest, UnsupportedComponentsAreFailedPrecondition) {
  Json j = ByteLevelJson(false);
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("WordPiece")));
  j["model"]["type"] = "Unigram";
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Unigram")));

  j = ByteLevelJson(false);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("unsupported pre-tokenizer pattern")));

  j = ByteLevelJson(false);
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Lowercase")));

  j = ByteLevelJson(false);
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "x.json"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("dropout")));
}

TEST(FromDirectoryTest, MissingDirectoryIsNotFound) {
  EXPECT_THAT(Tokenizer::FromDirectory("/nonexistent/dir"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tokenizer.json")));
}

TEST(NfcNormalizerTest, ComposesBeforeBpe) {
  Json j = ByteLevelJson(false);
  j["normalizer"] = {{"type", "NFC"}};
  auto nfc = Load(j);
  auto raw = Load(ByteLevelJson(false));
  ASSERT_NE(nfc, nullptr);
  ASSERT_NE(raw, nullptr);
  // e + U+0301 -> é (C3 A9): two byte tokens instead of three.
  EXPECT_THAT(nfc->Encode("e\xCC\x81", false), ElementsAre(ByteId(0xC3), ByteId(0xA9)));
  EXPECT_THAT(raw->Encode("e\xCC\x81", false),
              ElementsAre(ByteId('e'), ByteId(0xCC), ByteId(0x81)));
}

}  // namespace
}  // namespace trident::tokenizer
