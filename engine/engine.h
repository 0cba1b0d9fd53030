// The umbrella header: everything a program needs to build and differentiate tensor computations.
#pragma once

#include "engine/autograd.h"
#include "engine/dtype.h"
#include "base/error.h"
#include "engine/memory.h"
#include "engine/ops.h"
#include "engine/random.h"
#include "engine/tensor.h"
