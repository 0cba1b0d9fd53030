// The layout ops (declared here, defined in engine/ops/layout*.cpp). Included by engine/ops.h.
#pragma once

#include "engine/tensor.h"

namespace engine {

} // namespace engine
