// Hugging Face `tokenizer.json` tokenizers (BPE models) in C++: byte-level BPE
// as in GPT-2 / Llama 3 / Qwen2, and SentencePiece-style BPE with byte
// fallback as in Llama 2 / TinyLlama / Mistral. Encoding and decoding follow
// the semantics of the Rust `tokenizers` library (added tokens, normalizer,
// pre-tokenizer, model, post-processor, decoder), so ids match what
// `tokenizers.Tokenizer.from_file(...).encode(text)` returns.
//
//   TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
//                            Tokenizer::FromDirectory(model_dir));
//   std::vector<int32_t> ids = tok->Encode("Hello world", /*add_special_tokens=*/true);
//   TRIDENT_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids, /*skip_special_tokens=*/true));
//
// Supported components (anything else is kFailedPrecondition at load):
//   normalizer:     null, NFC, Prepend, Replace (String pattern), Sequence
//   pre_tokenizer:  null, ByteLevel, Split (the GPT-2, Llama 3 and Qwen2 regexes,
//                   behavior Isolated), Metaspace, Sequence
//   model:          BPE (byte_fallback, fuse_unk, unk_token, ignore_merges)
//   post_processor: null, TemplateProcessing (single), ByteLevel, Sequence
//   decoder:        null, ByteLevel, Metaspace, Replace (String pattern),
//                   ByteFallback, Fuse, Strip, Sequence

#ifndef TRIDENT_COMMON_TOKENIZER_TOKENIZER_H_
#define TRIDENT_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"

namespace trident::tokenizer {

namespace internal {
struct TokenizerData;
}  // namespace internal

// Thread-safe: all methods are const; the per-word BPE cache is locked.
class Tokenizer {
 public:
  enum class Kind { kByteLevelBpe, kSentencePieceBpe };

  // Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  // kNotFound if tokenizer.json is missing; otherwise as FromJson.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);

  // Parses the contents of tokenizer.json and (may be empty) tokenizer_config.json.
  // kInvalidArgument for malformed JSON or structure, naming `source_name` and
  // the JSON path; kFailedPrecondition for well-formed but unsupported
  // components (e.g. a WordPiece or Unigram model, an unknown split regex).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view tokenizer_json, absl::string_view tokenizer_config_json,
      absl::string_view source_name);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. Invalid UTF-8 in `text` is first replaced with U+FFFD
  // as Python's bytes.decode("utf-8", errors="replace") does. With
  // `add_special_tokens`, applies the post-processor (e.g. the BOS prefix of
  // TemplateProcessing); if tokenizer.json has no post-processor,
  // tokenizer_config.json's add_bos_token / add_eos_token apply instead.
  // Characters that neither the vocabulary, byte fallback nor an unk token can
  // represent are dropped (HF reports an error there).
  std::vector<int32_t> Encode(absl::string_view text, bool add_special_tokens) const;

  // Text of `ids` through the decoder (HF `decode` semantics; ill-formed bytes
  // become U+FFFD as HF does). kInvalidArgument naming the first id that is
  // not in the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  // One more than the largest id of the vocabulary and the added tokens: the
  // number of embedding rows the tokenizer can address.
  int32_t vocab_size() const;
  // From tokenizer_config.json's bos_token / eos_token (string or AddedToken
  // object). nullopt / empty when absent or not in the vocabulary.
  absl::optional<int32_t> bos_token_id() const;
  std::vector<int32_t> eos_token_ids() const;
  // Added tokens first, then the model's vocabulary (as HF token_to_id).
  absl::optional<int32_t> TokenToId(absl::string_view token) const;
  // The token string of `id` (empty if none).
  std::string IdToToken(int32_t id) const;
  // True for added tokens marked "special".
  bool IsSpecial(int32_t id) const;
  Kind kind() const;

 private:
  friend class IncrementalDecoder;

  explicit Tokenizer(std::unique_ptr<internal::TokenizerData> data);

  // Decode with the decoder's start-of-text rules (SentencePiece leading-space
  // strip, Metaspace first-token rule) applied only if `at_start`.
  absl::StatusOr<std::string> DecodeWindow(absl::Span<const int32_t> ids, bool skip_special_tokens,
                                           bool at_start) const;
  // True if the text of `id` is not final until a later id arrives: a
  // `<0xNN>` token under a ByteFallback decoder (its byte run may continue),
  // or a special token that decoding skips (it does not end a byte run).
  bool HoldsText(int32_t id, bool skip_special_tokens) const;

  std::unique_ptr<internal::TokenizerData> data_;
};

// Streaming detokenization: turns generated ids into text deltas that never
// end inside a UTF-8 character. Uses the prefix-offset / read-offset window of
// vLLM and HF DecodeStream: decode a short window before and after the new id
// and emit the difference once it no longer ends in U+FFFD. Text that later
// ids could still change (a run of byte-fallback tokens) is held back.
//
// With empty `prompt_ids`, the deltas of Push() and Finish() concatenate to
// exactly tokenizer.Decode(all pushed ids); with a prompt they continue its
// text, i.e. Decode(prompt + output) == Decode(prompt) + deltas in ordinary
// cases (the prompt's last 5 ids give context; invalid prompt ids are ignored).
//
// Thread-compatible. `tokenizer` must outlive the decoder.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                              absl::Span<const int32_t> prompt_ids = {});

  // Appends `id`; returns the newly finished text (possibly empty).
  // kInvalidArgument (and nothing appended) if `id` is not in the vocabulary.
  absl::StatusOr<std::string> Push(int32_t id);

  // Returns whatever text is still held back (e.g. an incomplete character,
  // as U+FFFD). Further Push() calls continue after it.
  std::string Finish();

 private:
  // Decodes the window, returns the delta and advances the offsets if
  // `force` or the window's text is final.
  std::string Advance(bool force);

  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> ids_;     // The prompt's tail, then the pushed ids.
  size_t prefix_offset_ = 0;     // Window start: text before it is settled.
  size_t read_offset_ = 0;       // Text of ids_[prefix_offset_, read_offset_) is emitted.
  bool window_at_start_ = true;  // ids_[0] is the first id of the whole text.
};

}  // namespace trident::tokenizer

#endif  // TRIDENT_COMMON_TOKENIZER_TOKENIZER_H_
