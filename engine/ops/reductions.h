// The reductions ops (declared here, defined in engine/ops/reductions*.cpp). Included by engine/ops.h.
#pragma once

#include "engine/tensor.h"

namespace engine {

} // namespace engine
