// Conversion between floating storage types, the reference for kernels/cuda/cast.cu. To bf16 it rounds to
// nearest even, through float when the source is double (double → float → bf16).
#include "kernels/cpu/cpu_kernels.h"

#include "base/bfloat16.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

// A plain stream in chunks on threads (each element its own): one thread left the working-copy refresh at a third
// of the update's speed (docs/PERF.md, "Two of item 2's fusions").
template <typename To, typename From>
void convert(To* out, const From* inp, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = narrow<To>(static_cast<Compute<To>>(widen(inp[i])));
    });
}

template void convert<bfloat16, float>(bfloat16*, const float*, int64_t);
template void convert<float, bfloat16>(float*, const bfloat16*, int64_t);
template void convert<bfloat16, double>(bfloat16*, const double*, int64_t);
template void convert<double, bfloat16>(double*, const bfloat16*, int64_t);
template void convert<float, double>(float*, const double*, int64_t);
template void convert<double, float>(double*, const float*, int64_t);

} // namespace engine::kernels::cpu
