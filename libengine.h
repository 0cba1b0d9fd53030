// The user-facing umbrella: one include for a program that builds a model, checkpoints it and trains it.
//
// Why a second header rather than more includes in engine/engine.h: engine.h is the engine layer's own
// umbrella, and nn/, checkpoint/ and optim/ include it (docs/ARCHITECTURE.md: each layer uses only the layers
// before it), so engine.h including them would point the arrows back up the list and make the includes
// circular. This header sits at the top of the tree, above every room it includes, and no library source
// includes it: it is for programs (examples/, downstream users), which write `#include "libengine.h"`.
#pragma once

#include "engine/engine.h"

#include "checkpoint/checkpoint.h"
#include "engine/distributed/communicator.h"
#include "nn/generation.h"
#include "nn/gpt.h"
#include "nn/init.h"
#include "nn/io/batch.h"
#include "nn/io/safetensors.h"
#include "nn/io/token_data.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "optim/clip.h"
#include "optim/module_trainer.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "planner/planner.h"
