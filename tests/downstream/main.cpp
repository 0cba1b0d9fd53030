// Downstream consumer: runs one op with backward through the installed library.
#include <cmath>
#include <cstdio>

#include "engine/engine.h"

int main() {
    using namespace engine;
    Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f}, {3}, Device::cpu);
    x.set_requires_grad(true);
    Tensor loss = sum(gelu(x));
    backward(loss);
    const float gradient = x.grad().to_vector<float>()[0];
    // d/dx gelu(x) at 0.5 is about 0.867
    if (std::fabs(gradient - 0.8673f) > 1e-3f) {
        std::printf("unexpected gradient %f\n", gradient);
        return 1;
    }
    std::printf("downstream ok\n");
    return 0;
}
