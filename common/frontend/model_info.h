// The ModelInfo the public Generation API reports for a model, read from its
// config and tokenizer alone: shared by workers and the router, which loads
// no weights.

#ifndef TRIDENT_COMMON_FRONTEND_MODEL_INFO_H_
#define TRIDENT_COMMON_FRONTEND_MODEL_INFO_H_

#include <cstdint>
#include <string>

#include "common/model/config.h"
#include "common/numeric/dtype.h"
#include "common/tokenizer/tokenizer.h"
#include "trident/v1/generation.pb.h"

namespace trident::frontend {

// The ModelInfo of `config` served with these limits: named `model_name`,
// or the last component of `model_dir` when that is empty; EOS ids from the
// config (generation_config.json), else the tokenizer's; weights and KV
// cache in `served`.
trident::v1::ModelInfoResponse ModelInfoFor(const model::ModelConfig& config,
                                            const tokenizer::Tokenizer& tokenizer,
                                            const std::string& model_dir,
                                            const std::string& model_name,
                                            int32_t max_context_tokens, int32_t kv_block_size,
                                            numeric::DType served);

}  // namespace trident::frontend

#endif  // TRIDENT_COMMON_FRONTEND_MODEL_INFO_H_
