// CPU reference kernels of the reduction ops (conventions: kernels/cpu/cpu_kernels.h). Included by cpu_kernels.h.
#pragma once

#include <cstdint>

#include "engine/bfloat16.h"

namespace engine::kernels::cpu {

} // namespace engine::kernels::cpu
