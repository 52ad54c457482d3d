#include "common/frontend/model_info.h"

#include <vector>

namespace trident::frontend {
namespace {

namespace v1 = ::trident::v1;

v1::DType ToProto(numeric::DType t) {
  return t == numeric::DType::kBF16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
}

}  // namespace

v1::ModelInfoResponse ModelInfoFor(const model::ModelConfig& c,
                                   const tokenizer::Tokenizer& tokenizer,
                                   const std::string& model_dir, const std::string& model_name,
                                   int32_t max_context_tokens, int32_t kv_block_size,
                                   numeric::DType served) {
  v1::ModelInfoResponse info;
  std::string name = model_name;
  if (name.empty()) {
    std::string dir = model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    name = dir.substr(dir.find_last_of('/') + 1);
  }
  info.set_model(name);
  info.set_architecture(c.architecture);
  info.set_vocab_size(c.vocab_size);
  info.set_max_context_tokens(max_context_tokens);
  if (auto bos = tokenizer.bos_token_id(); bos.has_value()) {
    info.set_bos_token_id(*bos);
  } else if (c.bos_token_id.has_value()) {
    info.set_bos_token_id(*c.bos_token_id);
  }
  // generation_config.json / config.json say which tokens end generation;
  // the tokenizer's EOS is the fallback.
  std::vector<int32_t> eos = c.eos_token_ids;
  if (eos.empty()) eos = tokenizer.eos_token_ids();
  for (int32_t id : eos) info.add_eos_token_ids(id);
  info.set_weight_dtype(ToProto(served));
  info.set_kv_cache_dtype(ToProto(served));
  info.set_kv_block_size_tokens(kv_block_size);
  info.set_num_layers(c.num_hidden_layers);
  info.set_num_attention_heads(c.num_attention_heads);
  info.set_num_kv_heads(c.num_key_value_heads);
  info.set_head_dim(c.head_dim);
  info.set_hidden_size(c.hidden_size);
  info.set_max_logprobs_top_n(20);
  return info;
}

}  // namespace trident::frontend
