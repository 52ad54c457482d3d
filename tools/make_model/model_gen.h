// Forwarding header: the model generator is common/model/generate/model_gen.h.
// Kept only for tests/overload_test.cc; include the new header instead.

#ifndef TRIDENT_TOOLS_MAKE_MODEL_MODEL_GEN_H_
#define TRIDENT_TOOLS_MAKE_MODEL_MODEL_GEN_H_

#include "common/model/generate/model_gen.h"

namespace trident::make_model {

using ::trident::model::generate::Family;
using ::trident::model::generate::ModelSpec;
using ::trident::model::generate::PresetNames;
using ::trident::model::generate::PresetSpec;
using ::trident::model::generate::WriteModel;

}  // namespace trident::make_model

#endif  // TRIDENT_TOOLS_MAKE_MODEL_MODEL_GEN_H_
