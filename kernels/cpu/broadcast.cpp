// The broadcasting binary functions (add, sub, mul, div), the reference for kernels/cuda/broadcast.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename S>
void binary_forward(S* out, const S* a, const S* b, const BroadcastLayout& layout, BinaryFunction function) {
    using T = Compute<S>;
    parallel_for(layout.count, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            int64_t a_offset, b_offset;
            broadcast_offsets(i, layout.rank, layout.sizes, layout.strides[0], layout.strides[1], a_offset, b_offset);
            out[i] = narrow<S>(binary_value<T>(function, widen(a[a_offset]), widen(b[b_offset])));
        }
    });
}

// Each operand element sums its output elements in increasing output order (the reduced index walks the
// output row-major), the order the CUDA twin's lanes also cover, so only the association of the sum differs.
template <typename S>
void binary_backward(S* doperand, const S* dout, const S* a, const S* b, const GradientLayout& gradient,
                     BinaryFunction function) {
    using T = Compute<S>;
    const int which = gradient.which;
    const bool reads_a = binary_partial_reads_a(function, which), reads_b = binary_partial_reads_b(function, which);
    const S* self = which == 0 ? a : b;
    const S* other = which == 0 ? b : a;
    const bool reads_self = which == 0 ? reads_a : reads_b, reads_other = which == 0 ? reads_b : reads_a;
    // Operand elements are independent (each sums its own outputs in order): chunks of them on threads.
    parallel_for(gradient.kept_count, items_per_chunk(gradient.reduced_count, costly_elements_per_chunk),
                 [&](int64_t first, int64_t end) {
        for (int64_t j = first; j < end; ++j) {
            int64_t output_base, other_base;
            broadcast_offsets(j, gradient.kept_rank, gradient.kept_sizes, gradient.kept_output_strides,
                              gradient.kept_other_strides, output_base, other_base);
            const T self_value = reads_self ? widen(self[j]) : T(0);
            double total = 0.0;
            for (int64_t r = 0; r < gradient.reduced_count; ++r) {
                int64_t output_offset, other_offset;
                broadcast_offsets(r, gradient.reduced_rank, gradient.reduced_sizes, gradient.reduced_output_strides,
                                  gradient.reduced_other_strides, output_offset, other_offset);
                const T other_value = reads_other ? widen(other[other_base + other_offset]) : T(0);
                const T partial = which == 0 ? binary_partial<T>(function, 0, self_value, other_value)
                                             : binary_partial<T>(function, 1, other_value, self_value);
                total += static_cast<double>(partial * widen(dout[output_base + output_offset]));
            }
            doperand[j] = narrow<S>(widen(doperand[j]) + static_cast<T>(total));
        }
    });
}

#define ENGINE_INSTANTIATE_BINARY(S)                                                                         \
    template void binary_forward<S>(S*, const S*, const S*, const BroadcastLayout&, BinaryFunction);         \
    template void binary_backward<S>(S*, const S*, const S*, const S*, const GradientLayout&, BinaryFunction);
ENGINE_INSTANTIATE_BINARY(float)
ENGINE_INSTANTIATE_BINARY(double)
ENGINE_INSTANTIATE_BINARY(bfloat16)
#undef ENGINE_INSTANTIATE_BINARY

} // namespace engine::kernels::cpu
