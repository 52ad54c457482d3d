// Feeds arbitrary bytes to ParseModelConfig: the input up to the first NUL is
// config.json, the rest generation_config.json. An accepted config must have
// the invariants the backends rely on.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const absl::string_view config = input.substr(0, nul);
  const absl::string_view generation =
      nul == absl::string_view::npos ? absl::string_view() : input.substr(nul + 1);
  absl::StatusOr<trident::model::ModelConfig> c =
      trident::model::ParseModelConfig(config, generation, "/fuzz");
  if (!c.ok()) {
    if (c.status().message().find("/fuzz") == absl::string_view::npos) abort();
    return 0;
  }
  if (c->hidden_size <= 0 || c->num_hidden_layers <= 0 || c->head_dim <= 0 ||
      c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads != 0 ||
      c->vocab_size <= 0 || c->intermediate_size <= 0 || c->NumParameters() <= 0) {
    abort();
  }
  for (int32_t id : c->eos_token_ids) {
    if (id < 0 || id >= c->vocab_size) abort();
  }
  return 0;
}
