#include "common/sampling/stop_checker.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace trident::sampling {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

StopChecker::StopChecker(const StopParams& params, std::vector<int32_t> eos_token_ids)
    : params_(params), eos_token_ids_(std::move(eos_token_ids)) {
  params_.stop_strings.erase(
      std::remove(params_.stop_strings.begin(), params_.stop_strings.end(), std::string()),
      params_.stop_strings.end());
}

bool StopChecker::IsStopToken(int32_t token) const {
  if (std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
      params_.stop_token_ids.end()) {
    return true;
  }
  return !params_.ignore_eos &&
         std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

StopChecker::Update StopChecker::Finished(FinishReason reason, std::string text) {
  finished_ = true;
  reason_ = reason;
  pending_.clear();
  Update update;
  update.text_to_emit = std::move(text);
  update.finished = true;
  update.reason = reason;
  return update;
}

StopChecker::Update StopChecker::OnToken(int32_t token, absl::string_view text_delta) {
  if (finished_) return Finished(reason_, "");
  ++num_tokens_;

  if (IsStopToken(token)) {
    Update update = Finished(FinishReason::kStopToken, std::move(pending_));
    update.matched_stop_token_id = token;
    return update;
  }

  // Only matches ending in the new text are possible: anything ending
  // earlier would have been found by an earlier call.
  const size_t old_size = pending_.size();
  pending_.append(text_delta.data(), text_delta.size());
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : params_.stop_strings) {
    const size_t from = old_size + 1 > stop.size() ? old_size + 1 - stop.size() : 0;
    const size_t pos = pending_.find(stop, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (end < best_end || (end == best_end && stop.size() > best->size())) {
      best_end = end;
      best = &stop;
    }
  }
  if (best != nullptr) {
    const size_t cut = params_.include_stop_string_in_output ? best_end : best_end - best->size();
    std::string matched = *best;
    Update update = Finished(FinishReason::kStopString, pending_.substr(0, cut));
    update.matched_stop = std::move(matched);
    return update;
  }

  if (params_.max_tokens > 0 && num_tokens_ >= params_.max_tokens) {
    return Finished(FinishReason::kLength, std::move(pending_));
  }

  size_t emit = pending_.size() - HeldBackLength();
  // Stop strings are valid UTF-8, so the held-back suffix starts on a
  // character boundary; back up anyway rather than ever split a character.
  while (emit > 0 && emit < pending_.size() && IsUtf8Continuation(pending_[emit])) --emit;
  Update update;
  update.text_to_emit = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return update;
}

StopChecker::Update StopChecker::Finish() {
  if (finished_) return Finished(reason_, "");
  return Finished(FinishReason::kNone, std::move(pending_));
}

size_t StopChecker::HeldBackLength() const {
  size_t longest = 0;
  const absl::string_view text = pending_;
  for (const std::string& stop : params_.stop_strings) {
    // Proper prefixes only: a whole stop string would have matched.
    const size_t max_len = std::min(stop.size() - 1, text.size());
    for (size_t len = max_len; len > longest; --len) {
      if (text.substr(text.size() - len) == absl::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace trident::sampling
