#include "common/backend/rope_config.h"

namespace trident::backend {

kernels::cpu::RopeConfig RopeConfigFor(const model::ModelConfig& config) {
  kernels::cpu::RopeConfig rope;
  rope.head_dim = config.head_dim;
  rope.theta = config.rope_theta;
  if (config.rope_scaling.has_value() && config.rope_scaling->rope_type == "llama3") {
    rope.llama3_scaling = true;
    rope.factor = config.rope_scaling->factor;
    rope.low_freq_factor = config.rope_scaling->low_freq_factor;
    rope.high_freq_factor = config.rope_scaling->high_freq_factor;
    rope.original_max_position_embeddings = config.rope_scaling->original_max_position_embeddings;
  }
  return rope;
}

}  // namespace trident::backend
