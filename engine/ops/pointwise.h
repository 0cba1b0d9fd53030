// The pointwise ops (declared here, defined in engine/ops/pointwise*.cpp). Included by engine/ops.h.
#pragma once

#include "engine/tensor.h"

namespace engine {

} // namespace engine
