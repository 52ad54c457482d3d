// The RoPE parameters of a model's config.json (rope_theta, llama3
// rope_scaling), in the form the RoPE kernels take. Shared by the backends.

#ifndef TRIDENT_COMMON_BACKEND_ROPE_CONFIG_H_
#define TRIDENT_COMMON_BACKEND_ROPE_CONFIG_H_

#include "common/model/config.h"
#include "kernels/cpu/rope/rope.h"

namespace trident::backend {

kernels::cpu::RopeConfig RopeConfigFor(const model::ModelConfig& config);

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_ROPE_CONFIG_H_
