#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_pattern.h"
#include "common/tokenizer/tokenizer_data.h"
#include "common/tokenizer/unicode.h"

// The encoding and decoding steps over a parsed tokenizer.json: added-token
// splitting, normalizers, pre-tokenizers, BPE, decoders.

namespace trident::tokenizer::internal {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace trident::tokenizer::internal
