// The parameters' generator: each parameter its own Philox stream of the seed (engine/random.h draws them).
#include "nn/init.h"

#include "engine/random.h"

namespace engine::nn {

const std::shared_ptr<Generator>& default_generator() {
    thread_local const std::shared_ptr<Generator> generator = std::make_shared<Generator>(0);
    return generator;
}

void manual_seed(uint64_t seed) {
    *default_generator() = Generator(seed);
    engine::manual_seed(seed);
}

} // namespace engine::nn
