// Defensive JSON helpers shared by the model-directory parsers: parsing that
// never throws and rejects duplicate object keys, and typed field access that
// turns every type or range mismatch into an absl::Status naming the file and
// key.

#ifndef TRIDENT_COMMON_MODEL_JSON_UTIL_H_
#define TRIDENT_COMMON_MODEL_JSON_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace trident::model::internal {

// Parses `text` as one JSON value (surrounding whitespace allowed). Returns
// kInvalidArgument naming `source` if the text is not valid JSON (including
// invalid UTF-8 in strings) or an object repeats a key.
absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, absl::string_view source);

// An integer JSON number (never a float such as 2.0) as int64; nullopt-like
// failure as false. Unsigned values above INT64_MAX fail.
bool JsonToInt64(const nlohmann::json& value, int64_t* out);

// An unsigned integer JSON number (never negative, never a float).
bool JsonToUint64(const nlohmann::json& value, uint64_t* out);

// A short, bounded rendering of `value` for error messages.
std::string JsonSnippet(const nlohmann::json& value);

}  // namespace trident::model::internal

#endif  // TRIDENT_COMMON_MODEL_JSON_UTIL_H_
